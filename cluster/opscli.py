"""The operator's commands: `raftcron submit | jobs | schedules | queues | cluster | audit |
backup` (queues and bulk job actions: cluster/flowcli.py).

Tables for people, `--json` for scripts. Exit codes: 0 done, 1 the cluster refused the request
(4xx: the message says why), 2 the command line is wrong, 3 the cluster could not be reached
or had no leader in time (or a member did not answer for `audit`), 4 `cluster doctor` found
something that needs a person. Errors are one line on stderr. Every flag that a shell session sets
once has an environment fallback: `--connect` (RAFTCRON_CONNECT), `--api-token`
(RAFTCRON_API_TOKEN).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from raftcron.cluster import backup as backup_module
from raftcron.cluster import membercli
from raftcron.cluster.client import ApiError, Client, Unavailable
from raftcron.cluster.cliparts import UsageError, add_common
from raftcron.cluster.cliparts import duration_ms as _duration
from raftcron.cluster.cliparts import instant_ms as _instant
from raftcron.cluster.cliparts import print_answer as _print
from raftcron.cluster.cliparts import read_text as _read
from raftcron.cluster.cliparts import table as _table
from raftcron.cluster.doctor import Thresholds, diagnose
from raftcron.cluster.doctor import rows as doctor_rows
from raftcron.cluster.storage.disk import OsDisk
from raftcron.cluster.storage.raftlog import StorageError
from raftcron.scheduler import limits

EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_ATTENTION = 1, 2, 3, 4




class NeedsAttention(Exception):
    """`cluster doctor` found something (it printed what)."""


class Incomplete(Exception):
    """What was printed lacks some member's part (it did not answer)."""


# -- arguments ----------------------------------------------------------------------------




