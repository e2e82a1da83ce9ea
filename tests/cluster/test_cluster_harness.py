"""The harness itself (cluster/dev/localcluster.py, its processes in nodeprocesses.py): the
configs it writes are valid node configs, its checks can fail (a traceback through our code is
found, a crash is noticed), and `close` leaves no process behind, paused ones included."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from raftcron.cluster import config as configuration
from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster
from raftcron.cluster.dev.loopback import (
    RESERVATIONS,
    _ephemeral_range,
    _reserve,
    free_ports,
    release_ports,
)
from raftcron.cluster.dev.nodelogs import thread_stacks, tracebacks
from raftcron.cluster.dev.nodeprocesses import REPO_ROOT, LocalNode


def test_written_configs_load_as_node_configs_with_every_option(tmp_path: Path) -> None:
    tokens = {"admin-token-0123": "admin", "reader-token-01": "read"}
    with LocalCluster(tmp_path, tokens=tokens, raft=FAST_RAFT) as cluster:
        nodes = cluster.configure()
        loaded = [configuration.load(node.config_path) for node in nodes]

    assert [c.node_id for c in loaded] == ["n1", "n2", "n3"]
    for node, config in zip(nodes, loaded, strict=True):
        assert (config.raft_address, config.http_address) == (node.raft_address, node.http_address)
        assert config.data_dir == node.data_dir
        assert config.cluster_password == cluster.password
        assert config.tokens == tokens
        assert config.raft.election_timeout_min_s == FAST_RAFT["election_timeout_min_s"]
        assert {peer.node_id for peer in config.peers} == {"n1", "n2", "n3"} - {node.node_id}
    addresses = [a for n in nodes for a in (n.raft_address, n.http_address)]
    assert len(set(addresses)) == 6


def test_free_ports_are_reserved_until_released_and_a_dead_holder_s_are_taken_over() -> None:
    ports = free_ports(4)
    try:
        assert all((RESERVATIONS / str(port)).read_text() == str(os.getpid()) for port in ports)
        assert not any(_reserve(port) for port in ports)  # another run would skip them
    finally:
        release_ports(ports)
    assert not any((RESERVATIONS / str(port)).exists() for port in ports)
    dead = RESERVATIONS / str(ports[0])
    dead.write_text("999999999")  # no such process
    assert _reserve(ports[0])
    release_ports([ports[0]])


def test_free_ports_are_distinct_and_below_the_ephemeral_range() -> None:
    ports = free_ports(20)

    assert len(set(ports)) == 20
    assert max(ports) < _ephemeral_range()[0]


def test_thread_stacks_is_the_last_dump_whole_without_log_lines() -> None:
    first = ["Current thread 0x01 (most recent call first):", '  File "a.py", line 1 in f']
    second = [
        "Thread 0x02 (most recent call first):",
        '  File "b.py", line 2 in g',
        "",
        "Current thread 0x01 (most recent call first):",
        '  File "c.py", line 3 in h',
    ]
    log_line = '{"msg": "between"}'
    dump = thread_stacks([log_line, *first, log_line, *second, log_line])
    assert dump == "\n".join(second)
    assert thread_stacks([log_line]) == ""


def test_tracebacks_finds_ours_in_json_and_raw_logs_and_ignores_library_ones() -> None:
    ours = f'File "{REPO_ROOT}/cluster/node.py", line 3, in run'
    library = 'File "/usr/lib/python3.11/site-packages/pysyncobj/syncobj.py", line 9, in tick'
    json_line = (
        '{"level": "error", "msg": "boom", "exc": "Traceback (most recent call last):\\n  '
        + ours.replace('"', '\\"')
        + '\\nValueError: x"}'
    )
    raw = ["Traceback (most recent call last):", f"  {ours}", "    run()", "KeyError: 1"]
    foreign = ["Traceback (most recent call last):", f"  {library}", "OSError: 9"]

    found = tracebacks(["before", json_line, *raw, "after", *foreign, "end"])

    assert len(found) == 2
    assert "ValueError" in found[0] and "KeyError: 1" in found[1]
    assert len(tracebacks(foreign, ours_only=False)) == 1


@pytest.mark.processes
def test_close_kills_every_node_even_a_paused_one_and_a_crash_is_noticed(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path, raft=FAST_RAFT)
    try:
        cluster.start()
        cluster.wait_ready()
        first, second, _ = cluster.nodes
        os.kill(first.pid or 0, signal.SIGKILL)  # behind the harness's back: a crash
        cluster.wait_for(lambda: not first.running, 10, "n1 to die")
        cluster.pause(second)
        pids = [node.pid for node in cluster.nodes]

        crashed = cluster.crashed_nodes()
    finally:
        cluster.close()

    assert crashed == [first]
    for pid in pids:
        assert pid is not None and not Path(f"/proc/{pid}").exists()
    assert cluster.log_lines(second), "a node's output goes to its log file"


def test_a_node_stopped_with_sigterm_exits_0_and_catches_up_when_started_again(
    cluster: LocalCluster,
) -> None:
    follower = cluster.followers()[0]

    exit_code = cluster.stop(follower)
    status, job, _ = cluster.call("POST", "/v1/jobs", {"task": "t", "request_id": "while-down"})
    cluster.start_node(follower)
    cluster.wait_ready()

    assert exit_code == 0
    assert status == 201, job
    seen = cluster.wait_for(
        lambda: cluster.request(follower, "GET", f"/v1/jobs/{job['id']}")[0] == 200,
        10,
        "the restarted node to catch up",
    )
    assert seen


def test_a_node_dumps_its_stacks_on_sigusr1_and_logs_how_long_its_stop_took(
    cluster: LocalCluster,
) -> None:
    """What a hung stop leaves for the next engineer: SIGUSR1 writes every thread's stack to
    the node's log (the harness sends it before it kills a node that ignored SIGTERM), and a
    clean stop logs each step's time."""
    node = cluster.nodes[0]
    cluster.send_signal(node, signal.SIGUSR1)
    # faulthandler writes the dump thread by thread, the signalled (main) thread last: wait
    # for the whole of it, not for its first line (a read in between saw half a dump).
    def whole_dump() -> str | None:
        dump = thread_stacks(cluster.log_lines(node))
        return dump if "Current thread 0x" in dump and "asyncio/runners.py" in dump else None

    stacks = cluster.wait_for(whole_dump, 10,
                              "every thread's stack in the node's log, the main thread's too")
    assert node.running and 'File "' in stacks, stacks
    assert cluster.stop(node) == 0
    stopped = [line for line in cluster.log_lines(node) if '"node_stopped"' in line]
    assert len(stopped) == 1 and '"steps_s"' in stopped[0], stopped


