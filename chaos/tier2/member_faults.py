"""Membership changes under faults for tier 2 (CHAOS.md; DESIGN.md §8.4).

What it owns: `MemberCluster`, a `ChaosCluster` of five hosts of which three start as the
cluster and two wait as spares, and the `members` scenario's plan: add a spare (started with
``join = true`` and the current members as its peers) or remove a member (sometimes the
leader), and while the change runs, hurt the cluster: kill -9 the leader or the joining node,
isolate the leader, pause the leader, or nothing. While a change is in progress a second one
is asked for (`PROBE`) and must be refused (409 `membership_change_in_progress`), unless the
first one had already ended. A removed node is
stopped and becomes a spare again, which comes back later with an empty data dir (a new node,
as an operator replacing a host would). The cluster never has fewer than three members.

Every change is recorded in the history as a ``member`` event (``begin`` with the API's
answer, ``conflict`` with the second request's, ``end`` with the outcome the members report),
for the membership checker (chaos/tier2/checkers/membership.py), which also reads every node's
log for leaders (never two in one term; a removed node never leads again). The other checkers
judge lost writes, divergence and duplicate fires as in every scenario.

Network namespaces only: a joining node's Raft address must be the same for every member,
which the loopback relay (one address per pair of nodes) cannot give.
"""

from __future__ import annotations

import shutil
import time
from typing import TYPE_CHECKING, Any

from raftcron.chaos.tier2.nemesis import ADMIN, ChaosCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

if TYPE_CHECKING:
    from raftcron.chaos.tier2.context import Context

INITIAL_MEMBERS = 3
HOSTS = 5
CHANGE_WAIT_S = 90  # a change ends by then once its faults are healed, or the run says so
FAULTS_DURING = ("kill_leader", "kill_joiner", "isolate_leader", "pause_leader", "none")
# The second change asked for while one runs: a node that does not exist (no host has the
# address), so that if the API wrongly began it, it could never take effect and is cancelled.
PROBE = {"node_id": "probe", "raft_address": "198.18.0.99:7000",
         "http_address": "198.18.0.99:8000"}


class MemberCluster(ChaosCluster):
    """Five hosts; `nodes` are the members, `spares` the hosts not in the cluster now."""

    spares: list[LocalNode]

    def configure(self) -> list[LocalNode]:
        if self.nodes:
            return self.nodes
        every = super().configure()
        self.nodes, self.spares = every[:INITIAL_MEMBERS], every[INITIAL_MEMBERS:]
        for node in self.nodes:  # the first members know only each other
            node.config_path.write_text(self.config_text(node, peers=self.nodes))
        return self.nodes

    def config_text(self, node: LocalNode, peers: list[LocalNode] | None = None) -> str:
        # A joining node that never catches up (killed, cut off) is given up on within the run.
        return super().config_text(node, peers) + "\n[membership]\ncatch_up_timeout_s = 30\n"

    def known_nodes(self) -> list[LocalNode]:
        return [*self.nodes, *self.spares]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.known_nodes()]

    def prepare_joiner(self, node: LocalNode) -> None:
        """A spare as a new node: empty data dir, the members now as its peers, join = true."""
        shutil.rmtree(node.data_dir, ignore_errors=True)
        text = self.config_text(node, peers=self.nodes)
        node.config_path.write_text(text.replace("\nlog_level", "\njoin = true\nlog_level", 1))


def _body(node: LocalNode) -> dict[str, str]:
    return {"node_id": node.node_id, "raft_address": node.raft_address,
            "http_address": node.http_address}


