"""A local cluster of real `raftcron node` processes on loopback, for tests, demo, bench, chaos.

What it owns: choosing free loopback ports, writing one TOML config per node (with a random
cluster password, optional API tokens and [raft] tuning), waiting for readiness and leadership,
HTTP to the nodes, and audits (every live replica's state digest at one log entry). The node
processes (starting, signals, stop, restart, crashes, the logs) are `nodeprocesses`', the base
of `LocalCluster`; ports and plain HTTP are `loopback`'s.

Rules it keeps: every wait is bounded by a deadline and polls a condition (no fixed sleeps);
every process it started is killed by `close()` (`nodeprocesses`). It does not judge the
cluster: tests and the chaos suite do.
"""

from __future__ import annotations

import http.client
import secrets
import ssl
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from raftcron.cluster.archive.fill import LOCAL_HEADER
from raftcron.cluster.dev.loopback import (
    HttpSession,
    Response,
    free_ports,
    http_request,
)
from raftcron.cluster.dev.nodeprocesses import ClusterError, LocalNode, NodeProcesses
from raftcron.cluster.dev.tomlwrite import toml_value

T = TypeVar("T")

POLL_S = 0.05

# [raft] settings for tests: elections and failover well under a second on an idle machine,
# with enough margin that a busy 2-core machine does not hold needless elections.
FAST_RAFT: dict[str, object] = {
    "tick_ms": 100,
    "heartbeat_s": 0.05,
    "election_timeout_min_s": 0.5,
    "election_timeout_max_s": 1.0,
    "leader_fallback_s": 1.0,
    "connection_timeout_s": 1.0,
    "connection_retry_s": 0.25,
    "commit_timeout_s": 3.0,
}