def add_commands(commands: Any) -> None:
    submit = commands.add_parser(
        "submit",
        help="submit a job",
        description="Submit one job. For the "
        "built-in shell task: raftcron submit shell -- sh -c 'echo hi'",
    )
    add_common(submit)
    submit.add_argument("task", help="task name (the worker's handler), e.g. shell")
    _add_job_fields(submit)
    submit.add_argument(
        "--key", help="idempotency key: a second submit with it returns the first job"
    )
    submit.add_argument("--delay", help="run after this long, e.g. 30s, 5m")
    submit.add_argument("--run-at", help="run at this time (ISO-8601 or Unix ms)")
    submit.add_argument("--depends-on", help="job ids this job waits for, comma-separated")
    submit.add_argument(
        "--wait", action="store_true", help="wait until the job finishes and print it"
    )

    jobs = commands.add_parser("jobs", help="list, show, cancel or retry jobs")
    actions = jobs.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="jobs newest first")
    add_common(listing)
    listing.add_argument(
        "--status",
        choices=["blocked", "scheduled", "queued", "running", "succeeded", "failed", "cancelled"],
    )
    listing.add_argument("--queue")
    listing.add_argument("--schedule")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--cursor", type=int, help="continue from a previous page's next_cursor")
    from raftcron.cluster import flowcli  # it imports this module's helpers

    for name, text in (
        ("show", "one job with its attempts"),
        ("cancel", "cancel a job (and its descendants), or every job matching filters"),
        ("retry", "retry a failed or cancelled job, or every job matching filters"),
        ("delete", "delete every job matching filters (not running ones; unfinished ones are "
                   "cancelled first)"),
    ):
        action = actions.add_parser(name, help=text)
        add_common(action)
        if name != "delete":
            action.add_argument("id", type=int, nargs=None if name == "show" else "?")
        if name == "cancel":
            action.add_argument("--reason")
        if name != "show":
            flowcli.add_bulk_arguments(action)
    flowcli.add_queue_commands(commands)

    schedules = commands.add_parser("schedules", help="create, list and control schedules")
    actions = schedules.add_subparsers(dest="action", required=True, metavar="ACTION")
    put = actions.add_parser(
        "put",
        help="create or replace a schedule",
        description="Example: raftcron schedules put nightly --cron '0 2 * * *' "
        "--tz Europe/Paris --task shell -- /usr/local/bin/report",
    )
    add_common(put)
    put.add_argument("name")
    put.add_argument("--task", help="task of each fired job, e.g. shell (omit with --file)")
    timing = put.add_mutually_exclusive_group()
    timing.add_argument("--cron", help="5 fields, 6 with seconds first, or @hourly, @daily...")
    timing.add_argument("--every", help="interval, e.g. 30s, 5m, 1h")
    timing.add_argument("--at", help="once, at this time (ISO-8601)")
    put.add_argument("--tz", help="IANA time zone of the cron fields (default UTC)")
    put.add_argument("--misfire", choices=["fire_once", "fire_all", "skip"])
    put.add_argument("--overlap", choices=["allow", "forbid", "replace", "buffer_one"])
    put.add_argument("--jitter", help="spread runs by up to this long, e.g. 30s")
    put.add_argument("--paused", action="store_true")
    put.add_argument("--file", help="the whole schedule as a JSON file (the PUT body); - for stdin")
    _add_job_fields(put)
    listing = actions.add_parser("list", help="every schedule with its next fire time")
    add_common(listing)
    for name, text in (
        ("show", "one schedule"),
        ("pause", "stop firing"),
        ("resume", "fire again (no catch-up of the paused time)"),
        ("trigger", "fire now"),
        ("delete", "delete the schedule (its jobs stay)"),
        ("preview", "the next fire times, with DST notes"),
        ("backfill", "one job per missed fire time in a range"),
    ):
        action = actions.add_parser(name, help=text)
        add_common(action)
        action.add_argument("name")
        if name == "trigger":
            action.add_argument("--force", action="store_true", help="ignore the overlap policy")
        if name == "preview":
            action.add_argument("--count", type=int, default=10)
        if name == "backfill":
            action.add_argument(
                "--from", dest="from_time", required=True, help="ISO-8601 or Unix ms"
            )
            action.add_argument(
                "--to", dest="to_time", required=True, help="ISO-8601 or Unix ms (excluded)"
            )

    cluster = commands.add_parser("cluster", help="cluster status, doctor, add and remove")
    actions = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_common(actions.add_parser("status", help="members, roles, leader, indexes, changes"))
    membercli.add_arguments(actions, add_common)
    doctor = actions.add_parser(
        "doctor",
        help="what needs a person: members down, no leader, clocks, lag, disk, log, versions "
        f"(exit {EXIT_ATTENTION} when anything does)",
    )
    defaults = Thresholds()
    doctor.add_argument("--max-lag", type=int, default=defaults.max_lag_entries,
                        help="entries a member may be behind the leader's commit index")
    doctor.add_argument("--min-free-mb", type=int, default=defaults.min_free_bytes // 1024**2,
                        help="free MiB a data dir's filesystem must keep")
    doctor.add_argument("--max-log-entries", type=int, default=defaults.max_log_entries,
                        help="log entries since the last compaction before it is a warning")
    add_common(doctor)

    backup = commands.add_parser(
        "backup", help="a consistent snapshot of the cluster's state from a live node, checked"
    )
    backup.add_argument("--out", required=True, help="the file to write (replaced only once "
                        "the whole backup arrived and checks out)")
    add_common(backup)

    audit = commands.add_parser(
        "audit",
        help="the audit trail of admin actions, merged from every member, newest first",
    )
    audit.add_argument("--limit", type=int, default=50, help="records to show (1-1000)")
    add_common(audit)


