"""Power loss of all three nodes loses no finished job the archives hold (DESIGN.md §9.2, issue
26 "Prove it"; docs/concepts/retention.md).

A powered cluster (tests/storage/powered.py: each data dir on a powerfs mount, which drops
every unsynced change at a cut and tears the last unsynced write of each file) in `fsync`
durability keeps no succeeded job in its state (retention `max_count` 0): each job that
finishes leaves the state at the next Tick, into every member's archive. A round: one
follower's archive is held (a process of the test's own takes its SQLite write lock, as a
stalled disk would: the writer commits nothing); a batch of keyed jobs with payloads is
submitted and completed (each completion answered "ok" in the next claim's answer); every
member lists them archived (the held one from its writer's hand-over); a compaction is forced
on every member and waited for until each one's snapshot covers the index it had applied
(from then on only the archive holds those jobs), the held one's written and waiting for its
archive; then a stream submits and completes more jobs while the power of all three goes (the
holder with it). Restarted, every member must answer every acknowledged job with its key and
payload, every job whose completion was acknowledged in status `succeeded` (live or
`"archived": true`), keys must stay deduplicated and the digests agree. Two rounds, each
holding another follower: the second cut hits archives written since a restart.

It can fail (tried on 2026-12-05, at the first cut): with the archive's commits not synced
(`PRAGMA synchronous = OFF` in cluster/archive/store.py) the snapshots covered the evictions
and the cut dropped the rows they had left to the archive: the two members not held answered
404 for all 100 jobs of the batch (the held one replayed them from its log, its snapshot still
waiting); with snapshots that do not wait for the archive (`may_cover` left unset in
cluster/archive/node.py) the held member's snapshot covered evictions its archive never wrote,
and it answered 404 for the same 100.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.loopback import Response
from raftcron.cluster.dev.nodeprocesses import LocalNode

from .harness import ADMIN_TOKEN, Lab, api, poll
from .powered import (
    READY_DEADLINE_S,
    cut_summary,
    every_acknowledged_job_problems,
    failure,
    power_cut,
    powered_cluster,
    restart,
)

ROUNDS = 2  # cuts in a row on one cluster
BATCH = 100  # jobs completed, archived and covered by snapshots before each cut
STREAMED_BEFORE_CUT = 20  # completions the stream has had acknowledged when the power goes
QUEUE = "archived"
CLAIM_ROUNDS_MAX = 50

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("needs_fuse")]


def job(key: str, number: int) -> dict[str, Any]:
    return {"task": "invoice", "queue": QUEUE, "key": key,
            "payload": {"customer": {"id": number}, "blob": os.urandom(100).hex()}}


def claim(cluster: LocalCluster, node: LocalNode, acks: list[dict[str, Any]],
          request_id: str) -> Response:
    """One claim of QUEUE that completes the jobs in `acks` (claimed by the claim before)."""
    body = {"worker": "w", "queues": [QUEUE], "max": 50, "lease_ms": 60_000,
            "request_id": request_id, "acks": acks}
    return api(cluster, node, "POST", "/v1/claims", body)


def acks_for(claimed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"id": got["id"], "token": got["token"], "outcome": "succeeded",
             "result": {"done": got["payload"]["customer"]}} for got in claimed]


def accepted(acks: list[dict[str, Any]], answer: dict[str, Any]) -> list[int]:
    """The jobs whose completion the claim's answer says was applied."""
    return [int(ack["id"]) for ack, outcome in zip(acks, answer.get("acks") or [], strict=False)
            if outcome.get("id") == ack["id"] and outcome.get("outcome") == "ok"]


def finish_all(cluster: LocalCluster, node: LocalNode, prefix: str) -> list[int]:
    """Claim and complete what QUEUE holds: the jobs whose completion was acknowledged."""
    ended: list[int] = []
    acks: list[dict[str, Any]] = []
    for number in range(CLAIM_ROUNDS_MAX):
        status, answer, _ = claim(cluster, node, acks, f"{prefix}-claim-{number}")
        assert status == 200, answer
        ended += accepted(acks, answer)
        acks = acks_for(answer["jobs"])
        if not acks:
            return ended
    raise AssertionError(f"{QUEUE} not drained in {CLAIM_ROUNDS_MAX} claims")


class Finisher:
    """From a thread, until stopped or the cluster stops answering: submit a keyed job, then
    claim it and complete it with the next claim. Keeps what was acknowledged (201) and the
    jobs whose completion was answered "ok"."""

    def __init__(self, cluster: LocalCluster, node: LocalNode, prefix: str) -> None:
        self.cluster, self.node, self.prefix = cluster, node, prefix
        self.acked: dict[int, dict[str, Any]] = {}
        self.ended: list[int] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        acks: list[dict[str, Any]] = []
        number = 0
        while not self.stopping.is_set():
            sent = job(f"{self.prefix}-stream-{number}", number)
            try:
                status, body, _ = api(self.cluster, self.node, "POST", "/v1/jobs", sent)
                if status != 201:
                    return
                self.acked[int(body["id"])] = sent
                status, answer, _ = claim(self.cluster, self.node, acks,
                                          f"{self.prefix}-stream-claim-{number}")
            except OSError:
                return  # the power went: what was in flight was never acknowledged
            if status != 200:
                return
            self.ended += accepted(acks, answer)
            acks = acks_for(answer["jobs"])
            number += 1

    def __enter__(self) -> Finisher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(30)


def archived_on(cluster: LocalCluster, node: LocalNode) -> set[int]:
    """The jobs of QUEUE the node's archive lists."""
    return {int(found["id"]) for found in cluster.list_jobs(node, token=ADMIN_TOKEN,
                                                            queue=QUEUE, archived="true")}


