"""The operator commands' tables for people: jobs, a job's attempts, schedules and their recent
fires, and instants as UTC text. (`--json` prints the API's answers as they are.)

What it must not do: talk to the cluster, read the command line or print: each function takes
(part of) an API answer and gives back text, which cluster/commandline/opscli.py prints.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from raftcron.cluster.commandline.cliparts import table


def utc_time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def job_table(jobs: list[dict[str, Any]]) -> str:
    return table(
        ["ID", "STATUS", "TASK", "QUEUE", "ATTEMPTS", "RUN AT (UTC)", "KEY"],
        [
            [
                j["id"],
                j.get("status", "?") + (" (archived)" if j.get("archived") else ""),
                j.get("task", ""),
                j.get("queue", ""),
                f"{j.get('attempts', 0)}/{j.get('max_attempts', '?')}",
                utc_time(j.get("run_at_ms")),
                j.get("key") or "",
            ]
            for j in jobs
        ],
    )


def progress_text(progress: dict[str, Any]) -> str:
    """`40% (400/1000) "rows" at 2026-... UTC (attempt 1)` for a job's progress."""
    value = progress["value"]
    if isinstance(value, dict):
        share = value["done"] / value["total"]
        text = f"{share:.0%} ({value['done']}/{value['total']})"
    else:
        text = f"{value:.0%}"
    if progress.get("message"):
        text += f" {json.dumps(progress['message'], ensure_ascii=False)}"
    return text + f" at {utc_time(progress.get('at_ms'))} UTC (attempt {progress.get('attempt')})"


def job_detail(job: dict[str, Any]) -> str:
    lines = []
    for name, fields in (("concurrency", ("key", "max")), ("rate", ("key", "max", "per_ms")),
                         ("fairness", ("key", "weight"))):
        given = job.get(name)
        if given:
            lines.append(f"{name}: " + " ".join(f"{f}={given[f]}" for f in fields))
    progress = job.get("progress")
    if progress:
        lines.append(f"progress: {progress_text(progress)}")
        if progress.get("data") is not None:
            lines.append(f"progress data: {json.dumps(progress['data'])[:2000]}")
    if job.get("error"):
        lines.append(f"error: {job['error']}")
    if job.get("result") is not None:
        lines.append(f"result: {json.dumps(job['result'])[:2000]}")
    history = job.get("history") or []
    if history:
        lines.append(
            table(
                ["ATTEMPT", "WORKER", "NODE", "TOKEN", "START (UTC)", "END (UTC)", "OUTCOME"],
                [
                    [
                        a["attempt"],
                        a["worker"],
                        a.get("node") or "",
                        a["token"],
                        utc_time(a["start_ms"]),
                        utc_time(a.get("end_ms")),
                        a["outcome"],
                    ]
                    for a in history
                ],
            ).rstrip()
        )
    return ("\n" + "\n".join(lines) + "\n") if lines else ""


def schedule_table(schedules: list[dict[str, Any]]) -> str:
    rows = []
    for s in schedules:
        spec = s["spec"]
        timing = next(f"{k} {spec[k]}" for k in ("cron", "every", "at") if k in spec)
        rows.append(
            [
                s["name"],
                timing,
                spec.get("tz", "UTC"),
                "paused" if s["paused"] else "active",
                s.get("next_fire_local") or "-",
                s["fires"],
                s["misfires"],
                s["misfire_skipped"] + s["overlap_skipped"],
            ]
        )
    return table(
        ["NAME", "WHEN", "TZ", "STATE", "NEXT FIRE", "FIRES", "MISFIRES", "SKIPPED"], rows
    )


def recent_fires(schedule: dict[str, Any]) -> str:
    fires = schedule.get("recent_fires") or []
    if not fires:
        return ""
    return "\n" + table(
        ["RECENT FIRE (UTC)", "JOB"],
        [[utc_time(f["fire_time_ms"]), f["job_id"]] for f in fires],
    )