class LocalCluster(NodeProcesses):
    """N nodes on loopback under `base_dir` (`<node>/<node>.toml`, `<node>/data/`,
    `<node>/<node>.log`), e.g.:

        with LocalCluster(tmp_path, raft=FAST_RAFT) as cluster:
            cluster.start()
            leader = cluster.wait_ready()
            status, job, headers = cluster.request(leader, "POST", "/v1/jobs", {"task": "t"})

    `request` and `call` send exactly the token they are given; `list_jobs`, the waits and
    `audit` use an admin token by themselves when `tokens` has one.
    """

    def __init__(
        self,
        base_dir: Path,
        *,
        nodes: int = 3,
        tokens: dict[str, str] | None = None,
        api: dict[str, object] | None = None,
        raft: dict[str, object] | None = None,
        storage: dict[str, object] | None = None,
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
        python: str = sys.executable,
        log_level: str = "info",
        cluster_name: str | None = None,
        settings: dict[str, object] | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.size = nodes
        self.tokens = dict(tokens or {})
        self.api = dict(api or {})  # other [api] settings (TLS, connection limits...)
        self.client_tls: ssl.SSLContext | None = None  # how the harness verifies HTTPS nodes
        self.raft = dict(raft or {})
        self.storage = dict(storage or {})
        self.host = host
        self.log_level = log_level
        # [cluster] name; None writes no [cluster] table (a node of a release before it
        # refuses the table: the rolling-upgrade test runs the previous release's nodes)
        self.cluster_name = cluster_name
        # [settings] (retention, budget: the shapes of PUT /v1/settings/...), which a new
        # cluster's first leader seeds the replicated settings from
        self.settings = dict(settings or {})
        self.password: str | None = secrets.token_hex(16)
        super().__init__(base_dir, python=python, env=env)

    # -- configuration ---------------------------------------------------------------------

    def configure(self) -> list[LocalNode]:
        """Choose ports and write every node's config (once); `start()` calls it."""
        if self.nodes:
            return self.nodes
        self.base_dir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(2 * self.size, self.host)
        return self.add_nodes(
            {
                f"n{index + 1}": (
                    f"{self.host}:{ports[2 * index]}",
                    f"{self.host}:{ports[2 * index + 1]}",
                )
                for index in range(self.size)
            }
        )

    def add_nodes(self, addresses: dict[str, tuple[str, str]]) -> list[LocalNode]:
        """One node per id with its (raft, http) addresses, each config written to its folder."""
        for node_id, (raft_address, http_address) in addresses.items():
            folder = self.base_dir / node_id
            self.nodes.append(
                LocalNode(
                    node_id=node_id,
                    raft_address=raft_address,
                    http_address=http_address,
                    config_path=folder / f"{node_id}.toml",
                    data_dir=folder / "data",
                    log_path=folder / f"{node_id}.log",
                    tls="tls_cert_file" in self.api,
                )
            )
        for node in self.nodes:
            node.config_path.parent.mkdir(parents=True, exist_ok=True)
            node.config_path.write_text(self.config_text(node))
        return self.nodes

    def config_text(self, node: LocalNode, peers: list[LocalNode] | None = None) -> str:
        """The TOML config of one node (DESIGN.md section 5); its peers are every other node
        unless given."""
        lines = [
            f"# Written by cluster.localcluster for a local {self.size}-node cluster.",
            f"node_id = {toml_value(node.node_id)}",
            f"raft_address = {toml_value(node.raft_address)}",
            f"http_address = {toml_value(node.http_address)}",
            f"data_dir = {toml_value('data')}",
            f"log_level = {toml_value(self.log_level)}",
        ]
        if self.password is not None:  # a test may clear it to see a node run without one
            lines.append(f"cluster_password = {toml_value(self.password)}")
        for peer in self.nodes if peers is None else peers:
            if peer is node:
                continue
            lines += [
                "",
                "[[peers]]",
                f"node_id = {toml_value(peer.node_id)}",
                f"raft_address = {toml_value(peer.raft_address)}",
                f"http_address = {toml_value(peer.http_address)}",
            ]
        if self.tokens or self.api:
            lines += ["", "[api]"]
            lines += [f"{key} = {toml_value(value)}" for key, value in self.api.items()]
        if self.tokens:
            tokens = ", ".join(f"{toml_value(t)} = {toml_value(r)}" for t, r in self.tokens.items())
            lines += [f"tokens = {{ {tokens} }}"]
        if self.raft:
            lines += ["", "[raft]"]
            lines += [f"{key} = {toml_value(value)}" for key, value in self.raft.items()]
        if self.storage:
            lines += ["", "[storage]"]
            lines += [f"{key} = {toml_value(value)}" for key, value in self.storage.items()]
        if self.cluster_name is not None:
            lines += ["", "[cluster]", f"name = {toml_value(self.cluster_name)}"]
        if self.settings:
            lines += ["", "[settings]"]
            lines += [f"{key} = {toml_value(value)}" for key, value in self.settings.items()]
        return "\n".join(lines) + "\n"

    # -- start -----------------------------------------------------------------------------

    def start(self) -> None:
        """Write the configs (first time only) and start every node that is not running."""
        self._check_open()
        for node in self.configure():
            if not node.running:
                self.start_node(node)

    @property
    def admin_token(self) -> str | None:
        """A token with the admin role, for the harness's own calls (None without auth)."""
        for token, role in self.tokens.items():
            if role == "admin":
                return token
        return None

    # -- waiting ---------------------------------------------------------------------------

    def wait_ready(self, timeout_s: float = 30) -> LocalNode:
        """Every live node is ready and all name the same live leader; that leader."""

        def agreed() -> LocalNode | None:
            live = self._live_or_raise()
            leaders = set()
            for node in live:
                answer = self._probe(node, "GET", "/readyz")
                if answer is None or answer[0] != 200 or not isinstance(answer[1], dict):
                    return None
                leaders.add(answer[1].get("leader"))
            if len(leaders) != 1:
                return None
            [leader_id] = leaders
            found = [node for node in live if node.node_id == leader_id]
            return found[0] if found else None

        return self.wait_for(agreed, timeout_s, "every live node ready with one live leader")

    def leader(self, timeout_s: float = 10) -> LocalNode:
        """The live node that says it leads (the highest term wins while an old one steps down)."""

        def current() -> LocalNode | None:
            best: tuple[int, LocalNode] | None = None
            for node in self._live_or_raise():
                answer = self._probe(node, "GET", "/v1/cluster")
                if answer is None or answer[0] != 200 or not isinstance(answer[1], dict):
                    continue
                view = answer[1]
                if view.get("role") == "leader" and (best is None or view["term"] > best[0]):
                    best = (int(view["term"]), node)
            return None if best is None else best[1]

        return self.wait_for(current, timeout_s, "a live leader")

    def followers(self) -> list[LocalNode]:
        """Every live node but the current leader."""
        leader = self.leader()
        return [node for node in self.live_nodes() if node is not leader]

    def wait_for(self, condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
        """Poll `condition` until it returns something other than None or False."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = condition()
            if value is not None and value is not False:
                return value
            if time.monotonic() >= deadline:
                raise ClusterError(f"timed out after {timeout_s:g} s waiting for {what}")
            time.sleep(POLL_S)

    # -- HTTP ------------------------------------------------------------------------------

    def request(
        self,
        node: LocalNode,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        timeout_s: float = 10,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """One HTTP request: (status, parsed JSON or text, headers). Raises OSError when the
        node cannot be reached or does not answer within timeout_s."""
        return http_request(
            node.http_address,
            method,
            path,
            body,
            token=token,
            timeout_s=timeout_s,
            headers=headers,
            tls=self.client_tls if node.tls else None,
        )

    def session(self, node: LocalNode, *, timeout_s: float = 10) -> HttpSession:
        """Many GETs to one node over one kept-open connection (loopback.HttpSession)."""
        return HttpSession(node.http_address, timeout_s=timeout_s,
                           tls=self.client_tls if node.tls else None)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        timeout_s: float = 15,
        nodes: list[LocalNode] | None = None,
    ) -> Response:
        """Ask live nodes in turn until one gives a definite answer (not a 503, not a dropped
        connection) or timeout_s passes. A write retried this way must carry a `request_id` in
        its body: the state machine then answers a repeat with the first result."""
        deadline = time.monotonic() + timeout_s
        last: object = None
        while True:
            for node in nodes or self._live_or_raise():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ClusterError(f"{method} {path}: no definite answer; last: {last}")
                try:
                    answer = self.request(
                        node, method, path, body, token=token, timeout_s=min(10, remaining)
                    )
                except (OSError, http.client.HTTPException) as error:
                    last = f"{node.node_id}: {error!r}"
                    continue
                if answer[0] != 503:
                    return answer
                last = f"{node.node_id}: {answer[0]} {answer[1]}"
            time.sleep(POLL_S)

    def list_jobs(
        self, node: LocalNode, *, token: str | None = None, own: bool = False,
        **filters: str | int,
    ) -> list[dict[str, Any]]:
        """Every job one node holds that matches the filters (GET /v1/jobs, all pages).
        `own`: answered from the node's own archive, never by a peer it would ask while it
        fills its archive (cluster/archive/fill.py)."""
        jobs: list[dict[str, Any]] = []
        cursor: int | None = None
        headers = {LOCAL_HEADER: "1"} if own else None
        while True:
            query = {**filters, "limit": 1_000, **({"cursor": cursor} if cursor else {})}
            path = "/v1/jobs?" + urllib.parse.urlencode(query)
            status, body, _ = self.request(node, "GET", path, token=token or self.admin_token,
                                           headers=headers)
            if status != 200:
                raise ClusterError(f"GET {path} on {node.node_id}: {status} {body}")
            jobs.extend(body["jobs"])
            cursor = body.get("next_cursor")
            if not cursor:
                return jobs

    def _probe(self, node: LocalNode, method: str, path: str) -> Response | None:
        try:
            return self.request(node, method, path, token=self.admin_token, timeout_s=1.0)
        except (OSError, http.client.HTTPException):
            return None

    # -- audits ----------------------------------------------------------------------------

    def audit(self, timeout_s: float = 15) -> dict[str, str]:
        """Checkpoint the log and wait until every live node digested it: {node_id: digest}."""
        return {node_id: digest for node_id, (_, digest) in self.audit_entries(timeout_s).items()}

    def audit_entries(self, timeout_s: float = 15) -> dict[str, tuple[int, str]]:
        """`audit`, with each node's log index of the checkpoint: {node_id: (index, digest)}."""
        deadline = time.monotonic() + timeout_s
        audit_id = self._start_audit(deadline)
        found: dict[str, tuple[int, str]] = {}

        def everyone() -> bool:
            for node in self._live_or_raise():
                if node.node_id in found:
                    continue
                answer = self._probe(node, "GET", f"/v1/cluster/audits/{audit_id}")
                if answer is not None and answer[0] == 200:
                    found[node.node_id] = (int(answer[1]["index"]), str(answer[1]["digest"]))
            return all(node.node_id in found for node in self.live_nodes())

        self.wait_for(everyone, max(0.1, deadline - time.monotonic()), f"audit {audit_id}")
        return {node.node_id: found[node.node_id] for node in self.live_nodes()}

    def _start_audit(self, deadline: float) -> str:
        last: object = None
        while time.monotonic() < deadline:
            for node in self._live_or_raise():
                try:
                    status, body, _ = self.request(
                        node, "POST", "/v1/cluster/audits", token=self.admin_token, timeout_s=5
                    )
                except (OSError, http.client.HTTPException) as error:
                    last = error
                    continue
                if status == 201:
                    return str(body["id"])
                last = (status, body)
            time.sleep(POLL_S)
        raise ClusterError(f"could not commit an audit checkpoint; last answer: {last}")
