"""Every acknowledged write survives a crash in the middle of a snapshot, and a damaged data dir
either stops the node with an error naming the file or changes nothing (DESIGN.md 8.1;
research/audit-wave2.md findings 1, 3 and 4, experiments E3, E3b, E13, E1 and E5).

The tests run real `raftcron node` processes on loopback and never look inside the data dir:
they find its files by walking it and damage bytes, so they hold for any storage layout. On
0.1.0 (PySyncObj's journal and forked dump) the crash tests lose the writes acknowledged while
the snapshot was being written, and several kinds of damage leave a node empty, short or wedged.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import ClusterError, LocalNode

from .harness import (
    ADMIN_TOKEN,
    Lab,
    Process,
    api,
    children_of,
    fill,
    job_problems,
    kill_main_pid,
    poll,
    ready,
    resubmit_problems,
    submit_keyed,
    wait_gone,
)

BATCHES = 60  # x 1,000 jobs: on 2 cores 0.1.0's forked dump of them takes about 2 s
ACKED_DURING_SNAPSHOT = 20
ORPHAN_DEADLINE_S = 60  # an orphaned snapshot writer still running then is killed
READY_DEADLINE_S = 10  # a node holding 60 jobs is ready in about 2 s


# -- a crash while a snapshot is being written -----------------------------------------------


@dataclass
class Interruption:
    """A node stopped while its snapshot writer (a forked child, if any) runs, and what became
    of the writer, for the failure messages."""

    writer: Process | None
    writer_alive_at_the_stop: bool = False
    node_exit_s: float = 0.0  # after the stop began
    writer_exit_s: float = 0.0
    writer_killed_by_the_test: bool = False

    def stop(self, stop_the_node: Callable[[], object]) -> None:
        """Stop the node, then wait for its writer to exit (killing it at the deadline)."""
        writers = [] if self.writer is None else [self.writer]
        self.writer_alive_at_the_stop = any(writer.alive() for writer in writers)
        began = time.monotonic()
        stop_the_node()
        self.node_exit_s = time.monotonic() - began
        self.writer_killed_by_the_test = bool(wait_gone(writers, ORPHAN_DEADLINE_S))
        self.writer_exit_s = time.monotonic() - began

    def __str__(self) -> str:
        if self.writer is None:
            return "(the node forked no snapshot writer)"
        ending = "was killed by the test" if self.writer_killed_by_the_test else "exited itself"
        return (
            f"(snapshot writer pid {self.writer.pid}: alive when its node was stopped: "
            f"{self.writer_alive_at_the_stop}; after the stop the node exited in "
            f"{self.node_exit_s:.1f} s, the writer in {self.writer_exit_s:.1f} s and {ending})"
        )


def writes_during_a_snapshot(
    lab: Lab, cluster: LocalCluster, compacting: LocalNode, leader: LocalNode
) -> tuple[dict[int, dict[str, Any]], Interruption]:
    """Force a snapshot on `compacting`, then have `leader` acknowledge keyed jobs meanwhile."""
    interruption = Interruption(lab.start_snapshot(cluster, compacting))
    acked = submit_keyed(cluster, leader, "paid-invoice", ACKED_DURING_SNAPSHOT)
    return acked, interruption


def test_kill_of_the_main_pid_during_a_snapshot_loses_no_acknowledged_job(lab: Lab) -> None:
    cluster = lab.cluster("one")
    cluster.start()
    node = cluster.wait_ready()
    fill(cluster, BATCHES)
    acked, interruption = writes_during_a_snapshot(lab, cluster, node, node)

    interruption.stop(lambda: kill_main_pid(node))
    cluster.start_node(node)
    cluster.wait_ready(timeout_s=60)

    problems = job_problems(cluster, node, acked) + resubmit_problems(cluster, node, acked)
    assert not problems, "\n".join([*problems, str(interruption)])


def test_sigterm_to_the_whole_group_during_a_snapshot_loses_no_acknowledged_job(
    lab: Lab,
) -> None:
    cluster = lab.cluster("one")
    cluster.start()
    node = cluster.wait_ready()
    fill(cluster, BATCHES)
    acked, interruption = writes_during_a_snapshot(lab, cluster, node, node)

    # SIGTERM to its process group (the node and its writer), as systemd stops a unit
    interruption.stop(lambda: cluster.stop(node, timeout_s=20))
    cluster.start_node(node)
    cluster.wait_ready(timeout_s=60)

    problems = job_problems(cluster, node, acked) + resubmit_problems(cluster, node, acked)
    assert not problems, "\n".join([*problems, str(interruption)])


def test_three_nodes_kill_main_pid_of_a_compacting_follower_then_the_leader(lab: Lab) -> None:
    cluster = lab.cluster("three", nodes=3)
    cluster.start()
    leader = cluster.wait_ready()
    fill(cluster, BATCHES)
    compacting, stopped = (node for node in cluster.nodes if node is not leader)
    cluster.stop(stopped)
    acked, interruption = writes_during_a_snapshot(lab, cluster, compacting, leader)

    interruption.stop(lambda: kill_main_pid(compacting))
    cluster.kill(leader)
    cluster.start_node(compacting)
    cluster.start_node(stopped)
    cluster.wait_ready(timeout_s=60)
    cluster.start_node(leader)
    cluster.wait_ready(timeout_s=60)

    digests = cluster.audit(timeout_s=60)  # every node has applied all that came before
    problems = [problem for node in cluster.nodes for problem in job_problems(cluster, node, acked)]
    if len(set(digests.values())) != 1:
        problems.append(f"the replicas diverged: audit digests {digests}")
    problems += resubmit_problems(cluster, cluster.leader(), acked)
    assert not problems, "\n".join([*problems, str(interruption)])


# -- damage to the data dir ------------------------------------------------------------------


def leave_as_is(path: Path) -> None:
    pass


def delete(path: Path) -> None:
    path.unlink()


def truncate_to_half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def zero_the_first_64_bytes(path: Path) -> None:
    _write_zeros(path, 0, 64)


def flip_one_bit_in_the_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    if data:
        data[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(data))


def zero_the_300_bytes_before_the_end(path: Path) -> None:
    size = path.stat().st_size
    _write_zeros(path, max(0, size - 300), 300)


def _write_zeros(path: Path, offset: int, count: int) -> None:
    with path.open("r+b") as file:
        size = file.seek(0, os.SEEK_END)
        file.seek(offset)
        file.write(bytes(max(0, min(count, size - offset))))


DAMAGES = [
    delete,
    truncate_to_half,
    zero_the_first_64_bytes,
    flip_one_bit_in_the_middle,
    zero_the_300_bytes_before_the_end,
]


@dataclass(frozen=True)
class Pristine:
    """A stopped node's data dir with 60 acknowledged jobs: 50 in a snapshot, 10 after it."""

    data_dir: Path
    addresses: dict[str, tuple[str, str]]
    jobs: dict[int, dict[str, Any]]  # every job as GET /v1/jobs/{id} showed it before the stop

    def files(self) -> list[Path]:
        found = (path for path in self.data_dir.rglob("*") if path.is_file())
        return sorted(path.relative_to(self.data_dir) for path in found)


