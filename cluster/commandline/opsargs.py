"""The operator commands' command line: the argparse tree of `raftcron submit | jobs | schedules |
cluster | backup | audit` (`add_commands`; `queues` and the bulk flags are
cluster/commandline/flowcli.py's), the words after `--`, and the parsed flags turned into the API's
request bodies.

What it must not do: talk to the cluster or print. A flag that does not parse raises
`UsageError`; cluster/commandline/opscli.py runs the commands, cluster/commandline/opsformat.py
renders their answers.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from raftcron.cluster.commandline import flowcli, membercli, settingscli
from raftcron.cluster.commandline.cliparts import EXIT_ATTENTION, UsageError, add_common
from raftcron.cluster.commandline.cliparts import duration_ms as _duration
from raftcron.cluster.commandline.cliparts import instant_ms as _instant
from raftcron.cluster.commandline.cliparts import read_text as _read
from raftcron.cluster.http.bounds import PAGE_MAX
from raftcron.cluster.ops.doctor import Thresholds

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

    jobs = commands.add_parser(
        "jobs", help="list, export, show, cancel, retry, delete or purge jobs")
    actions = jobs.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="jobs newest first, live and archived")
    add_common(listing)
    add_search_arguments(listing)
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--cursor", type=int, help="continue from a previous page's next_cursor")
    exporting = actions.add_parser(
        "export", help="every job matching the filters of `jobs list`, as JSON Lines",
        description="Every job the filters match, newest first, one JSON job view a line "
        "(as `jobs list --json` shows it, with \"archived\" always present), page after page "
        "until the last; progress on stderr. Example: raftcron jobs export --finished-from "
        "1767225600000 --out jobs.jsonl")
    add_common(exporting, json_flag=False)  # its lines are JSON already
    add_search_arguments(exporting)
    exporting.add_argument("--format", default="jsonl", help="jsonl, the only one for now")
    exporting.add_argument("--out", metavar="FILE", help="write FILE (its lines go to "
                           "FILE.partial, renamed FILE once the last page is in) instead of "
                           "standard output")
    exporting.add_argument("--page-size", type=int, default=PAGE_MAX, metavar="N",
                           help=f"jobs a request asks for (1-{PAGE_MAX}): the most the export "
                           "holds in memory at once")
    exporting.add_argument("--cursor", type=int, help="start below this job id: the cursor an "
                           "interrupted export printed, to continue it")
    exporting.add_argument("--quiet", action="store_true", help="no progress on stderr")
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
    purge = actions.add_parser(
        "purge", help="remove finished jobs matching filters for good, from the state and "
        "from every member's archive (admin)")
    add_common(purge)
    add_search_arguments(purge, where=False)
    purge.add_argument("--dry-run", action="store_true", help="count the matching jobs only")
    purge.add_argument("--max", type=int, help="purge at most this many jobs in all")
    purge.add_argument("--yes", action="store_true", help="do not ask before purging")
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

    cluster = commands.add_parser("cluster",
                                  help="cluster status, doctor, add and remove, finalize")
    actions = cluster.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_common(actions.add_parser("status", help="members, roles, leader, indexes, changes"))
    membercli.add_arguments(actions, add_common)
    settingscli.add_finalize(actions)
    doctor = actions.add_parser(
        "doctor",
        help="what needs a person: members down, no leader, clocks, lag, disk, log, versions, "
        f"the state budget, the upgrade gate (exit {EXIT_ATTENTION} when anything does)",
    )
    defaults = Thresholds()
    doctor.add_argument("--max-lag", type=int, default=defaults.max_lag_entries,
                        help="entries a member may be behind the leader's commit index")
    doctor.add_argument("--min-free-mb", type=int, default=defaults.min_free_bytes // 1024**2,
                        help="free MiB a data dir's filesystem must keep")
    doctor.add_argument("--max-log-entries", type=int, default=defaults.max_log_entries,
                        help="log entries since the last compaction before it is a warning")
    doctor.add_argument("--max-snapshot-age-h", type=float,
                        default=defaults.max_snapshot_age_s / 3_600,
                        help="hours a member's last snapshot may age while entries come after "
                        "it before it is a warning")
    doctor.add_argument("--budget-warn-pct", type=float, default=defaults.budget_warn_pct,
                        help="percent of its budget a member's state may reach before it is a "
                        "warning (at 100 it is a problem: new jobs are refused)")
    add_common(doctor)

    backup = commands.add_parser(
        "backup", help="a consistent snapshot of the cluster's state from a live node, checked"
    )
    backup.add_argument("--out", required=True, help="the file to write (replaced only once "
                        "the whole backup arrived and checks out)")
    backup.add_argument("--with-archive", action="store_true", help="also the archive of "
                        "jobs that left the state, to FILE.archive (checked likewise); without "
                        "it a cluster restored from FILE starts with an empty archive")
    add_common(backup)

    audit = commands.add_parser(
        "audit",
        help="the audit trail of admin actions, merged from every member, newest first",
    )
    audit.add_argument("--limit", type=int, default=50, help="records to show (1-1000)")
    add_common(audit)


def add_search_arguments(parser: argparse.ArgumentParser, *, where: bool = True) -> None:
    """The filters of a job search (`jobs list`, `jobs export`, `jobs purge`):
    `search_filters` reads them. `where`: with --archived and --live."""
    parser.add_argument(
        "--status",
        choices=["blocked", "scheduled", "queued", "running", "succeeded", "failed", "cancelled"],
    )
    parser.add_argument("--queue")
    parser.add_argument("--schedule")
    parser.add_argument("--task")
    parser.add_argument("--key", help="the job's idempotency key")
    parser.add_argument("--worker", help="the worker of the job's last attempt")
    parser.add_argument("--error", help="a part of the job's error text")
    for edge in ("created-from", "created-to", "finished-from", "finished-to"):
        parser.add_argument(f"--{edge}", metavar="TIME",
                            help="ISO-8601 (2026-01-31T00:00:00Z) or Unix ms, inclusive")
    parser.add_argument(
        "--payload", action="append", default=[], metavar="PATH=VALUE",
        help="a payload field (customer.id=42, total.gte=10, name='\"42\"' for a string "
             "that looks like a number); with --created-from/--finished-from or their -to",
    )
    if where:
        either = parser.add_mutually_exclusive_group()
        either.add_argument("--archived", action="store_true",
                            help="only jobs that left the state")
        either.add_argument("--live", action="store_true", help="only jobs in the state")


def doctor_thresholds(args: argparse.Namespace) -> Thresholds:
    """`cluster doctor`'s flags as its thresholds; a flag out of range is a `UsageError`."""
    for flag, value in (("--max-lag", args.max_lag), ("--min-free-mb", args.min_free_mb),
                        ("--max-log-entries", args.max_log_entries),
                        ("--max-snapshot-age-h", args.max_snapshot_age_h),
                        ("--budget-warn-pct", args.budget_warn_pct)):
        if value < 0:
            raise UsageError(f"{flag} must be 0 or more, not {value}")
    if args.budget_warn_pct > 100:
        raise UsageError(f"--budget-warn-pct must be at most 100 (at 100 the state is full, a "
                         f"problem), not {args.budget_warn_pct:g}")
    return Thresholds(
        max_lag_entries=args.max_lag,
        min_free_bytes=args.min_free_mb * 1024**2,
        max_log_entries=args.max_log_entries,
        max_snapshot_age_s=args.max_snapshot_age_h * 3_600,
        budget_warn_pct=args.budget_warn_pct,
    )


