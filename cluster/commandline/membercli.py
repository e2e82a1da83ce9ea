"""`raftcron cluster add NODE_ID --raft HOST:PORT --http HOST:PORT` and `raftcron cluster remove
NODE_ID`: one membership change (DESIGN.md §8.4), waited for until it ends.

The request itself waits up to 30 s on the node (`?wait_s=`); a change still going on after
that (a big state to send to a new node) is then followed through `GET /v1/cluster/members`
until it ends or `--wait` runs out. Exit codes as the other operator commands (cluster/opscli):
0 done, 1 refused or aborted (the message says why), 3 the cluster did not answer, or the
change was still going on when `--wait` ran out (it goes on: `raftcron cluster status`).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from raftcron.cluster.clients.client import ApiError, Client, Unavailable

REQUEST_WAIT_S = 30
POLL_S = 0.5


def add_arguments(actions: Any, add_common: Callable[[argparse.ArgumentParser], None]) -> None:
    add = actions.add_parser(
        "add", help="add a node (started first with join = true and the members as its peers)")
    add.add_argument("node_id")
    add.add_argument("--raft", required=True, metavar="HOST:PORT", help="its raft_address")
    add.add_argument("--http", required=True, metavar="HOST:PORT", help="its http_address")
    remove = actions.add_parser(
        "remove", help="remove a member (the leader hands over first); stop it afterwards")
    remove.add_argument("node_id")
    for parser in (add, remove):
        parser.add_argument("--wait", type=float, default=600.0, metavar="SECONDS",
                            help="how long to follow the change (default 600)")
        add_common(parser)


def run(client: Client, args: argparse.Namespace, show: Callable[[Any, str], None]) -> None:
    """Make the change and follow it to its end; `show(data, text)` prints the outcome."""
    deadline = time.monotonic() + args.wait
    wait_s = max(0, min(REQUEST_WAIT_S, int(args.wait)))
    options = {"params": {"wait_s": wait_s}, "timeout_s": wait_s + 15.0}
    if args.action == "add":
        body = {"node_id": args.node_id, "raft_address": args.raft, "http_address": args.http}
        answer = client.request("POST", "/v1/cluster/members", body, **options)
    else:
        answer = client.request("DELETE", f"/v1/cluster/members/{args.node_id}", **options)
    change = answer.get("change") or {}
    if answer.get("change") is not None and "outcome" not in change:
        change = _follow(client, int(change["change_id"]), deadline)
    verb = {"add": "added", "remove": "removed"}[args.action]
    if answer.get("cancelled"):
        verb = "no longer being added (cancelled)"
    show(answer | {"change": change or None}, f"{args.node_id}: {verb}\n")


def _follow(client: Client, change_id: int, deadline: float) -> dict[str, Any]:
    """The change once it ended; ApiError if it was aborted, Unavailable if --wait ran out."""
    while True:
        view = client.request("GET", "/v1/cluster/members")
        for ended in view.get("recent", []):
            if ended.get("change_id") == change_id:
                if ended.get("outcome") != "done":
                    raise ApiError(409, "membership_change_aborted",
                                   f"change {change_id}: {ended.get('reason') or 'aborted'}")
                return dict(ended)
        current = view.get("change") or {}
        if time.monotonic() + POLL_S > deadline:
            raise Unavailable(f"change {change_id} is still in progress "
                              f"({current.get('phase', 'unknown phase')}); it goes on: "
                              "see `raftcron cluster status`")
        time.sleep(POLL_S)


def status_lines(view: dict[str, Any]) -> str:
    """`raftcron cluster status`'s line about a change in progress (empty: none)."""
    change = view.get("membership_change")
    if not change:
        return ""
    member = change.get("member", {})
    cancel = f", cancelled: {change['cancel_reason']}" if change.get("cancel_reason") else ""
    return (f"change {change.get('change_id')} in progress: {change.get('action')} "
            f"{member.get('node_id')} ({member.get('raft_address')}), "
            f"{change.get('phase')}{cancel}\n")