def cluster_view(cluster: LocalCluster, node: LocalNode) -> dict[str, Any]:
    status, view, _ = api(cluster, node, "GET", "/v1/cluster")
    assert status == 200, view
    return dict(view)


_HOLD = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
db.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def archive_held(node: LocalNode) -> Iterator[subprocess.Popen[str]]:
    """A process of the test's own takes the write lock of the node's archive (`BEGIN
    IMMEDIATE` on its SQLite file) and keeps it: the node's writer commits nothing, as behind
    a stalled disk. A power cut kills it with the nodes (it never writes: no checkpoint);
    killed at the end whatever happened."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(node.data_dir / "archive.sqlite")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"  # or it exited: "" after 10 s
        yield holder
    finally:
        holder.kill()
        holder.wait(10)
        for pipe in (holder.stdin, holder.stdout):
            if pipe is not None:
                pipe.close()


def snapshot_index(cluster: LocalCluster, node: LocalNode, *, waiting: bool) -> int:
    """The node's current snapshot's index; with `waiting`, also of one written and waiting
    to be made current (`snapshot.<index>.tmp`)."""
    indexes = [int(cluster_view(cluster, node)["storage"]["snapshot_index"])]
    if waiting:
        indexes += [int(path.name.split(".")[1]) for path in node.data_dir.glob("snapshot.*.tmp")]
    return max(indexes)


def cover_with_snapshots(cluster: LocalCluster, ids: list[int], held: LocalNode) -> dict[str, int]:
    """Once every member lists `ids` archived, force a compaction on each and wait until its
    snapshot covers the index it had applied (the held member's: written, waiting for its
    archive): {node: snapshot index}."""
    covered = {}
    for node in cluster.nodes:
        poll(lambda node=node: set(ids) <= archived_on(cluster, node),
             30, f"{node.node_id} lists the round's jobs archived")
        applied = int(cluster_view(cluster, node)["applied_index"])
        status, body, _ = api(cluster, node, "POST", "/v1/cluster/compact")
        assert status == 202, body
        covered[node.node_id] = poll(
            lambda node=node, applied=applied: (
                lambda index: index if index >= applied else None)(
                snapshot_index(cluster, node, waiting=node is held)),
            60, f"a snapshot of {node.node_id} at or past index {applied}")
    return covered


def test_power_loss_of_all_loses_no_finished_job_from_the_archives(
    lab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    acked: dict[int, dict[str, Any]] = {}
    ended: dict[int, str] = {}
    archived: dict[str, int] = {}
    snapshots: list[dict[str, int]] = []
    with powered_cluster(lab, "archive", "fsync") as powered:
        cluster = powered.cluster
        everyone = [node.node_id for node in cluster.nodes]
        leader = cluster.wait_ready(timeout_s=READY_DEADLINE_S)
        status, body, _ = api(cluster, leader, "PUT", "/v1/settings/retention",
                              {"succeeded": {"max_count": 0}})
        assert status == 200, body
        for round_ in range(ROUNDS):
            prefix = f"round{round_}"
            leader = cluster.wait_ready(timeout_s=READY_DEADLINE_S)
            held = cluster.followers()[round_ % 2]
            with archive_held(held) as holder:
                jobs = [job(f"{prefix}-{number}", number) for number in range(BATCH)]
                status, answer, _ = api(cluster, leader, "POST", "/v1/jobs/batch",
                                        {"jobs": jobs, "request_id": f"{prefix}-batch"})
                assert status == 201, answer
                ids = [int(got["id"]) for got in answer["jobs"]]
                acked |= dict(zip(ids, jobs, strict=True))
                # (and what the last round's stream had claimed when the power went, once its
                # lease ran out)
                finished = finish_all(cluster, leader, prefix)
                assert set(ids) <= set(finished)
                ended |= dict.fromkeys(finished, "succeeded")
                snapshots.append(cover_with_snapshots(cluster, ids, held))
                with Finisher(cluster, leader, prefix) as stream:
                    poll(lambda: len(stream.ended) >= STREAMED_BEFORE_CUT or
                         not stream.thread.is_alive(), 60,
                         "the stream completes jobs")
                    pending = cluster_view(cluster, held)["archive"]["pending_jobs"]
                    assert pending >= BATCH, f"{held.node_id} wrote its held jobs: {pending} left"
                    power_cut(powered, everyone, seed=sum(map(ord, prefix)), others=[holder])
            assert len(stream.ended) >= STREAMED_BEFORE_CUT, "the stream stopped before the cut"
            acked |= stream.acked
            ended |= dict.fromkeys(stream.ended, "succeeded")
            refused = restart(powered, everyone)
            assert not refused, failure(powered, refused, [])
            problems = every_acknowledged_job_problems(powered, acked, ended=ended)
            assert not problems, failure(powered, refused, problems)
            batches = {job_id for job_id, sent in acked.items() if "-stream-" not in sent["key"]}
            archived = {node.node_id: poll(
                lambda node=node, batches=batches: (lambda count: count if count >= len(
                    batches) else None)(len(archived_on(cluster, node) & batches)),
                15, f"{node.node_id} lists every batch's job archived") for node in cluster.nodes}
    with capsys.disabled():
        print(f"\narchive, {ROUNDS} power cuts of all 3 in fsync: {len(acked)} jobs acknowledged, "
              f"{len(ended)} completions acknowledged; archived at the end: {archived}; "
              f"snapshots covering each round's evictions: {snapshots}; cuts dropped: "
              f"{cut_summary(powered)}")
    assert archived == dict.fromkeys(everyone, ROUNDS * BATCH)  # each read back from each
