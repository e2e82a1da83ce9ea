"""Raft's AppendEntries rules on one real node, with crafted messages
(cluster/consensus/raftpatch.py).

A follower n2 gets hand-written appends from n1 and its replies are captured; nothing is
ticked, so no timer interferes. The leader-side case uses a real elected leader. Cases that
0.3.17 gets wrong also run under ``raftpatch.uninstalled()`` to show they can fail.
"""

from __future__ import annotations

import gzip
import pickle
from collections.abc import Iterator
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
import pytest

from raftcron.chaos.sim.cluster import SimCluster, SimNode, raft_log
from raftcron.chaos.sim.machines import KeyLog, payload_of
from raftcron.cluster.consensus import raftpatch

NO_OP = b"\x01"
MACHINE = KeyLog()


def entry(index: int, term: int) -> tuple[bytes, int, int]:
    return (NO_OP, index, term)


def append(term: int, prev: tuple[int, int], entries: list[Any], commit: int) -> dict[str, Any]:
    return {"type": "append_entries", "term": term, "commit_index": commit,
            "entries": entries, "prevLogIdx": prev[0], "prevLogTerm": prev[1]}


class Follower:
    """n2 of a cluster that is never ticked: it only reacts to what the test delivers."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.replies = cluster.network.capture("n2", "n1", lambda message: True)

    def receive(self, message: dict[str, Any]) -> dict[str, Any]:
        self.cluster.network.deliver_now("n1", "n2", message)
        return self.replies[-1] if self.replies else {}

    @property
    def node(self) -> Any:
        return self.cluster.nodes["n2"]

    def log(self) -> list[tuple[int, int]]:
        return [(index, term) for index, term, _ in raft_log(self.node)]


@pytest.fixture(params=["patched", "unpatched"])
def follower(request: pytest.FixtureRequest) -> Iterator[Follower]:
    raftpatch.install()
    with SimCluster(["n1", "n2", "n3"], MACHINE.build, seed="crafted",
                    patched=request.param == "patched") as cluster:
        yield Follower(cluster)


def is_patched(follower: Follower) -> bool:
    return follower.cluster.is_patched("n2")


def test_a_real_conflict_from_a_newer_term_is_still_truncated(follower: Follower) -> None:
    follower.receive(append(1, (1, 0), [entry(2, 1), entry(3, 1), entry(4, 1)], commit=1))
    reply = follower.receive(append(2, (2, 1), [entry(3, 2)], commit=1))
    assert follower.log() == [(1, 0), (2, 1), (3, 2)]
    assert reply["success"] and reply["next_node_idx"] == 4


def test_a_stale_shorter_append_deletes_nothing(follower: Follower) -> None:
    follower.receive(append(1, (1, 0), [entry(2, 1), entry(3, 1), entry(4, 1)], commit=1))
    stale_append = follower.receive(append(1, (1, 0), [entry(2, 1)], commit=1))
    stale_heartbeat = follower.receive(append(1, (2, 1), [], commit=1))
    if not is_patched(follower):
        assert follower.log() == [(1, 0), (2, 1)]  # 0.3.17 drops acknowledged entries 3, 4
        return
    assert follower.log() == [(1, 0), (2, 1), (3, 1), (4, 1)]
    # Each ack claims only what that append verified, never the longer local log.
    assert stale_append["success"] and stale_append["next_node_idx"] == 3
    assert stale_heartbeat["success"] and stale_heartbeat["next_node_idx"] == 3


def test_a_repeated_prefix_with_a_new_tail_appends_only_the_tail(follower: Follower) -> None:
    follower.receive(append(1, (1, 0), [entry(2, 1), entry(3, 1)], commit=1))
    reply = follower.receive(append(1, (1, 0), [entry(i, 1) for i in (2, 3, 4, 5)], commit=3))
    assert follower.log() == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1)]
    assert reply["success"] and reply["next_node_idx"] == 6
    assert follower.node.raftCommitIndex == 3


def test_an_unverified_tail_is_neither_deleted_nor_committed(follower: Follower) -> None:
    # Entries 3 and 4 come from a term-1 leader that died; the term-2 leader only shares 2.
    follower.receive(append(1, (1, 0), [entry(2, 1), entry(3, 1), entry(4, 1)], commit=1))
    reply = follower.receive(append(2, (2, 1), [], commit=10))
    assert follower.node.raftCommitIndex == 2  # not 4: this append verified nothing beyond 2
    assert reply["success"] and reply["next_node_idx"] == 3
    if is_patched(follower):
        assert follower.log() == [(1, 0), (2, 1), (3, 1), (4, 1)]
    follower.receive(append(2, (2, 1), [entry(3, 2)], commit=10))
    assert follower.log() == [(1, 0), (2, 1), (3, 2)]
    assert follower.node.raftCommitIndex == 3


def test_a_commit_index_never_outruns_the_entries_of_the_append(follower: Follower) -> None:
    follower.receive(append(1, (1, 0), [entry(2, 1), entry(3, 1), entry(4, 1)], commit=1))
    follower.receive(append(1, (1, 0), [entry(2, 1)], commit=4))
    assert follower.node.raftCommitIndex == 2


def test_an_append_from_an_older_term_changes_nothing(follower: Follower) -> None:
    follower.receive(append(2, (1, 0), [entry(2, 2), entry(3, 2)], commit=1))
    reply = follower.receive(append(1, (1, 0), [entry(2, 1)], commit=3))
    assert follower.log() == [(1, 0), (2, 2), (3, 2)]
    assert reply.get("next_node_idx") == 4  # the last reply is still the one for term 2


def test_a_chunked_entry_is_reassembled_and_a_repeat_keeps_the_log(follower: Follower) -> None:
    follower.receive(append(1, (1, 0), [entry(2, 1), entry(3, 1)], commit=1))
    data = pysyncobj_pickle.dumps((NO_OP + payload_of(100, "big"), 2, 1))
    start = {**append(1, (1, 0), [], commit=1), "transmission": "start", "data": data[:40]}
    finish = {**append(1, (1, 0), [], commit=1), "transmission": "finish", "data": data[40:]}
    del start["entries"], finish["entries"]
    follower.receive(start)
    reply = follower.receive(finish)
    assert reply["success"] and reply["next_node_idx"] == 3
    assert follower.node._SyncObj__recvTransmission == ""
    if is_patched(follower):
        assert follower.log() == [(1, 0), (2, 1), (3, 1)]


def propose_33_kb(cluster: SimCluster, node_id: str, key: str) -> None:
    def invoke(node: Any, callback: Any) -> None:
        MACHINE.propose(node, key, payload_of(33_000, key), callback)

    cluster.propose(node_id, key, invoke)


@pytest.mark.parametrize("patched", [True, False])
def test_a_late_success_ack_never_moves_next_index_backwards(patched: bool) -> None:
    raftpatch.install()
    with SimCluster(["n1", "n2", "n3"], MACHINE.build, seed="late-ack",
                    patched=patched) as cluster:
        leader_id = cluster.wait_leader(5.0)
        follower_id = next(node_id for node_id in cluster.node_ids if node_id != leader_id)
        leader, follower = cluster.nodes[leader_id], SimNode(follower_id)
        start_index = raft_log(leader)[-1][0]
        cluster.wait_for(lambda: leader._SyncObj__raftMatchIndex[follower] == start_index,
                         1.0, "the follower caught up")
        cluster.network.pause(follower_id, leader_id)  # its acks are late
        for n in range(6):
            propose_33_kb(cluster, leader_id, f"c{n}")
        end_index = start_index + 6
        cluster.wait_for(lambda: leader._SyncObj__raftNextIndex[follower] == end_index + 1,
                         1.0, "all batches sent")
        assert leader._SyncObj__raftMatchIndex[follower] == start_index

        late_ack = {"type": "next_node_idx", "next_node_idx": start_index + 3,
                    "reset": False, "success": True}
        cluster.network.deliver_now(follower_id, leader_id, late_ack)
        assert leader._SyncObj__raftMatchIndex[follower] == start_index + 2
        next_index = leader._SyncObj__raftNextIndex[follower]
        assert next_index == (end_index + 1 if patched else start_index + 3)


def snapshot(term: int, commit: int, chunk: Any) -> dict[str, Any]:
    return {"type": "append_entries", "term": term, "commit_index": commit, "serialized": chunk}


def test_a_snapshot_chunk_commits_nothing_until_the_snapshot_is_installed(
        follower: Follower) -> None:
    # 3 and 4 come from a term-1 leader and were never committed; a term-2 leader now
    # streams a snapshot, and while its serializer is busy it sends `serialized: None`.
    follower.receive(append(1, (1, 0), [entry(2, 1), entry(3, 1), entry(4, 1)], commit=2))
    follower.receive(snapshot(2, 11, (b"first part", True, False)))
    follower.receive(snapshot(2, 11, None))
    if not is_patched(follower):
        assert follower.node.raftCommitIndex == 4  # 0.3.17 commits the unverified tail
        return
    assert follower.node.raftCommitIndex == 2


def test_an_installed_snapshot_commits_its_entries(follower: Follower) -> None:
    dump = gzip.compress(pickle.dumps(({"keys": ["s"]}, (NO_OP, 11, 2), (NO_OP, 10, 2), set())))
    reply = follower.receive(snapshot(2, 11, (dump, True, True)))
    assert follower.log() == [(10, 2), (11, 2)]
    assert follower.node.raftCommitIndex == 11 and follower.node.keys == ["s"]
    assert reply["success"] and reply["next_node_idx"] == 12


def test_a_reject_never_hints_past_an_uncommitted_entry_of_an_older_term(
        follower: Follower) -> None:
    follower.receive(append(1, (1, 0), [entry(2, 1), entry(3, 1), entry(4, 1)], commit=2))
    # A term-2 leader pipelines: its entry 4 has term 2 (conflict), a later batch starts at 6.
    conflict = follower.receive(append(2, (4, 2), [], commit=2))
    missing = follower.receive(append(2, (6, 2), [entry(7, 2)], commit=2))
    hints = (conflict["next_node_idx"], missing["next_node_idx"])
    assert not conflict["success"] and not missing["success"]
    # 0.3.17: 4 then 5, and the leader ends at 5, past the conflict, forever.
    assert hints == ((3, 3) if is_patched(follower) else (4, 5))


def test_a_reject_keeps_last_plus_one_when_the_tail_is_from_the_leaders_term(
        follower: Follower) -> None:
    follower.receive(append(2, (1, 0), [entry(2, 2), entry(3, 2)], commit=1))
    reply = follower.receive(append(2, (5, 2), [], commit=1))
    assert not reply["success"] and reply["next_node_idx"] == 4


def test_a_compaction_point_past_the_log_never_empties_it(follower: Follower) -> None:
    # A compaction that finishes after a snapshot install replaced the log.
    follower.receive(append(1, (1, 0), [entry(2, 1), entry(3, 1)], commit=1))
    follower.node._SyncObj__deleteEntriesTo(4)
    assert follower.log() == ([(1, 0), (2, 1), (3, 1)] if is_patched(follower) else [])