def _add_job_fields(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--payload", help="JSON payload (for shell: merged with the argv)")
    parser.add_argument("--queue")
    parser.add_argument("--priority", type=int)
    parser.add_argument("--max-attempts", type=int)
    parser.add_argument("--timeout", help="run time limit, e.g. 10m")


# -- running ----------------------------------------------------------------------------------


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """`raftcron submit shell -- sh -c 'echo hi'`: the words after `--` are the shell command."""
    if "--" not in argv:
        return argv, []
    index = argv.index("--")
    return argv[:index], argv[index + 1 :]


def run(
    args: argparse.Namespace, handler: Callable[[Client, argparse.Namespace], Any] | None = None
) -> int:
    """Run a command's `handler` (default: this module's for args.command) with a client."""
    from raftcron.cluster import flowcli

    handler = handler or {
        "submit": _submit,
        "jobs": _jobs,
        "schedules": _schedules,
        "cluster": _cluster,
        "audit": _audit,
        "backup": _backup,
        "queues": flowcli.queues,
    }[args.command]
    try:
        retry_s_max = limits.REQUEST_RETRY_MS / 1000
        if not 0 < args.deadline <= retry_s_max:
            # A retry after the cluster forgot the request id would be applied twice.
            raise UsageError(f"--deadline must be more than 0 and at most {retry_s_max:g} s "
                             "(how long the cluster remembers a request id), "
                             f"not {args.deadline:g}")
        options = {"retry_deadline_s": args.deadline, "request_timeout_s": min(10.0, args.deadline),
                   "ca_file": args.ca_file, "cert_file": args.cert_file, "key_file": args.key_file}
        try:
            client = Client(args.connect, token=args.api_token, **options)
        except ValueError as error:  # a TLS file that does not load
            raise UsageError(str(error)) from None
        with client:
            handler(client, args)
    except UsageError as error:
        print(f"raftcron {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except ApiError as error:
        print(f"raftcron {args.command}: {error.code}: {error.message}", file=sys.stderr)
        return EXIT_REFUSED
    except Unavailable as error:
        print(f"raftcron {args.command}: cluster unavailable: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except StorageError as error:  # a backup that does not check out
        print(f"raftcron {args.command}: {error}", file=sys.stderr)
        return EXIT_REFUSED
    except NeedsAttention:
        return EXIT_ATTENTION
    except Incomplete as error:
        print(f"raftcron {args.command}: {error}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return 0


def _job_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    payload = _json_arg(args.payload, "--payload") if args.payload else None
    if getattr(args, "argv", None):
        if args.task != "shell":
            raise UsageError("a command after the task is only for the shell task")
        payload = {**(payload or {}), "argv": list(args.argv)}
    if payload is not None:
        fields["payload"] = payload
    for name in ("queue", "priority", "max_attempts"):
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    if args.timeout:
        fields["timeout_ms"] = _duration(args.timeout, "--timeout")
    return fields


def _submit(client: Client, args: argparse.Namespace) -> None:
    fields = _job_fields(args)
    if args.key:
        fields["key"] = args.key
    if args.delay:
        fields["delay_ms"] = _duration(args.delay, "--delay")
    if args.run_at:
        fields["run_at_ms"] = _instant(args.run_at, "--run-at")
    if args.depends_on:
        fields["depends_on"] = _ids(args.depends_on, "--depends-on")
    payload = fields.pop("payload", None)
    job = client.submit(args.task, payload, **fields)
    if args.wait:
        job = client.wait(job["id"])
    _print(args, job, lambda: _job_table([job]) + (_job_detail(job) if args.wait else ""))


def _jobs(client: Client, args: argparse.Namespace) -> None:
    from raftcron.cluster import flowcli

    if args.action in ("cancel", "retry", "delete") and flowcli.wants_bulk(args):
        flowcli.bulk(client, args)
        return
    if args.action in ("cancel", "retry") and flowcli.has_filters(args):
        raise UsageError("give a job id or filters, not both")
    if args.action == "list":
        filters = {k: getattr(args, k) for k in ("status", "queue", "schedule", "limit", "cursor")}
        page = client.jobs(**{k: v for k, v in filters.items() if v is not None})
        more = f"\nnext page: --cursor {page['next_cursor']}\n" if page.get("next_cursor") else ""
        _print(args, page, lambda: _job_table(page["jobs"]) + more)
    elif args.action == "show":
        job = client.job(args.id)
        _print(args, job, lambda: _job_table([job]) + _job_detail(job))
    elif args.action == "cancel":
        answer = client.cancel(args.id, args.reason)
        _print(
            args,
            answer,
            lambda: (
                f"job {args.id} cancelled "
                f"({answer.get('cancelled_descendants', 0)} descendants cancelled too)\n"
            ),
        )
    else:
        answer = client.retry(args.id)
        _print(args, answer, lambda: f"job {args.id} is {answer.get('status')} again\n")


def _schedules(client: Client, args: argparse.Namespace) -> None:
    action = args.action
    if action == "put":
        schedule = client.put_schedule(args.name, _schedule_body(args))
        _print(args, schedule, lambda: _schedule_table([schedule]))
    elif action == "list":
        schedules = client.schedules()
        _print(args, schedules, lambda: _schedule_table(schedules))
    elif action == "show":
        schedule = client.schedule(args.name)
        _print(args, schedule, lambda: _schedule_table([schedule]) + _recent_fires(schedule))
    elif action in ("pause", "resume", "delete"):
        answer = {
            "pause": client.pause_schedule,
            "resume": client.resume_schedule,
            "delete": client.delete_schedule,
        }[action](args.name)
        _print(args, answer, lambda: f"schedule {args.name}: {action}d\n".replace("ed\n", "d\n"))
    elif action == "trigger":
        answer = client.trigger_schedule(args.name, force=args.force)
        job = answer.get("job")
        _print(
            args,
            answer,
            lambda: _job_table([job]) if job else f"schedule {args.name}: fire buffered\n",
        )
    elif action == "preview":
        fires = client.preview_schedule(args.name, count=args.count)
        _print(
            args,
            fires,
            lambda: _table(
                ["FIRE (UTC)", "LOCAL", "NOTE"],
                [[_time(f["fire_time_ms"]), f["local"], f.get("note") or ""] for f in fires],
            ),
        )
    else:
        jobs = client.backfill_schedule(
            args.name, _instant(args.from_time, "--from"), _instant(args.to_time, "--to")
        )
        _print(args, jobs, lambda: _job_table(jobs))


def _schedule_body(args: argparse.Namespace) -> dict[str, Any]:
    if args.file:
        text = sys.stdin.read() if args.file == "-" else _read(args.file)
        loaded = _json_arg(text, "--file")
        if not isinstance(loaded, dict):
            raise UsageError("--file must hold a JSON object (the schedule)")
        return dict(loaded)
    timing = {k: getattr(args, k) for k in ("cron", "every", "at") if getattr(args, k)}
    if not timing:
        raise UsageError("give --cron, --every or --at (or the whole schedule with --file)")
    if not args.task:
        raise UsageError("give the task each fire runs (e.g. shell -- your command)")
    body: dict[str, Any] = {**timing, "job": {"task": args.task, **_job_fields(args)}}
    for name in ("tz", "misfire", "overlap"):
        if getattr(args, name):
            body[name] = getattr(args, name)
    if args.jitter:
        body["jitter_ms"] = _duration(args.jitter, "--jitter")
    if args.paused:
        body["paused"] = True
    return body


def _cluster(client: Client, args: argparse.Namespace) -> None:
    if args.action == "doctor":
        _doctor(client, args)
        return
    if args.action in ("add", "remove"):
        membercli.run(client, args, lambda data, text: _print(args, data, lambda: text))
        return
    view = client.cluster()
    views, _ = _ask_each_member(client, view["members"], "/v1/cluster")
    rows = []
    for member in sorted(view["members"], key=lambda m: m["node_id"]):
        own = views[member["node_id"]]
        state = member.get("state", "voter")
        if own is None:
            rows.append([member["node_id"], member["http_address"], "unreachable", "-", "-",
                         "-", state])
            continue
        member["view"] = own
        rows.append(
            [
                member["node_id"],
                member["http_address"],
                own["role"],
                own["term"],
                own["commit_index"],
                own["applied_index"],
                state,
            ]
        )
    leader = view["leader"] or "none"
    _print(
        args,
        view,
        lambda: (
            f"leader {leader}, term {view['term']}\n"
            + _table(["NODE", "HTTP", "ROLE", "TERM", "COMMIT", "APPLIED", "STATE"], rows)
            + membercli.status_lines(view)
        ),
    )


def _ask_each_member(
    client: Client, members: list[dict[str, Any]], path: str,
    params: dict[str, Any] | None = None, *, timeout_s: float = 2.0,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each member's own answer to GET `path` (asked at its http_address by the scheme and TLS
    settings of --connect), by node id (None: it did not answer), and why the silent ones
    were. A token refused on one node is refused on all: that one is raised."""
    answers: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for member in sorted(members, key=lambda m: m["node_id"]):
        node = member["node_id"]
        try:
            answers[node] = client.ask_member(member["http_address"], path, params=params,
                                              timeout_s=timeout_s)
        except ApiError as error:
            if error.status in (401, 403):
                raise
            answers[node], errors[node] = None, f"{error.status} {error.code}"
        except Unavailable as error:
            answers[node], errors[node] = None, f"no answer: {str(error)[:200]}"
    return answers, errors


def _doctor(client: Client, args: argparse.Namespace) -> None:
    for flag, value in (("--max-lag", args.max_lag), ("--min-free-mb", args.min_free_mb),
                        ("--max-log-entries", args.max_log_entries)):
        if value < 0:
            raise UsageError(f"{flag} must be 0 or more, not {value}")
    thresholds = Thresholds(args.max_lag, args.min_free_mb * 1024**2, args.max_log_entries)
    views, errors = _ask_each_member(client, client.cluster()["members"], "/v1/cluster")
    findings = diagnose(views, thresholds, errors)
    headers = ["NODE", "ROLE", "TERM", "LAG", "CLOCK", "FREE", "LOG", "SNAPSHOT", "VERSION"]

    def report() -> str:
        lines = [f"{f.severity}: {f.node}: {f.check}: {f.detail}" for f in findings]
        return _table(headers, doctor_rows(views)) + "\n" + (
            "\n".join(lines) + "\n" if lines else "nothing needs attention\n")

    _print(args, {"members": views, "findings": [f.to_dict() for f in findings]}, report)
    if findings:
        raise NeedsAttention(f"{len(findings)} finding(s)")


def _backup(client: Client, args: argparse.Namespace) -> None:
    out = os.path.abspath(args.out)
    partial = out + ".partial"
    try:
        served = client.download_backup(partial)
        with open(partial, "rb") as downloaded:
            data = downloaded.read()
        _, info = backup_module.check(data, partial)
        os.replace(partial, out)
        OsDisk().sync_dir(os.path.dirname(out))  # the rename itself survives a power loss
    except OSError as error:
        raise UsageError(f"cannot write {args.out}: {error}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
    details = {"file": out, "node": served["node"], **dataclasses.asdict(info)}
    _print(args, details, lambda: (
        f"backup of {served['node']} at log index {info.index} (term {info.term}): "
        f"{info.jobs} jobs, {info.schedules} schedules, {info.size_bytes} bytes, "
        f"digest {info.digest[:16]} -> {out}\n"))


def _audit(client: Client, args: argparse.Namespace) -> None:
    """Each node keeps the trail of what it was asked (cluster/http/trail.py says why): the
    whole trail is the union, merged here newest first."""
    if not 1 <= args.limit <= 1_000:
        raise UsageError(f"--limit must be between 1 and 1000, not {args.limit}")
    trails, errors = _ask_each_member(
        client, client.cluster()["members"], "/v1/audit", {"limit": args.limit}, timeout_s=5
    )
    entries = [e for trail in trails.values() if trail is not None for e in trail["entries"]]
    silent = [f"{node} ({why})" for node, why in sorted(errors.items())]
    entries.sort(key=lambda e: (e["time_ms"], e["node"], e["seq"]), reverse=True)
    entries = entries[: args.limit]
    rows = [
        [_time(e["time_ms"]), e["node"], e["name"] or "-", e["role"] or "-", e["method"],
         e["path"], e["status"]]
        for e in entries
    ]
    _print(
        args,
        {"entries": entries, "missing": silent},
        lambda: _table(["TIME", "NODE", "TOKEN", "ROLE", "METHOD", "PATH", "STATUS"], rows),
    )
    if silent:
        raise Incomplete(f"the trail lacks the records of {', '.join(silent)}")


# -- formatting -------------------------------------------------------------------------------




def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _job_table(jobs: list[dict[str, Any]]) -> str:
    return _table(
        ["ID", "STATUS", "TASK", "QUEUE", "ATTEMPTS", "RUN AT (UTC)", "KEY"],
        [
            [
                j["id"],
                j.get("status", "?"),
                j.get("task", ""),
                j.get("queue", ""),
                f"{j.get('attempts', 0)}/{j.get('max_attempts', '?')}",
                _time(j.get("run_at_ms")),
                j.get("key") or "",
            ]
            for j in jobs
        ],
    )


def _job_detail(job: dict[str, Any]) -> str:
    lines = []
    if job.get("error"):
        lines.append(f"error: {job['error']}")
    if job.get("result") is not None:
        lines.append(f"result: {json.dumps(job['result'])[:2000]}")
    history = job.get("history") or []
    if history:
        lines.append(
            _table(
                ["ATTEMPT", "WORKER", "NODE", "TOKEN", "START (UTC)", "END (UTC)", "OUTCOME"],
                [
                    [
                        a["attempt"],
                        a["worker"],
                        a.get("node") or "",
                        a["token"],
                        _time(a["start_ms"]),
                        _time(a.get("end_ms")),
                        a["outcome"],
                    ]
                    for a in history
                ],
            ).rstrip()
        )
    return ("\n" + "\n".join(lines) + "\n") if lines else ""


def _schedule_table(schedules: list[dict[str, Any]]) -> str:
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
    return _table(
        ["NAME", "WHEN", "TZ", "STATE", "NEXT FIRE", "FIRES", "MISFIRES", "SKIPPED"], rows
    )


def _recent_fires(schedule: dict[str, Any]) -> str:
    fires = schedule.get("recent_fires") or []
    if not fires:
        return ""
    return "\n" + _table(
        ["RECENT FIRE (UTC)", "JOB"], [[_time(f["fire_time_ms"]), f["job_id"]] for f in fires]
    )


# -- parsing ----------------------------------------------------------------------------------


def _json_arg(text: str, flag: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        raise UsageError(f"{flag} is not JSON: {error}") from None




def _ids(text: str, flag: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{flag} must be job ids separated by commas, not {text!r}") from None