def snapshot_finished(node: LocalNode, quiet_s: float = 1.0) -> Callable[[], bool]:
    """A condition: the node has no child process and its data dir's file names have not
    changed for `quiet_s` (its contents keep changing: the leader logs a Tick every tick)."""
    seen: list[str] | None = None
    since = time.monotonic()

    def check() -> bool:
        nonlocal seen, since
        names = sorted(str(path) for path in node.data_dir.rglob("*"))
        if children_of(node.pid or 0) or names != seen:
            seen, since = names, time.monotonic()
            return False
        return time.monotonic() - since >= quiet_s

    return check


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pristine]:
    lab = Lab(tmp_path_factory.mktemp("pristine"))
    try:
        cluster = lab.cluster("built")
        cluster.start()
        node = cluster.wait_ready()
        # Random payloads, so that most of any file (compressed or not) is job data, and the
        # log past the snapshot is longer than the log the snapshot replaced.
        acked = submit_keyed(cluster, node, "in-the-snapshot", 50, blob_bytes=200)
        lab.start_snapshot(cluster, node)
        poll(snapshot_finished(node), 30, "the snapshot is written and the data dir settled")
        acked |= submit_keyed(cluster, node, "after-the-snapshot", 10, blob_bytes=2_000)
        jobs = {job_id: api(cluster, node, "GET", f"/v1/jobs/{job_id}")[1] for job_id in acked}
        assert cluster.stop(node) == 0, "the node did not stop cleanly"
        copy = shutil.copytree(node.data_dir, lab.base_dir / "pristine-data")
        yield Pristine(copy, {node.node_id: (node.raft_address, node.http_address)}, jobs)
    finally:
        lab.close()


