"""How a node started with `raftcron node --rejoin-empty=auto` starts (DESIGN.md §9.5): the
init step of a Kubernetes pod, which cannot know from its volume alone whether it is new.

An empty data dir is either a first start or a member whose volume was lost. Started as new,
the second would vote with an empty log and could help elect a leader that lacks entries it
had acknowledged; so it must come back with `--rejoin-empty`, and a first start must not
(nobody would be there to catch up from). The node asks its peers (`GET /v1/cluster`, with
the peers' credential) and decides:

1. the data dir holds anything of a node (its mark, a log, a snapshot, an 0.1.0 file): start
   as it is, asking nobody (a restart; the data dir's own checks apply);
2. a peer holds a cluster (it knows a leader, or has committed or applied an entry after the
   one every log starts with): `rejoin` when that cluster lists this node as a member, else
   `join` (a pod added by scaling up, waiting for `raftcron cluster add`);
3. every peer answered and none holds a cluster: `first_start`;
4. at the deadline, a majority of the members (this one counted) answered with nothing and
   none holds a cluster: `first_start`, naming the peers that were silent;
5. otherwise, at the deadline: `undecided`; the node does not start (exit 75), and the kubelet
   starts the container again, which asks again. Starting new on silence would be rule 4
   without its majority: what makes a lost volume look like a first start.

While it asks, the node answers the same question from its peers: `GET /v1/cluster` gets 503
with `"deciding": true` (an empty node, holding no cluster), so the members of a first start,
all asking at once, hear each other at once instead of waiting out the deadline.

The members of a first start do not decide at the same moment: one that heard the others
first starts new, and the others hear it as a node without a leader (rule 3). A slow one may
hear the leader the others have elected by then and rejoin, which for an empty node only
means it catches up before it votes: rejoining is safe whenever a cluster exists; starting
new is not, and only that is guarded.

Rule 4 cannot tell a first start from the loss of a majority of the volumes at once; nothing
can without memory outside the volumes, and Raft promises nothing once a majority is lost
(restore a backup then, docs/operations/backup.md, "Backup and restore").

What it must not do: start the node (cluster/node.py does), or trust an answer it did not
check: an answer from another node than the one asked, or one that does not parse, counts as
silence.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import http.server
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raftcron.cluster.clients import tls
from raftcron.cluster.clients.peerhttp import PeerDialer
from raftcron.cluster.config import NodeConfig, Peer, split_address
from raftcron.cluster.storage.datadir import LEGACY_NAMES, MARK_NAME, holds_storage

log = logging.getLogger("raftcron.startmode")

MODES = ("as_is", "first_start", "rejoin", "join", "undecided", "ask_again")
EXIT_UNDECIDED = 75  # EX_TEMPFAIL: try again later (the kubelet restarts the container)
ASK_PERIOD_S = 1.0
ANSWER_TIMEOUT_S = 2.0
ANSWER_BYTES_MAX = 1 << 20  # a view of a cluster of any size the project supports
ASK_S_DEFAULT = 20.0  # `--ask-peers-s`: a first start's members hear each other in ~1 s
ASK_S_MAX = 3600.0
FRESH_INDEX = 1  # the commit and applied index of a node that never had a leader


@dataclass(frozen=True)
class PeerAnswer:
    """What one peer said; `holds_cluster` None: no answer that could be used (`detail` why)."""

    node_id: str
    holds_cluster: bool | None
    lists_me: bool = False  # its members include the asking node
    detail: str = ""


@dataclass(frozen=True)
class StartDecision:
    mode: str  # one of MODES
    reason: str


def looks_new(names: Sequence[str]) -> bool:
    """A data dir's listing holds nothing a node wrote (a volume's lost+found is not)."""
    return (MARK_NAME not in names and not holds_storage(list(names))
            and not any(name in names for name in LEGACY_NAMES))


def read_answer(peer_id: str, me: str, status: int, body: bytes) -> PeerAnswer:
    """A peer's answer to `GET /v1/cluster`, every field checked."""
    def silent(why: str) -> PeerAnswer:
        return PeerAnswer(peer_id, None, detail=why)

    try:
        view = json.loads(body)
    except ValueError:
        return silent(f"HTTP {status}, not JSON")
    if not isinstance(view, dict):
        return silent(f"HTTP {status}, not a JSON object")
    if view.get("node") != peer_id:
        return silent(f"answered as {view.get('node')!r}, not {peer_id!r}")
    if status == 503 and view.get("deciding") is True:
        return PeerAnswer(peer_id, False, detail="empty, asking its peers too")
    if status != 200:
        return silent(f"HTTP {status}")
    leader = view.get("leader")
    indexes = [view.get(key) for key in ("commit_index", "applied_index")]
    members = view.get("members")
    if leader is not None and not isinstance(leader, str):
        return silent(f"leader is {leader!r}")
    counts = [index for index in indexes
              if isinstance(index, int) and not isinstance(index, bool) and index >= 0]
    if len(counts) != len(indexes):
        return silent(f"commit_index and applied_index are {indexes}")
    if not isinstance(members, list) or not all(
            isinstance(member, dict) and isinstance(member.get("node_id"), str)
            for member in members):
        return silent("members is not a list of members")
    # Every log starts with PySyncObj's entry 1, committed and applied by a node that has
    # just started new; a leader's first entry (2) is what a cluster commits first.
    holds = leader is not None or max(counts) > FRESH_INDEX
    lists_me = any(member["node_id"] == me for member in members)
    return PeerAnswer(peer_id, holds, lists_me,
                      f"leader {leader}, commit {indexes[0]}, applied {indexes[1]}")