def _ask(ctx: Context, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    cluster = ctx.cluster
    try:
        status, answer, _ = cluster.call(method, path, body, token=ADMIN, timeout_s=30)
    except Exception as error:  # no member answered in time: the plan goes on
        return 0, str(error)
    return int(status), answer


def _hurt(ctx: Context, fault: str, joiner: LocalNode | None) -> None:
    nemesis, rng = ctx.nemesis, ctx.rng
    leader = ctx.leader()
    if fault == "kill_joiner" and joiner is not None:
        fault_id = nemesis.kill([joiner.node_id], fault="kill")
        ctx.hold(rng.uniform(1.0, 3.0))
        nemesis.restart(fault_id, [joiner.node_id])
    elif fault == "kill_leader" and leader is not None:
        fault_id = nemesis.kill([leader])
        ctx.hold(rng.uniform(1.0, 3.0))
        nemesis.restart(fault_id, [leader])
    elif fault == "isolate_leader" and leader is not None:
        fault_id = nemesis.isolate([leader])
        ctx.hold(rng.uniform(2.0, 5.0))
        nemesis.heal(fault_id)
    elif fault == "pause_leader" and leader is not None:
        fault_id = nemesis.pause([leader])
        ctx.hold(rng.uniform(2.0, 4.0))
        nemesis.resume(fault_id, [leader])


def _change(ctx: Context, action: str, node: LocalNode) -> None:
    """One change: begin it (not waiting), ask for a second one, hurt, heal, follow it."""
    cluster, rng, history = ctx.cluster, ctx.rng, ctx.history
    assert isinstance(cluster, MemberCluster)
    if action == "add":
        cluster.prepare_joiner(node)
        cluster.spares.remove(node)
        cluster.nodes.append(node)  # from now on the harness treats it as a member
        cluster.start_node(node)
        status, answer = _ask(ctx, "POST", "/v1/cluster/members?wait_s=0", _body(node))
    else:
        status, answer = _ask(ctx, "DELETE", f"/v1/cluster/members/{node.node_id}?wait_s=0")
    change = answer.get("change") if isinstance(answer, dict) else None
    history.record("member", op="begin", action=action, node=node.node_id, status=status,
                   change_id=None if not change else change.get("change_id"),
                   answer=answer if status >= 400 or status == 0 else None)
    if status not in (200, 201, 202):
        if action == "add":
            cluster.nodes.remove(node)
            cluster.kill(node)
            cluster.spares.append(node)
        return
    if status == 202 and change:
        _second_change(ctx, action, node, int(change["change_id"]))
        _hurt(ctx, rng.choice(FAULTS_DURING), node if action == "add" else None)
    ended = _follow(ctx, change)
    outcome = None if ended is None else ended.get("outcome")
    history.record("member", op="end", action=action, node=node.node_id, outcome=outcome,
                   reason=None if ended is None else ended.get("reason"))
    if (action == "remove" and outcome == "done") or (action == "add" and outcome == "aborted"):
        cluster.nodes.remove(node)
        if node.running:
            cluster.stop(node)
        cluster.spares.append(node)


def _second_change(ctx: Context, action: str, node: LocalNode, first: int) -> None:
    """Ask for another change (adding a node that does not exist: harmless if it began)
    while `first` runs. It must be refused; or, if it began, `first` had ended before (the
    answering node's view, which applied the second one's start, says so)."""
    status, said = _ask(ctx, "POST", "/v1/cluster/members?wait_s=0", PROBE)
    code = said.get("error", {}).get("code") if isinstance(said, dict) else None
    first_ended = None
    if status in (200, 201, 202) and isinstance(said, dict):
        recent = (said.get("members") or {}).get("recent", [])
        first_ended = any(e.get("change_id") == first for e in recent)
        _ask(ctx, "DELETE", f"/v1/cluster/members/{PROBE['node_id']}?wait_s=30")
    ctx.history.record("member", op="conflict", action=action, node=node.node_id,
                       status=status, code=code, first=first, first_ended=first_ended)


def _follow(ctx: Context, change: dict[str, Any] | None) -> dict[str, Any] | None:
    """The change once a member reports it ended (bounded; every live node is asked: one may
    lag, or be a removed node that never heard of its removal); None if none did."""
    if not change:
        return None
    change_id = change.get("change_id")
    deadline = time.monotonic() + CHANGE_WAIT_S
    while time.monotonic() < deadline:
        ctx.tick()
        for member in ctx.cluster.live_nodes():
            try:
                status, view, _ = ctx.cluster.request(member, "GET", "/v1/cluster/members",
                                                      token=ADMIN, timeout_s=3)
            except OSError:
                continue
            if status == 200 and isinstance(view, dict):
                for ended in view.get("recent", []):
                    if ended.get("change_id") == change_id:
                        return dict(ended)
        time.sleep(0.25)
    ctx.history.record("note", text=f"membership change {change_id} did not end within "
                                    f"{CHANGE_WAIT_S} s")
    return None


def plan_members(ctx: Context) -> None:
    cluster, rng = ctx.cluster, ctx.rng
    assert isinstance(cluster, MemberCluster)
    while ctx.left_s() > 20:
        members = list(cluster.nodes)
        grow = cluster.spares and (len(members) <= INITIAL_MEMBERS or rng.random() < 0.5)
        if grow:
            _change(ctx, "add", rng.choice(cluster.spares))
        else:
            leader = ctx.leader()
            pick = next((n for n in members if n.node_id == leader), None) \
                if rng.random() < 0.4 else None
            _change(ctx, "remove", pick or rng.choice(members))
        ctx.wait_ready()
        ctx.hold(rng.uniform(1.0, 3.0))

