"""What the operator's commands share (cluster/commandline/opscli.py,
cluster/commandline/flowcli.py): the flags every command takes, the usage error, the exit codes, the
table or JSON printing, and reading durations and instants from a command line. No command lives
here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from raftcron.cluster.clients import tls
from raftcron.scheduler.calendar import RecurrenceError, parse_duration_ms

DEFAULT_CONNECT = "http://127.0.0.1:8001,http://127.0.0.1:8002,http://127.0.0.1:8003"
# Why each is used: cluster/commandline/opscli.py.
EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_ATTENTION = 1, 2, 3, 4
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports a command that SIGINT ended


class UsageError(Exception):
    pass


def add_common(parser: argparse.ArgumentParser, *, json_flag: bool = True) -> None:
    parser.add_argument(
        "--connect",
        default=os.environ.get("RAFTCRON_CONNECT", DEFAULT_CONNECT),
        help="node URLs, comma-separated (env RAFTCRON_CONNECT; default: the demo's 3 nodes)",
    )
    parser.add_argument(
        "--api-token",
        default=os.environ.get("RAFTCRON_API_TOKEN"),
        help="bearer token (env RAFTCRON_API_TOKEN)",
    )
    for flag, env, what in tls.FLAGS:
        parser.add_argument(flag, metavar="FILE", default=os.environ.get(env) or None,
                            help=f"{what} (env {env})")
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--deadline",
        type=float,
        default=float(os.environ.get("RAFTCRON_DEADLINE", "15")),
        help="give up after this many seconds of failing over and retrying "
        "(env RAFTCRON_DEADLINE; default 15)",
    )


def print_answer(args: argparse.Namespace, data: Any, render: Callable[[], str]) -> None:
    """`--json`: the data as JSON; else what `render` makes of it for a person."""
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        sys.stdout.write(render())


def table(headers: list[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [headers, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]
    return "\n".join(lines) + "\n" + ("" if rows else "(none)\n")


def duration_ms(text: str, flag: str) -> int:
    try:
        return parse_duration_ms(int(text) if text.isdigit() else text, field=flag)
    except RecurrenceError as error:
        raise UsageError(str(error)) from None


def instant_ms(text: str, flag: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{flag}: {text!r} is not ISO-8601 (e.g. 2026-12-01T09:00:00Z) or Unix ms"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)



def read_text(path: str) -> str:
    """A file the user named (a spec, a secret); UsageError naming it when it cannot be read."""
    try:
        with open(path) as handle:
            return handle.read()
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror}") from None