def decide(peer_ids: Sequence[str], answers: Mapping[str, PeerAnswer], *,
           deadline_passed: bool) -> StartDecision:
    """Rules 2-5 of the module docstring for an empty node with these peers."""
    holding = [answers[peer] for peer in peer_ids
               if peer in answers and answers[peer].holds_cluster]
    if holding:
        said = "; ".join(f"{answer.node_id}: {answer.detail}" for answer in holding)
        if any(answer.lists_me for answer in holding):
            return StartDecision("rejoin", f"the peers hold a cluster that lists this node "
                                 f"({said}): it lost its data")
        return StartDecision("join", f"the peers hold a cluster that does not list this node "
                             f"({said}): it waits for `raftcron cluster add`")
    empty = [peer for peer in peer_ids
             if peer in answers and answers[peer].holds_cluster is False]
    silent = [peer for peer in peer_ids if peer not in empty]
    if not silent:
        return StartDecision("first_start", "every peer answered and none holds a cluster")
    if not deadline_passed:
        return StartDecision("ask_again", f"no answer yet from {', '.join(silent)}")
    why = ", ".join(f"{peer} ({answers[peer].detail if peer in answers else 'no answer'})"
                    for peer in silent)
    members = 1 + len(peer_ids)
    if 1 + len(empty) > members // 2:
        return StartDecision("first_start", f"a majority holds no cluster (this node and "
                             f"{', '.join(empty)}); silent: {why}")
    return StartDecision("undecided", f"no majority answered: silent {why}")


def choose(config: NodeConfig, dialer: PeerDialer, *, ask_s: float,
           clock: Callable[[], float] = time.monotonic) -> StartDecision:
    """This node's start mode: rule 1 from its data dir, else the peers asked every
    ASK_PERIOD_S until they decide it or `ask_s` has passed."""
    try:
        names = os.listdir(config.data_dir)
    except FileNotFoundError:
        names = []
    if not looks_new(names):
        return _said(StartDecision("as_is", f"the data dir {config.data_dir} holds a node's "
                                   "data: a restart"), {})
    if not config.peers:
        return _said(StartDecision("as_is", "no peers: nobody to rejoin"), {})
    log.info("data dir %s is empty: asking the peers %s whether they hold a cluster (for at "
             "most %g s)", config.data_dir, ", ".join(peer.node_id for peer in config.peers),
             ask_s, extra={"action": "start_mode_asking"})
    deadline = clock() + ask_s
    answers: dict[str, PeerAnswer] = {}
    ids = [peer.node_id for peer in config.peers]
    with _DecidingServer(config), concurrent.futures.ThreadPoolExecutor(len(ids)) as pool:
        while True:
            for answer in pool.map(lambda peer: ask(dialer, peer, config.node_id), config.peers):
                answers[answer.node_id] = answer
            decision = decide(ids, answers, deadline_passed=clock() >= deadline)
            if decision.mode != "ask_again":
                return _said(decision, answers)
            time.sleep(max(0.0, min(ASK_PERIOD_S, deadline - clock())))


def _said(decision: StartDecision, answers: Mapping[str, PeerAnswer]) -> StartDecision:
    """The decision logged with every peer's last answer, as the operator's record."""
    level = logging.WARNING if decision.mode in ("undecided", "join") else logging.INFO
    log.log(level, "start mode %s: %s", decision.mode, decision.reason,
            extra={"action": "start_mode", "mode": decision.mode,
                   "answers": {peer: answer.detail for peer, answer in answers.items()}})
    return decision


def ask(dialer: PeerDialer, peer: Peer, me: str) -> PeerAnswer:
    """One `GET /v1/cluster` of `peer`, within ANSWER_TIMEOUT_S."""
    request = urllib.request.Request(dialer.url(peer.http_address, "/v1/cluster"),
                                     headers=dialer.headers)
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_S,
                                    context=dialer.context) as response:
            return read_answer(peer.node_id, me, response.status,
                               response.read(ANSWER_BYTES_MAX))
    except urllib.error.HTTPError as error:
        with error:
            return read_answer(peer.node_id, me, error.code, error.read(ANSWER_BYTES_MAX))
    except (OSError, ValueError, http.client.HTTPException) as error:  # refused, unresolved,
        # timed out, TLS, a broken answer
        reason = getattr(error, "reason", error)
        return PeerAnswer(peer.node_id, None, detail=str(reason) or type(error).__name__)


class _DecidingServer:
    """`GET /v1/cluster` on this node's HTTP address while it asks: 503, `"deciding": true`."""

    def __init__(self, config: NodeConfig) -> None:
        body = json.dumps({"node": config.node_id, "deciding": True, "error": {
            "code": "starting", "message": "this node's data dir is empty and it is asking "
            "its peers whether they hold a cluster (--rejoin-empty=auto)"}}).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = ANSWER_TIMEOUT_S  # a peer that connects and says nothing

            def do_GET(self) -> None:
                found = self.path.split("?")[0] == "/v1/cluster"
                self.send_response(503 if found else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body) if found else 0))
                self.end_headers()
                if found:
                    self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        host, port = split_address(config.http_address)
        self.server = http.server.ThreadingHTTPServer((host.strip("[]"), port), Handler)
        self.server.daemon_threads = True
        context = tls.server_context(config.api)
        if context is not None:  # the handshake in the request's thread, under its timeout,
            # not in accept(), where a peer that says nothing would hold up every other one
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True,
                                                     do_handshake_on_connect=False)
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       name="start-mode-answers", daemon=True)

    def __enter__(self) -> _DecidingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
