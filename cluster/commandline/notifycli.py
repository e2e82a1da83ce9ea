"""`raftcron notifications put | list | show | delete`: webhooks from a shell (admin token).

The secret is read from a file (`--secret-file`, `-` for stdin; one trailing newline is
dropped), never from the command line, where shell history and `ps` would keep it. Exit
codes and output as the other operator commands (cluster/commandline/opscli.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from raftcron.cluster.clients.client import Client
from raftcron.cluster.commandline.cliparts import add_common
from raftcron.cluster.commandline.cliparts import print_answer as _print
from raftcron.cluster.commandline.cliparts import read_text as _read
from raftcron.cluster.commandline.cliparts import table as _table
from raftcron.scheduler.notifications import KINDS


def add_commands(commands: Any) -> None:
    notifications = commands.add_parser(
        "notifications", help="webhooks: an HTTP POST per dead letter, misfire, ... (admin)")
    actions = notifications.add_subparsers(dest="action", required=True, metavar="ACTION")
    put = actions.add_parser("put", help="create or replace a notification")
    add_common(put)
    put.add_argument("name")
    put.add_argument("--url", required=True, help="where to POST (http:// or https://)")
    put.add_argument("--events", required=True, metavar="KIND,KIND",
                     help=f"event kinds, comma-separated: {', '.join(KINDS)}")
    put.add_argument("--secret-file", required=True, metavar="FILE",
                     help="file holding the signing secret (16-256 characters; - for stdin)")
    add_common(actions.add_parser("list", help="every notification and its progress"))
    for name, text in (("show", "one notification"), ("delete", "delete a notification")):
        action = actions.add_parser(name, help=text)
        add_common(action)
        action.add_argument("name")


def handle(client: Client, args: argparse.Namespace) -> None:
    path = f"/v1/notifications/{args.name}" if args.action != "list" else "/v1/notifications"
    if args.action == "put":
        body = {"url": args.url, "events": [k.strip() for k in args.events.split(",") if k.strip()],
                "secret": _secret(args.secret_file)}
        shown = client.request("PUT", path, body, write=True)
        _print(args, shown, lambda: _rows([shown]))
    elif args.action == "list":
        found = client.request("GET", path)["notifications"]
        _print(args, found, lambda: _rows(found))
    elif args.action == "show":
        shown = client.request("GET", path)
        _print(args, shown, lambda: _rows([shown]))
    else:
        answer = client.request("DELETE", path, write=True)
        _print(args, answer, lambda: f"notification {args.name}: deleted\n")


def _secret(path: str) -> str:
    text = sys.stdin.read() if path == "-" else _read(path)
    return text[:-1] if text.endswith("\n") else text


def _rows(found: list[dict[str, Any]]) -> str:
    rows = [[n["name"], n["url"], ",".join(n["events"]), n["pending"],
             f"{n['lag_ms'] / 1000:.1f}s", n["delivered"], n["lost"]] for n in found]
    return _table(["NAME", "URL", "EVENTS", "PENDING", "LAG", "DELIVERED", "LOST"], rows)
