"""`raftcron storage check | repair | migrate` and `raftcron node --rejoin-empty`, as an
operator uses them: on a data dir a real node wrote, through the command line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pysyncobj import SyncObj, SyncObjConf

from raftcron.cluster.consensus import raftpatch
from raftcron.cluster.consensus.replica import StateMachine, encode_batch
from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode
from raftcron.cluster.storage.raftlog import segment_name
from raftcron.scheduler import codec
from raftcron.scheduler.commands import SubmitJobs, Tick
from raftcron.scheduler.errors import Rejected

pytestmark = pytest.mark.processes  # starts processes: make integration

REPO = Path(__file__).resolve().parents[2]


def storage_cli(*words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raftcron.cluster.commandline", "storage", *words],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def stopped_node(tmp_path: Path) -> Iterator[tuple[LocalCluster, LocalNode, list[int]]]:
    """One node that acknowledged 30 jobs and was stopped cleanly."""
    with LocalCluster(tmp_path / "c", nodes=1, raft=FAST_RAFT) as cluster:
        cluster.start()
        cluster.wait_ready(30)
        acked = [cluster.call("POST", "/v1/jobs", {"task": "t", "key": f"k{i}"})[1]["id"]
                 for i in range(30)]
        node = cluster.nodes[0]
        assert cluster.stop(node) == 0
        yield cluster, node, acked


def test_check_says_ok_for_a_cleanly_stopped_node_and_names_a_flipped_bit(
        stopped_node: tuple[LocalCluster, LocalNode, list[int]]) -> None:
    _, node, _ = stopped_node
    done = storage_cli("check", "--config", str(node.config_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK" in done.stdout and "entries 1.." in done.stdout
    segment = node.data_dir / segment_name(1)
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x01
    segment.write_bytes(bytes(data))
    done = storage_cli("check", "--config", str(node.config_path))
    assert done.returncode == 1
    assert f"DAMAGED {segment}" in done.stdout


def test_repair_cuts_a_torn_tail_that_check_reports_and_the_node_keeps_what_was_synced(
        stopped_node: tuple[LocalCluster, LocalNode, list[int]]) -> None:
    cluster, node, acked = stopped_node
    (node.data_dir / "log.clean").unlink()  # as after a crash: no clean-stop mark
    segment = node.data_dir / segment_name(1)
    with segment.open("ab") as file:  # half a batch: a write a power cut interrupted
        file.write(b"\x40\x00\x00\x00\x00\x00\x00\x00\x02RCB1")
    checked = storage_cli("check", "--config", str(node.config_path))
    assert checked.returncode == 0 and "torn tail: 13 bytes" in checked.stdout, checked.stdout
    repaired = storage_cli("repair", "--config", str(node.config_path))
    assert repaired.returncode == 0 and "13 bytes" in repaired.stdout, repaired.stdout
    assert "torn tail" not in storage_cli("check", "--config", str(node.config_path)).stdout
    cluster.start_node(node)
    cluster.wait_ready(30)
    assert all(cluster.call("GET", f"/v1/jobs/{i}")[0] == 200 for i in acked)


def test_check_refuses_a_data_dir_a_running_node_holds(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", nodes=1, raft=FAST_RAFT) as cluster:
        cluster.start()
        cluster.wait_ready(30)
        done = storage_cli("check", "--config", str(cluster.nodes[0].config_path))
        assert done.returncode == 2 and "in use by another process" in done.stderr


def _write_a_0_1_0_data_dir(data_dir: Path, jobs: int) -> None:
    """What raftcron 0.1.0 left on disk: PySyncObj's own journal, meta and gzip-pickle dump,
    written by the same state machine through PySyncObj's own storage."""
    data_dir.mkdir(parents=True)
    raftpatch.install()
    machine = StateMachine()
    conf = SyncObjConf(autoTick=False, journalFile=str(data_dir / "raft.journal"),
                       fullDumpFile=str(data_dir / "raft.dump"), useFork=False,
                       appendEntriesUseBatch=False)
    node = SyncObj("127.0.0.1:1", [], conf=conf, consumers=[machine])

    def tick_until(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline, f"the 0.1.0 node did not {what}"
            node.doTick(0.01)

    try:
        tick_until(node._isLeader, "elect itself")
        answered: list[object] = []
        commands = [Tick(now_ms=int(time.time() * 1000))] + [
            SubmitJobs.from_wire({"request_id": f"old-{number}",
                                  "jobs": [{"task": "t", "key": f"old-{number}"}]})
            for number in range(jobs)]
        for number, command in enumerate(commands):
            machine.apply(encode_batch([codec.encode(command)]),
                          callback=lambda result, error: answered.append((error, result)))
            tick_until(lambda n=number: len(answered) > n, "commit a command")
            if number == jobs // 2:
                node.forceLogCompaction()
                tick_until(lambda: (data_dir / "raft.dump").exists(), "write its dump")
        assert all(error == 0 and not isinstance(result, Rejected)
                   for error, result in answered), answered
        assert len(machine.state.table) == jobs
        assert (data_dir / "raft.dump").exists()
    finally:
        node.destroy()


def test_a_0_1_0_data_dir_is_refused_with_the_command_and_migrated_by_it(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "c", nodes=1, raft=FAST_RAFT)
    with cluster:
        node = cluster.configure()[0]
        _write_a_0_1_0_data_dir(node.data_dir, jobs=12)
        cluster.start_node(node)
        cluster.wait_for(lambda: (node.process is not None and node.process.poll() is not None)
                         or None, 30, "the node to refuse the 0.1.0 data dir")
        assert node.process is not None and node.process.returncode != 0
        assert any("raftcron storage migrate" in line for line in cluster.log_lines(node))
        migrated = storage_cli("migrate", "--config", str(node.config_path))
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        assert sorted(os.listdir(node.data_dir / "legacy-0.1.0")) == [
            "raft.dump", "raft.journal", "raft.journal.meta"]
        assert storage_cli("check", "--config", str(node.config_path)).returncode == 0
        cluster.start_node(node)
        cluster.wait_ready(30)
        keys = {job["key"] for job in cluster.list_jobs(node)}
        assert keys == {f"old-{number}" for number in range(12)}
        status, _, _ = cluster.request(node, "POST", "/v1/jobs", {"task": "t", "key": "old-3"})
        assert status == 200, "the migrated dedupe table no longer dedupes"


def test_a_node_that_lost_its_log_is_refused_and_rejoins_empty_only_when_told(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", nodes=3, raft=FAST_RAFT) as cluster:
        cluster.start()
        cluster.wait_ready(30)
        acked = [cluster.call("POST", "/v1/jobs", {"task": "t", "key": f"k{i}"})[1]["id"]
                 for i in range(20)]
        lost = next(node for node in cluster.nodes if node is not cluster.leader())
        cluster.kill(lost)
        plain = cluster.command

        def refused(flag: bool, what: str) -> list[str]:
            cluster.command = lambda node: plain(node) + (
                ["--rejoin-empty"] if flag and node is lost else [])
            cluster.start_node(lost)
            cluster.wait_for(lambda: (lost.process is not None and
                              lost.process.poll() is not None) or None, 30, what)
            assert lost.process is not None and lost.process.returncode == 65
            return cluster.log_lines(lost)

        lines = refused(True, "--rejoin-empty to refuse a data dir that still holds its log")
        assert any("still holds a log" in line for line in lines)
        for path in lost.data_dir.glob("log-*.seg"):
            path.unlink()
        lines = refused(False, "the node that lost its log to refuse to start")
        assert any("is missing" in line and "--rejoin-empty" in line for line in lines)
        cluster.command = lambda node: plain(node) + (["--rejoin-empty"] if node is lost else [])
        cluster.start_node(lost)
        cluster.wait_for(lambda: any("rejoin_caught_up" in line
                                     for line in cluster.log_lines(lost)) or None,
                         30, "the rejoining node to catch up")
        mark = (lost.data_dir / "raftcron.storage").read_text()
        assert '"rejoining": false' in mark
        digests = cluster.audit()
        assert len(set(digests.values())) == 1, digests
        assert all(cluster.request(lost, "GET", f"/v1/jobs/{i}")[0] == 200 for i in acked)
