"""CPU per job by role (cluster/dev/bench/cpu.py): read from /proc, divided by the jobs, and
refused as a figure when the roles moved (a leader change, a restart) rather than mixed."""

from __future__ import annotations

import os
import time

from raftcron.cluster.dev.bench import cpu


def test_a_process_cpu_time_is_read_from_proc_and_grows_as_it_works() -> None:
    before = cpu.cpu_s(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # bounded: 0.2 s of this process's CPU
        pass
    after = cpu.cpu_s(os.getpid())
    assert before is not None and after is not None and after - before >= 0.1
    assert cpu.cpu_s(2**22 + 7) is None  # above the kernel's pid_max: no such process


def reading(leader: str | None, n1: float, n2: float, n3: float, worker: float,
            pids: tuple[int, int, int] = (11, 12, 13)) -> cpu.CpuReading:
    return cpu.CpuReading(leader, {"n1": (pids[0], n1), "n2": (pids[1], n2), "n3": (pids[2], n3)},
                       {99: worker}, bench_s=0.0)


def test_per_job_splits_leader_followers_workers() -> None:
    figure = cpu.per_job(reading("n2", 1, 1, 1, 1), reading("n2", 1.5, 2.0, 1.25, 1.75), 10_000)
    assert figure == {"leader": 100.0, "followers": {"n1": 50.0, "n3": 25.0}, "workers": 75.0,
                      "bench": 0.0, "total": 250.0}
    assert cpu.line(figure).startswith("CPU per job (us): leader 100, followers 50 / 25")


def test_a_leader_change_or_a_restart_makes_no_figure() -> None:
    moved = cpu.per_job(reading("n1", 1, 1, 1, 1), reading("n2", 2, 2, 2, 2), 10)
    assert moved == {"note": "the leader changed (n1 -> n2)"}
    restarted = cpu.per_job(reading("n1", 1, 1, 1, 1),
                            reading("n1", 2, 2, 2, 2, pids=(11, 12, 14)), 10)
    assert restarted == {"note": "nodes restarted: n3"}
    assert cpu.per_job(reading("n1", 1, 1, 1, 1), reading("n1", 2, 2, 2, 2), 0) == {
        "note": "no job succeeded"}
    assert cpu.line(moved) == "CPU per job: not read (the leader changed (n1 -> n2))"