def _add_job_fields(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--payload", help="JSON payload (for shell: merged with the argv)")
    parser.add_argument("--queue")
    parser.add_argument("--priority", type=int)
    parser.add_argument("--max-attempts", type=int)
    parser.add_argument("--timeout", help="run time limit, e.g. 10m")
    parser.add_argument("--rate", metavar="KEY=MAX/PERIOD",
                        help="keyed rate limit: at most MAX jobs of KEY start in any PERIOD, "
                        "whatever their queue, e.g. cust-42=10/1m")
    parser.add_argument("--fairness", metavar="KEY[:WEIGHT]",
                        help="take turns with other keys' jobs in the queue, WEIGHT jobs a "
                        "turn (default 1), e.g. cust-42 or cust-42:3")


# -- the command line into request bodies -------------------------------------------------


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """`raftcron submit shell -- sh -c 'echo hi'`: the words after `--` are the shell command."""
    if "--" not in argv:
        return argv, []
    index = argv.index("--")
    return argv[:index], argv[index + 1 :]


def job_fields(args: argparse.Namespace) -> dict[str, Any]:
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
    if args.rate:
        key, sep, limit = args.rate.rpartition("=")
        count, _, period = limit.partition("/")
        if not sep or not key or not count.isdigit() or not period:
            raise UsageError(f"--rate takes KEY=MAX/PERIOD, e.g. cust-42=10/1m, not {args.rate!r}")
        fields["rate"] = {"key": key, "max": int(count), "per_ms": _duration(period, "--rate")}
    if args.fairness:
        key, sep, weight = args.fairness.rpartition(":")
        if not sep:
            key, weight = args.fairness, "1"
        if not key or not weight.isdigit():
            raise UsageError(f"--fairness takes KEY[:WEIGHT], e.g. cust-42:3, not "
                             f"{args.fairness!r}")
        fields["fairness"] = {"key": key, "weight": int(weight)}
    return fields


SEARCH_FIELDS = ("status", "queue", "schedule", "task", "key", "worker", "error",
                 "created_from", "created_to", "finished_from", "finished_to")


def search_filters(args: argparse.Namespace) -> dict[str, Any]:
    """A search's flags (`add_search_arguments`) as the client's `jobs` takes them."""
    filters: dict[str, Any] = {}
    for name in SEARCH_FIELDS:
        value = getattr(args, name)
        if value is None:
            continue
        if name.endswith(("_from", "_to")):
            filters[f"{name}_ms"] = _instant(value, "--" + name.replace("_", "-"))
        else:
            filters[name] = value
    payload: dict[str, Any] = {}
    for item in args.payload:
        path, sep, raw = item.partition("=")
        if not sep or not path:
            raise UsageError(f"--payload takes PATH=VALUE, not {item!r}")
        try:
            payload[path] = json.loads(raw)
        except ValueError:
            payload[path] = raw  # plain text: a string
    if payload:
        filters["payload"] = payload
    if getattr(args, "archived", False) or getattr(args, "live", False):
        filters["archived"] = bool(args.archived)
    return filters


def schedule_body(args: argparse.Namespace) -> dict[str, Any]:
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
    body: dict[str, Any] = {**timing, "job": {"task": args.task, **job_fields(args)}}
    for name in ("tz", "misfire", "overlap"):
        if getattr(args, name):
            body[name] = getattr(args, name)
    if args.jitter:
        body["jitter_ms"] = _duration(args.jitter, "--jitter")
    if args.paused:
        body["paused"] = True
    return body


def _json_arg(text: str, flag: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:
        raise UsageError(f"{flag} is not JSON: {error}") from None


def job_ids(text: str, flag: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{flag} must be job ids separated by commas, not {text!r}") from None