def start_on_a_copy(
    lab: Lab, pristine: Pristine, name: str, damage: Callable[[Path], None], relative: Path
) -> tuple[LocalCluster, LocalNode]:
    """The pristine node (same id and addresses) started on a copy of its data dir in which
    `damage` was done to the file at `relative`."""
    cluster = lab.cluster(name, addresses=pristine.addresses)
    [node] = cluster.nodes
    shutil.copytree(pristine.data_dir, node.data_dir)
    damage(node.data_dir / relative)
    cluster.start_node(node)
    return cluster, node


def verdict(cluster: LocalCluster, node: LocalNode, damaged: str, pristine: Pristine) -> str:
    """Empty if the node refused to start naming the damaged file, or started with every
    acknowledged job intact and takes new ones; otherwise what went wrong."""
    try:
        poll(lambda: not node.running or ready(node), READY_DEADLINE_S, "exit or ready")
    except TimeoutError:
        return f"still running but not ready after {READY_DEADLINE_S} s (a zombie)"
    if not node.running:
        assert node.process is not None
        output = node.log_path.read_text(errors="replace")
        tail = output.strip().splitlines()[-1][:300]
        if node.process.returncode == 0:
            return f"exited 0; last line: {tail}"
        if not re.search(rf"(?<![\w.]){re.escape(damaged)}(?!\w|\.\w)", output):
            return f"exited {node.process.returncode} without naming {damaged}; last line: {tail}"
        return ""
    try:
        return "; ".join(state_problems(cluster, node, pristine))
    except (OSError, http.client.HTTPException, ClusterError) as error:
        return f"ready, then it stopped answering: {error!r}"


def state_problems(cluster: LocalCluster, node: LocalNode, pristine: Pristine) -> list[str]:
    """How a ready node's jobs differ from the pristine ones, and whether it takes a new one."""
    problems = job_problems(cluster, node, pristine.jobs)
    listed = len(cluster.list_jobs(node, token=ADMIN_TOKEN))
    if listed != len(pristine.jobs):
        problems.append(f"it lists {listed} jobs, not {len(pristine.jobs)}")
    status, body, _ = api(cluster, node, "POST", "/v1/jobs", {"task": "after-the-damage"})
    if status != 201:
        problems.append(f"ready, but the next submit answered {status} {body}")
    elif body["id"] in pristine.jobs:
        problems.append(f"the next submit got id {body['id']}, an acknowledged job's id")
    return problems


def test_an_undamaged_copy_of_the_data_dir_starts_with_every_acknowledged_job(
    lab: Lab, pristine: Pristine
) -> None:
    cluster, node = start_on_a_copy(lab, pristine, "undamaged", leave_as_is, Path("."))
    cluster.wait_ready(timeout_s=READY_DEADLINE_S)
    assert not job_problems(cluster, node, pristine.jobs)


@pytest.mark.parametrize("damage", DAMAGES, ids=[damage.__name__ for damage in DAMAGES])
def test_a_damaged_file_stops_the_node_naming_it_or_loses_nothing(
    lab: Lab, pristine: Pristine, damage: Callable[[Path], None]
) -> None:
    assert pristine.files(), f"no file in {pristine.data_dir}"
    failures = []
    for relative in pristine.files():
        name = f"{damage.__name__}-{'-'.join(relative.parts)}"
        cluster, node = start_on_a_copy(lab, pristine, name, damage, relative)
        try:
            problem = verdict(cluster, node, relative.name, pristine)
        finally:
            cluster.close()
        if problem:
            failures.append(f"{relative} ({damage.__name__}): {problem}")
    assert not failures, "\n".join(failures)