def test_a_node_with_a_claim_long_polling_it_stops_at_once_and_answers_the_claim(
    cluster: LocalCluster,
) -> None:
    """A worker's long poll (up to 30 s) must not hold a node's stop: the claim is answered
    with no jobs and the node exits (before: the stop waited for the poll's deadline)."""
    node = cluster.nodes[0]
    answers: list[tuple[int, Any]] = []
    body = {"worker": "w-idle", "queues": ["nothing-here"], "max": 1, "lease_ms": 30_000,
            "wait_ms": 25_000}
    poll = threading.Thread(
        target=lambda: answers.append(cluster.request(node, "POST", "/v1/claims", body,
                                                      timeout_s=30)[:2]))
    poll.start()
    try:
        cluster.wait_for(lambda: _claims_waiting(cluster, node) or None, 10,
                         "the claim to be long-polling")
        began = time.monotonic()
        assert cluster.stop(node, timeout_s=20) == 0
        took_s = time.monotonic() - began
    finally:
        poll.join(30)
    assert took_s < 5, f"the stop took {took_s:.1f} s"
    assert answers == [(200, {"jobs": [], "acks": []})], answers


def _claims_waiting(cluster: LocalCluster, node: LocalNode) -> int:
    status, text, _ = cluster.request(node, "GET", "/metrics")
    assert status == 200, text
    found = re.search(r'^raftcron_claims_waiting\{node="[^"]+"\} (\d+)', str(text), re.M)
    return int(found.group(1)) if found else 0
