"""CPU time per job, by role: what each process of a local cluster spent over the soak.

The figure issue-sized work is judged by (docs/proof/benchmarks.md): user + system time from
`/proc/<pid>/stat` of the leader, each follower and each worker, and `os.times()` of the bench
itself (the load generator), read at the soak's start and end, divided by the jobs that
succeeded in between. A node that restarted, or a leader that changed, makes the roles
unreadable: then the figure says so instead of mixing them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float | None:
    """User + system seconds of a process (its threads included), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces: the fields counted after its ")".
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # utime, stime (fields 14, 15)


@dataclass(frozen=True)
class CpuReading:
    leader: str | None
    nodes: dict[str, tuple[int, float]]  # node id -> (pid, CPU seconds)
    workers: dict[int, float]  # pid -> CPU seconds
    bench_s: float

    @staticmethod
    def take(leader: str | None, nodes: dict[str, int], workers: list[int]) -> CpuReading:
        read_nodes = {node: (pid, seconds) for node, pid in nodes.items()
                      if (seconds := cpu_s(pid)) is not None}
        read_workers = {pid: seconds for pid in workers if (seconds := cpu_s(pid)) is not None}
        times = os.times()
        return CpuReading(leader, read_nodes, read_workers, times.user + times.system)


def per_job(before: CpuReading, after: CpuReading, jobs: int) -> dict[str, Any]:
    """Microseconds of CPU per succeeded job: the leader, each follower, the workers together,
    the bench, and all of them; or a note saying why the roles cannot be told apart."""
    if jobs <= 0:
        return {"note": "no job succeeded"}
    if before.leader is None or before.leader != after.leader:
        return {"note": f"the leader changed ({before.leader} -> {after.leader})"}
    restarted = [node for node, (pid, _) in before.nodes.items()
                 if after.nodes.get(node, (None, 0.0))[0] != pid]
    if restarted:
        return {"note": f"nodes restarted: {', '.join(sorted(restarted))}"}

    def spent(node: str) -> float:
        return (after.nodes[node][1] - before.nodes[node][1]) * 1e6 / jobs

    followers = {node: round(spent(node), 1) for node in sorted(before.nodes)
                 if node != before.leader}
    workers = sum(after.workers[pid] - seconds for pid, seconds in before.workers.items()
                  if pid in after.workers) * 1e6 / jobs
    bench = (after.bench_s - before.bench_s) * 1e6 / jobs
    leader = spent(before.leader)
    return {"leader": round(leader, 1), "followers": followers, "workers": round(workers, 1),
            "bench": round(bench, 1),
            "total": round(leader + sum(followers.values()) + workers + bench, 1)}


def line(figure: dict[str, Any]) -> str:
    """One line for the soak's table."""
    if "note" in figure:
        return f"CPU per job: not read ({figure['note']})"
    followers = " / ".join(f"{us:.0f}" for us in figure["followers"].values())
    return (f"CPU per job (us): leader {figure['leader']:.0f}, followers {followers}, "
            f"workers {figure['workers']:.0f}, bench {figure['bench']:.0f}; "
            f"total {figure['total']:.0f}")
