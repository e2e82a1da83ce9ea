"""The simulation harness itself: fake time covers every clock read in pysyncobj, links are
FIFO unless a fault says otherwise, a seed replays the same trace (whatever the hash seed),
and the checkers fail on histories that are wrong."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pysyncobj
import pysyncobj.syncobj
import pytest

from raftcron.chaos.sim.checks import check_replicas
from raftcron.chaos.sim.clock import CLOCK_USERS, RANDOM_USERS, FakeClock
from raftcron.chaos.sim.cluster import SimCluster
from raftcron.chaos.sim.machines import KeyLog
from raftcron.chaos.sim.network import LinkFaults, SimNetwork
from raftcron.chaos.sim.randomized import run_seed

PYSYNCOBJ_DIR = pathlib.Path(pysyncobj.__file__).parent
REPO = pathlib.Path(__file__).resolve().parents[2]


def modules_matching(pattern: str) -> set[str]:
    return {f"pysyncobj.{path.stem}" for path in sorted(PYSYNCOBJ_DIR.glob("*.py"))
            if re.search(pattern, path.read_text(), re.MULTILINE)}


def test_every_pysyncobj_clock_reader_is_on_the_fake_clock() -> None:
    assert modules_matching(r"^from \.monotonic import monotonic as monotonicTime") == set(
        CLOCK_USERS)


def test_every_pysyncobj_random_user_draws_from_the_seed() -> None:
    assert modules_matching(r"^import random") == set(RANDOM_USERS)


def test_only_unused_modules_read_the_wall_clock() -> None:
    # monotonic is the implementation the fake clock replaces; batteries (ReplLockManager)
    # and utility (the admin client) are not used by a node.
    assert modules_matching(r"time\.time\(") == {
        "pysyncobj.monotonic", "pysyncobj.batteries", "pysyncobj.utility"}


class Inbox:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    def deliver(self, src: str, message: Any) -> None:
        self.messages.append((src, message))

    def peer_connected(self, peer: str) -> None:
        pass

    def peer_disconnected(self, peer: str) -> None:
        pass


def network_with_inbox(faults: LinkFaults | None = None) -> tuple[FakeClock, SimNetwork, Inbox]:
    clock = FakeClock()
    network = SimNetwork(clock, seed=1, faults=faults)
    inbox = Inbox()
    network.transports["a"] = Inbox()  # type: ignore[assignment]
    network.transports["b"] = inbox  # type: ignore[assignment]
    return clock, network, inbox


def drain(clock: FakeClock, network: SimNetwork, seconds: float = 1.0) -> None:
    clock.advance(seconds)
    network.deliver_due()


def test_a_link_is_fifo_by_default_even_with_random_delays() -> None:
    clock, network, inbox = network_with_inbox(LinkFaults(delay_min_s=0.001, delay_max_s=0.5))
    for n in range(50):
        network.send("a", "b", n)
        clock.advance(0.001)
    drain(clock, network)
    assert [message for _, message in inbox.messages] == list(range(50))


def test_duplicates_and_spikes_arrive_and_may_reorder() -> None:
    clock, network, inbox = network_with_inbox(LinkFaults(duplicate_p=0.5, spike_p=0.3))
    for n in range(200):
        network.send("a", "b", n)
    drain(clock, network)
    received = [message for _, message in inbox.messages]
    assert sorted(set(received)) == list(range(200))
    assert len(received) > 200
    assert received != sorted(received)


def test_a_cut_drops_what_is_in_flight_and_a_pause_keeps_order() -> None:
    clock, network, inbox = network_with_inbox()
    network.send("a", "b", "lost")
    network.cut("a", "b")
    network.send("a", "b", "lost too")
    drain(clock, network)
    network.heal()
    network.pause("a", "b")
    for message in ("one", "two", "three"):
        network.send("a", "b", message)
    drain(clock, network)
    assert inbox.messages == []
    assert network.deliver_head("a", "b") == "one"
    network.resume("a", "b")
    drain(clock, network)
    assert [message for _, message in inbox.messages] == ["one", "two", "three"]


def test_a_crash_loses_messages_in_flight_and_a_restart_keeps_the_journal() -> None:
    machine = KeyLog()
    with SimCluster(["n1", "n2", "n3"], machine.build, seed="restart") as cluster:
        leader = cluster.wait_leader(5.0)
        proposal = cluster.propose(leader, "kept", lambda node, callback:
                                   machine.propose(node, "kept", b"x", callback))
        cluster.wait_for(lambda: proposal.acknowledged, 2.0, "the write")
        follower = next(node_id for node_id in cluster.node_ids if node_id != leader)
        cluster.wait_for(lambda: "kept" in machine.applied_keys(cluster.nodes[follower]), 2.0,
                         "the follower applied it")
        cluster.crash(follower)
        assert cluster.network.pending(leader, follower) == []
        cluster.run_for(0.5)
        restarted = cluster.restart(follower)
        cluster.wait_for(lambda: "kept" in machine.applied_keys(restarted), 3.0,
                         "the journal replayed")


def test_the_same_seed_gives_the_same_trace() -> None:
    first, second = run_seed(7), run_seed(7)
    assert first == second
    assert first.digest == second.digest
    assert run_seed(8).digest != first.digest


@pytest.mark.processes
def test_the_trace_does_not_depend_on_the_hash_seed() -> None:
    # pysyncobj iterates sets of nodes; str hashes change per process with PYTHONHASHSEED.
    program = "from raftcron.chaos.sim.randomized import run_seed; print(run_seed(7).digest)"
    digests = set()
    for hash_seed in ("1", "2"):
        environment = {**os.environ, "PYTHONHASHSEED": hash_seed}
        completed = subprocess.run([sys.executable, "-c", program], cwd=REPO, env=environment,
                                   capture_output=True, text=True, check=True, timeout=120)
        digests.add(completed.stdout.strip())
    assert digests == {run_seed(7).digest}


def replicas(**keys: list[str]) -> dict[str, Any]:
    return {node_id: SimpleNamespace(keys=applied) for node_id, applied in keys.items()}


def test_the_checker_reports_an_acknowledged_key_no_replica_holds() -> None:
    report = check_replicas(["a", "b"], replicas(n1=["a"], n2=["a"]), KeyLog())
    assert report.lost == ["b"] and report.lost_everywhere == ["b"] and not report.ok


def test_the_checker_reports_a_forked_history() -> None:
    report = check_replicas(["a"], replicas(n1=["a", "x", "b"], n2=["a", "b"]), KeyLog())
    assert report.divergent and report.lost == [] and not report.ok


def test_the_checker_accepts_a_lagging_replica_as_not_yet_converged_but_not_forked() -> None:
    report = check_replicas(["a", "b"], replicas(n1=["a", "b"], n2=["a"]), KeyLog(),
                            converged=False)
    assert not report.divergent and report.lost_everywhere == [] and not report.ok


@pytest.mark.parametrize("keys", [["a", "b"], ["b", "a"]])
def test_the_checker_passes_identical_replicas(keys: list[str]) -> None:
    assert check_replicas(["a", "b"], replicas(n1=keys, n2=list(keys)), KeyLog()).ok


def test_a_node_that_fails_to_build_leaves_pysyncobj_unpatched() -> None:
    def broken(spec: Any) -> Any:
        raise RuntimeError("cannot build")

    real_clock = pysyncobj.syncobj.monotonicTime
    with pytest.raises(RuntimeError, match="cannot build"), SimCluster(["n1"], broken, seed=0):
        pass
    assert pysyncobj.syncobj.monotonicTime is real_clock
    with SimCluster(["n1"], KeyLog().build, seed=0) as cluster:  # the next one still works
        cluster.wait_for(lambda: cluster.leader() == "n1", 5.0, "a single-node leader")
