"""A learner the leader stopped replicating to and registers again, over a connection that
stayed up, is caught up (cluster/membership/raftconfig.py: `drop_learner`, `add_learner`).

The transport keeps a node's connection once it knows it (cluster/consensus/raftguard.py,
rule 4: `dropNode` does nothing while the transport lives), and PySyncObj sends the log only to
the nodes its connection callbacks marked connected. A leader that stepped down dropped its
learners (cluster/consensus/memberdriver.py, `_forget`); dropping one struck it from the
connected nodes although its connection stayed up, so when this node led again and registered
the learner anew, or the learner became a voter, nothing marked it connected again and the
leader never sent it an entry: a voter that never caught up, and the acknowledged jobs it
did not hold counted lost on it (found by the chaos suite's members scenario, seed 20261206).

Two real PySyncObj nodes in this process, ticked by the test, over loopback TCP with the
guarded transport: a one-voter leader, and a node that only listens (it never stands).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from pysyncobj import SyncObj, SyncObjConf, replicated

from raftcron.cluster.consensus import raftguard, raftpatch
from raftcron.cluster.dev.loopback import free_ports, release_ports
from raftcron.cluster.membership import raftconfig

PASSWORD = "a cluster password"
DEADLINE_S = 10.0


class Counter(SyncObj):  # type: ignore[misc]  # pysyncobj is untyped
    def __init__(self, address: str, peers: list[str], conf: SyncObjConf) -> None:
        super().__init__(address, peers, conf=conf, transportClass=raftguard.GuardedTransport)
        self.value = 0

    @replicated  # type: ignore[misc]
    def add(self, amount: int) -> int:
        self.value += amount
        return self.value


def _conf(*, stands: bool) -> SyncObjConf:
    conf = SyncObjConf(password=PASSWORD, autoTick=False, dynamicMembershipChange=True,
                       connectionRetryTime=0.1, appendEntriesPeriod=0.02)
    if not stands:  # a joining node: it must not stand, or its terms would outrun the leader
        conf.raftMinTimeout, conf.raftMaxTimeout = 3600.0, 3601.0
        conf.connectionTimeout = 3601.0
    return conf


@pytest.fixture
def pair() -> Iterator[tuple[Counter, Counter, str]]:
    """(leader, learner, the learner's address). The leader's address is the greater, so it
    dials the learner, as a member dials a joiner whose address sorts first."""
    raftpatch.install()
    ports = free_ports(2)
    low, high = sorted(f"127.0.0.1:{port}" for port in ports)
    learner = Counter(low, [high], _conf(stands=False))
    leader = Counter(high, [], _conf(stands=True))
    try:
        yield leader, learner, low
    finally:
        leader.destroy()
        learner.destroy()
        for node in (leader, learner):
            node.doTick(0.0)  # the destroy takes effect on a tick
        release_ports(ports)


def _tick_until(nodes: tuple[Counter, ...], done: Callable[[], bool],
                what: Callable[[], str]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        for node in nodes:
            node.doTick(0.002)
        if done():
            return
    raise AssertionError(f"not within {DEADLINE_S:g} s: {what()}")


def _replicate(leader: Counter, learner: Counter, address: str) -> None:
    """Append an entry on the leader and tick until the learner's match index reaches the
    leader's log end."""
    leader.add(1, sync=False)
    _tick_until((leader, learner), lambda: leader.raftLastApplied == leader._SyncObj__raftLog[
        -1][1] and raftconfig.match_index(leader, address) == leader._SyncObj__raftLog[-1][1],
        lambda: f"the learner's match index {raftconfig.match_index(leader, address)} reaches "
        f"the leader's last index {leader._SyncObj__raftLog[-1][1]}")


def test_a_learner_registered_again_over_a_live_connection_is_caught_up(
        pair: tuple[Counter, Counter, str]) -> None:
    leader, learner, address = pair
    _tick_until((leader, learner), lambda: bool(leader._isLeader()),
                lambda: "the leader leads")
    raftconfig.add_learner(leader, address)
    _tick_until((leader, learner), lambda: raftconfig.is_connected(leader, address),
                lambda: "the leader connects to the learner")
    _replicate(leader, learner, address)

    raftconfig.drop_learner(leader, address)  # the leader stepped down and forgot it
    for _ in range(20):
        for node in (leader, learner):
            node.doTick(0.002)
    assert raftconfig.connections(leader)[address] == 2, "the connection stays up (rule 4)"
    assert raftconfig.is_connected(leader, address), \
        "a learner dropped over a live connection is still connected: its connection says so"

    leader.add(1, sync=False)  # the log moved on meanwhile
    raftconfig.add_learner(leader, address)  # leading again: the same change goes on
    _replicate(leader, learner, address)
    assert learner._SyncObj__raftLog[-1][1] == leader._SyncObj__raftLog[-1][1]
