"""The operator's commands: `raftcron submit | jobs | schedules | queues | cluster | audit |
backup` run against the cluster (queues and bulk job actions: cluster/commandline/flowcli.py; `jobs
export`: cluster/commandline/exportcli.py; their command line: cluster/commandline/opsargs.py; their
tables: cluster/commandline/opsformat.py).

Tables for people, `--json` for scripts. Exit codes: 0 done, 1 the cluster refused the request
(4xx: the message says why), 2 the command line is wrong, 3 the cluster could not be reached
or had no leader in time (or a member did not answer for `audit`), 4 `cluster doctor` found
something that needs a person, 130 interrupted (Ctrl-C). Errors are one line on stderr. Every
flag that a shell session sets once has an environment fallback: `--connect`
(RAFTCRON_CONNECT), `--api-token` (RAFTCRON_API_TOKEN).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

from raftcron.cluster.clients.client import ApiError, Client, Unavailable
from raftcron.cluster.commandline import membercli, settingscli
from raftcron.cluster.commandline.cliparts import (
    EXIT_ATTENTION,
    EXIT_INTERRUPTED,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    UsageError,
)
from raftcron.cluster.commandline.cliparts import duration_ms as _duration
from raftcron.cluster.commandline.cliparts import instant_ms as _instant
from raftcron.cluster.commandline.cliparts import print_answer as _print
from raftcron.cluster.commandline.cliparts import table as _table
from raftcron.cluster.commandline.opsargs import doctor_thresholds as _doctor_thresholds
from raftcron.cluster.commandline.opsargs import job_fields as _job_fields
from raftcron.cluster.commandline.opsargs import job_ids as _ids
from raftcron.cluster.commandline.opsargs import schedule_body as _schedule_body
from raftcron.cluster.commandline.opsargs import search_filters as _search_filters
from raftcron.cluster.commandline.opsformat import job_detail as _job_detail
from raftcron.cluster.commandline.opsformat import job_table as _job_table
from raftcron.cluster.commandline.opsformat import recent_fires as _recent_fires
from raftcron.cluster.commandline.opsformat import schedule_table as _schedule_table
from raftcron.cluster.commandline.opsformat import utc_time as _time
from raftcron.cluster.ops import backup as backup_module
from raftcron.cluster.ops.doctor import diagnose
from raftcron.cluster.ops.doctor import rows as doctor_rows
from raftcron.cluster.storage.disk import OsDisk
from raftcron.cluster.storage.raftlog import StorageError
from raftcron.scheduler import limits


class NeedsAttention(Exception):
    """`cluster doctor` found something (it printed what)."""


class Incomplete(Exception):
    """What was printed lacks some member's part (it did not answer)."""


# -- running ----------------------------------------------------------------------------------


def run(
    args: argparse.Namespace, handler: Callable[[Client, argparse.Namespace], Any] | None = None
) -> int:
    """Run a command's `handler` (default: this module's for args.command) with a client."""
    from raftcron.cluster.commandline import flowcli

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
                   "ca_file": args.ca_file, "cert_file": args.cert_file, "key_file": args.key_file,
                   # each command is a new client: a read must see the command before it
                   "consistent_reads": True}
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
    except KeyboardInterrupt:
        print(f"raftcron {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


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
    from raftcron.cluster.commandline import exportcli, flowcli

    if args.action in ("cancel", "retry", "delete") and flowcli.wants_bulk(args):
        flowcli.bulk(client, args)
        return
    if args.action == "purge":
        flowcli.purge(client, args, _search_filters(args))
        return
    if args.action in ("cancel", "retry") and flowcli.has_filters(args):
        raise UsageError("give a job id or filters, not both")
    if args.action == "list":
        page = client.jobs(**_search_filters(args), limit=args.limit, cursor=args.cursor)
        more = f"\nnext page: --cursor {page['next_cursor']}\n" if page.get("next_cursor") else ""
        _print(args, page, lambda: _job_table(page["jobs"]) + more)
    elif args.action == "export":
        exportcli.run(client, args)
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


def _cluster(client: Client, args: argparse.Namespace) -> None:
    if args.action == "doctor":
        _doctor(client, args)
        return
    if args.action in ("add", "remove"):
        membercli.run(client, args, lambda data, text: _print(args, data, lambda: text))
        return
    if args.action == "finalize":
        settingscli.finalize(client, args)
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
    thresholds = _doctor_thresholds(args)
    views, errors = _ask_each_member(client, client.cluster()["members"], "/v1/cluster")
    findings = diagnose(views, thresholds, errors)
    headers = ["NODE", "ROLE", "TERM", "LAG", "CLOCK", "FREE", "LOG", "SNAPSHOT",
               "ARCHIVE (ROWS / DISK / OLDEST)", "VERSION"]

    def report() -> str:
        lines = [f"{f.severity}: {f.node}: {f.check}: {f.detail}" for f in findings]
        return _table(headers, doctor_rows(views)) + "\n" + (
            "\n".join(lines) + "\n" if lines else "nothing needs attention\n")

    _print(args, {"members": views, "findings": [f.to_dict() for f in findings]}, report)
    if findings:
        raise NeedsAttention(f"{len(findings)} finding(s)")


def _backup(client: Client, args: argparse.Namespace) -> None:
    """The snapshot first, then (`--with-archive`) the archive covering every eviction it
    does, to FILE.archive; each arrives under a temporary name, is checked, then renamed (the
    archive first: FILE is replaced only once its archive is in place)."""
    out = os.path.abspath(args.out)
    archive_out = out + backup_module.ARCHIVE_SUFFIX
    partial, archive_partial = out + ".partial", archive_out + ".partial"
    archived, stale = None, False
    try:
        served = client.download_backup(partial)
        with open(partial, "rb") as downloaded:
            data = downloaded.read()
        _, info = backup_module.check(data, partial)
        if args.with_archive:
            archived = backup_module.fetch_archive(client, archive_partial, info, served)
            os.replace(archive_partial, archive_out)
        os.replace(partial, out)
        stale = not args.with_archive and os.path.exists(archive_out)
        if stale:  # the archive of the backup FILE was: it is not this one's
            os.unlink(archive_out)
        OsDisk().sync_dir(os.path.dirname(out))  # the renames themselves survive a power loss
    except OSError as error:
        raise UsageError(f"cannot write {args.out}: {error}") from None
    finally:
        for leftover in (partial, archive_partial):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
    details = {"file": out, "node": served["node"], **dataclasses.asdict(info), "archive": None}
    if archived is not None:
        archive, node = archived
        details["archive"] = {"file": archive_out, "node": node, "rows": archive.rows,
                              "size_bytes": os.path.getsize(archive_out)}

    def report() -> str:
        text = (f"backup of cluster "
                f"{info.cluster_name or 'unknown (a release before cluster names)'}"
                f" from {served['node']} at log index {info.index} (term {info.term}): "
                f"{info.jobs} jobs, {info.schedules} schedules, {info.size_bytes} bytes, "
                f"digest {info.digest[:16]} -> {out}\n")
        if details["archive"] is not None:
            text += (f"archive from {details['archive']['node']}: "
                     f"{details['archive']['rows']} archived jobs, "
                     f"{details['archive']['size_bytes']} bytes -> {archive_out}\n")
        elif stale:
            text += f"removed {archive_out}: the archive of the backup this one replaced\n"
        return text

    _print(args, details, report)


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
