"""The operator's flow-control commands: `raftcron queues ...` and bulk `raftcron jobs
cancel|retry|delete` by filter (DESIGN.md §8.5).

`queues list|show|put|pause|resume` read and set queue limits. `jobs cancel|retry|delete` with
filters (at least one, and no job id) act on every matching job: first a dry run counts them
(parts of at most 1,000, each bounded on the cluster, following `next_cursor`), then, after a
yes (or with `--yes`), the action runs part by part until the cluster says no more.
`--dry-run` stops after the count; `--max N` acts on at most N jobs in all. Without a terminal
to ask and without `--yes`, nothing is changed (exit 2). Exit codes and output habits are opscli's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from raftcron.cluster.clients.client import Client
from raftcron.cluster.commandline.cliparts import (
    UsageError,
    add_common,
    duration_ms,
    instant_ms,
    table,
)
from raftcron.cluster.commandline.cliparts import print_answer as _print
from raftcron.scheduler import limits

STATUSES = ["blocked", "scheduled", "queued", "running", "succeeded", "failed", "cancelled"]
BULK_ACTIONS = {"cancel": "cancelled", "retry": "retried", "delete": "deleted"}
PARTS_MAX = 100_000  # requests one bulk command sends at most (20k ids each: 2e9 ids)


# -- arguments ----------------------------------------------------------------------------------


def add_queue_commands(commands: Any) -> None:
    queues = commands.add_parser("queues", help="queue limits: list, show, put, pause, resume")
    actions = queues.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_common(actions.add_parser("list", help="queues with their limits and held-back jobs"))
    for name, text in (
        ("show", "one queue"),
        ("pause", "hand out no job of the queue (leases already out carry on)"),
        ("resume", "hand out jobs again"),
    ):
        action = actions.add_parser(name, help=text)
        add_common(action)
        action.add_argument("name")
    put = actions.add_parser(
        "put",
        help="set a queue's limits (every limit not given goes back to none)",
        description="Example: raftcron queues put emails --concurrency-max 10 --rate 100/1s",
    )
    add_common(put)
    put.add_argument("name")
    put.add_argument("--paused", action="store_true")
    put.add_argument("--concurrency-max", type=int, help="running jobs of the queue, at most")
    put.add_argument("--rate", help="starts in any window as MAX/PERIOD, e.g. 100/1s or 5/200ms")
    put.add_argument("--burst", type=int, help="count --rate as a token bucket of this many "
                     "tokens (bursts allowed) rather than the exact window")


def add_bulk_arguments(parser: argparse.ArgumentParser) -> None:
    """Filters of `jobs cancel|retry|delete` (with no job id: every matching job)."""
    parser.add_argument("--status", choices=STATUSES)
    parser.add_argument("--queue")
    parser.add_argument("--task")
    parser.add_argument("--schedule")
    parser.add_argument("--created-from", help="created at or after (ISO-8601 or Unix ms)")
    parser.add_argument("--created-to", help="created before (ISO-8601 or Unix ms)")
    parser.add_argument("--dry-run", action="store_true", help="count the matching jobs only")
    parser.add_argument("--max", type=int, help="act on at most this many jobs in all")
    parser.add_argument("--yes", action="store_true", help="do not ask before acting")


FILTER_FLAGS = ("status", "queue", "task", "schedule", "created_from", "created_to", "max")


def wants_bulk(args: argparse.Namespace) -> bool:
    """Whether a jobs cancel|retry|delete names jobs by filter rather than by id."""
    return args.action == "delete" or getattr(args, "id", None) is None


def has_filters(args: argparse.Namespace) -> bool:
    return any(getattr(args, flag, None) is not None for flag in FILTER_FLAGS) or bool(
        getattr(args, "dry_run", False)
    )


# -- queues -------------------------------------------------------------------------------------


def queues(client: Client, args: argparse.Namespace) -> None:
    if args.action == "list":
        found = client.request("GET", "/v1/queues")["queues"]
        _print(args, found, lambda: _queuetable(found))
        return
    path = f"/v1/queues/{args.name}"
    if args.action == "show":
        view = client.request("GET", path)
    elif args.action == "put":
        view = client.request("PUT", path, _queue_body(args), write=True)
    else:
        view = client.request("POST", f"{path}/{args.action}", {}, write=True)
    _print(args, view, lambda: _queuetable([view]))


def _queue_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"paused": bool(args.paused), "concurrency_max": args.concurrency_max}
    if args.rate:
        count, _, period = args.rate.partition("/")
        if not count.isdigit() or not period:
            raise UsageError(f"--rate must be MAX/PERIOD, e.g. 100/1s, not {args.rate!r}")
        body["rate_limit"] = {"max": int(count), "per_ms": duration_ms(period, "--rate")}
        if args.burst is not None:
            body["rate_limit"]["burst"] = args.burst
    elif args.burst is not None:
        raise UsageError("--burst needs --rate")
    return body


def _queuetable(found: list[dict[str, Any]]) -> str:
    rows = []
    for q in found:
        rate = q.get("rate_limit")
        held = q["held"]
        rows.append([
            q["name"],
            "paused" if q["paused"] else "active",
            q["concurrency_max"] if q["concurrency_max"] is not None else "-",
            _rate_text(rate, q.get("rate_rule")) if rate else "-",
            q["queued"],
            q["running"],
            " ".join(f"{reason}={count}" for reason, count in held.items() if count) or "-",
        ])
    return table(["QUEUE", "STATE", "CONCURRENCY", "RATE", "QUEUED", "RUNNING", "HELD"], rows)


def _rate_text(rate: dict[str, Any], rule: str | None) -> str:
    """5/1000ms (the window), 5/1000ms bucket (a limit put before finalize), or
    5/1000ms burst 20."""
    text = f"{rate['max']}/{rate['per_ms']}ms"
    if rate.get("burst") is not None:
        return f"{text} burst {rate['burst']}"
    return text if rule != "bucket" else f"{text} bucket"


# -- bulk actions ---------------------------------------------------------------------------------


def bulk(client: Client, args: argparse.Namespace, *, ask: Callable[[str], str] = input) -> None:
    if args.max is not None and args.max < 1:
        raise UsageError("--max must be at least 1")
    if args.action == "cancel" and getattr(args, "reason", None):
        raise UsageError("--reason is for one job (a bulk cancel says 'cancelled in bulk')")
    where = _filter(args)
    if not where:
        raise UsageError(f"give a job id or at least one filter (--status, --queue, --task, "
                         f"--schedule, --created-from, --created-to) to {args.action} by")
    matched = _run(client, args.action, where, args.max, dry_run=True)["matched"]
    described = f"{matched} job{'s' if matched != 1 else ''}"
    if args.dry_run or matched == 0:
        answer = {"action": args.action, "filter": where, "matched": matched, "changed": 0,
                  "dry_run": True}
        _print(args, answer, lambda: f"{described} match; nothing changed\n")
        return
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError(f"{described} match; add --yes to {args.action} them (no terminal "
                             "to ask)")
        if ask(f"{args.action} {described}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing changed")
            return
    totals = _run(client, args.action, where, args.max, dry_run=False)
    answer = {"action": args.action, "filter": where, **totals, "dry_run": False}
    _print(args, answer, lambda: (
        f"{BULK_ACTIONS[args.action]} {totals['changed']} of {totals['matched']} matching jobs\n"
    ))


def purge(client: Client, args: argparse.Namespace, where: dict[str, Any], *,
          ask: Callable[[str], str] = input) -> None:
    """`jobs purge`: finished jobs matching a search's filters (`where`, as POST /v1/jobs/bulk
    takes them) removed for good, live or archived, after a count and a confirmation."""
    if args.max is not None and args.max < 1:
        raise UsageError("--max must be at least 1")
    if not where:
        raise UsageError("give at least one filter (--task, --key, --payload PATH=VALUE, ...) "
                         "to purge by")
    matched = _run(client, "purge", where, args.max, dry_run=True)["matched"]
    described = f"{matched} finished job{'s' if matched != 1 else ''}"
    if args.dry_run or matched == 0:
        answer = {"action": "purge", "filter": where, "matched": matched, "changed": 0,
                  "dry_run": True}
        _print(args, answer, lambda: f"{described} match; nothing changed\n")
        return
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError(f"{described} match; add --yes to purge them (no terminal to ask)")
        if ask(f"purge {described} for good, from every archive too? [y/N] "
               ).strip().lower() not in ("y", "yes"):
            print("nothing changed")
            return
    totals = _run(client, "purge", where, args.max, dry_run=False)
    answer = {"action": "purge", "filter": where, **totals, "dry_run": False}
    _print(args, answer, lambda: (
        f"purged {totals['changed']} of {totals['matched']} matching finished jobs (their data "
        "stays in log segments and snapshots until they are compacted away)\n"))


def _filter(args: argparse.Namespace) -> dict[str, Any]:
    where: dict[str, Any] = {
        name: getattr(args, name) for name in ("status", "queue", "task", "schedule")
        if getattr(args, name) is not None
    }
    if args.created_from:
        where["created_from_ms"] = instant_ms(args.created_from, "--created-from")
    if args.created_to:
        where["created_to_ms"] = instant_ms(args.created_to, "--created-to")
    return where


def _run(
    client: Client, action: str, where: dict[str, Any], max_jobs: int | None, *, dry_run: bool
) -> dict[str, int]:
    """Send the parts of a bulk action (or its dry run) until the cluster says no more, or
    max_jobs are reached; the totals."""
    matched = changed = 0
    cursor = 0
    for _ in range(PARTS_MAX):
        left = limits.BULK_MAX if max_jobs is None else min(limits.BULK_MAX, max_jobs - matched)
        body = {"action": action, "filter": where, "max": left, "cursor": cursor,
                "dry_run": dry_run}
        part = client.request("POST", "/v1/jobs/bulk", body, write=True)
        matched += part["matched"]
        changed += part["changed"]
        cursor = part["next_cursor"]
        if not part["more"] or (max_jobs is not None and matched >= max_jobs):
            break
    return {"matched": matched, "changed": changed}
