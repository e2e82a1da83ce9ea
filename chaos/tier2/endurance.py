"""Endurance for tier 2 (CHAOS.md "Wave 3", soak): the mixed faults at the sustained rate for
as long as asked (`raftcron chaos run --scenario endurance --minutes 60`), while each node's
resources are sampled; chaos/tier2/checkers/slopes.py judges whether they level off.

What it owns:

- `Sampler`: a thread that every `every_s` (`CHAOS_SAMPLE_EVERY_S`, 60 s by default) records
  one `resource` event per running node, read from its main PID (the snapshot writer lives a
  second or two and is not sampled): `rss_bytes` (VmRSS) with its parts `rss_anon_bytes` (the
  heaps: Python's objects, malloc's arenas, stacks) and `rss_file_bytes` (mapped code and
  files, which the kernel may drop and read again), `threads` (/proc/PID/status),
  `fds` (entries of /proc/PID/fd), `log_bytes` (the data dir's `log-*.seg` files) and
  `log_entries` (the live entries of its Raft log, from its /metrics) and `state_bytes` (the
  replicated state's size in its memory model, the same on every node), with
  `pid` (a restart starts a new series) and `paused`; one `state_size` event (the replicated
  state's bytes by part, from GET /v1/settings); and one `sampler` event first, with the
  interval and the warm-up the checker applies (`CHAOS_WARMUP_MIN_S`, 120 s by default);
- `plan_endurance`: plan_mixed's faults (partitions, pauses of nodes and workers, worker
  kills and cuts) one at a time until the deadline, except that node kills are spaced: one
  node at a time, in turn, `KILLS_PER_RUN` times in the run, so every node keeps a process
  long enough for its series to say something (a node killed every minute never shows a
  leak). The workload (chaos/tier2/clientload.py and workload.py) submits and runs jobs all
  along; the scenario's small retention bounds the jobs kept within the warm-up. The rest of
  the state grows by design under a sustained load: each request id is kept an hour and each
  idempotency key a day (scheduler/limits.py), about 5 KB a second here; the budget is set
  above what an hour of that takes, so nothing is refused, and the checker judges each node's
  memory beyond its state.

It must not judge, and every wait is bounded.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raftcron.chaos.tier2.history import History
from raftcron.chaos.tier2.nemesis import ADMIN, CHAOS_RAFT, ChaosCluster
from raftcron.chaos.tier2.plans import READY_TIMEOUT_S, WORKERS, _partition_once, _pause_once
from raftcron.cluster.dev.nodeprocesses import LocalNode

if TYPE_CHECKING:
    from raftcron.chaos.tier2.context import Context

SAMPLE_EVERY_S_DEFAULT = 60.0
WARMUP_MIN_S_DEFAULT = 120.0
KILLS_PER_RUN = 3  # at a quarter, half and three quarters of the run, each a different node
# Snapshots every minute (the defaults: 100,000 entries or 10 minutes): the log on disk is a
# sawtooth whose period must be well under the judged half of a run, or its slope says more
# about where the sampling fell on it than about a leak.
ENDURANCE_RAFT: dict[str, object] = {**CHAOS_RAFT, "compaction_min_entries": 20_000,
                                     "compaction_min_time_s": 60.0}
PARTITIONS = ["isolate_leader", "isolate_one", "one_way", "ring", "cut_pair", "worker_cut"]


def _setting(name: str, default: float) -> float:
    value = os.environ.get(name)
    return default if not value else float(value)


def read_process(pid: int) -> dict[str, int] | None:
    """VmRSS (bytes) and its anonymous and file-backed parts, Threads and open descriptors of
    a process; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if "VmRSS" not in fields or fields.get("State", "").strip().startswith("Z"):
        return None  # killed and not reaped yet: no memory, no descriptors, not a sample

    def kib(name: str) -> int:
        return int(fields.get(name, "0 kB").split()[0]) * 1024

    return {"rss_bytes": kib("VmRSS"), "rss_anon_bytes": kib("RssAnon"),
            "rss_file_bytes": kib("RssFile"), "threads": int(fields.get("Threads", "0")),
            "fds": fds}


def log_bytes(data_dir: Path) -> int:
    total = 0
    for segment in data_dir.glob("log-*.seg"):
        with contextlib.suppress(FileNotFoundError):  # compaction deletes them meanwhile
            total += segment.stat().st_size
    return total


class Sampler:
    """Samples every node's main process every `every_s` into the history, in a thread."""

    def __init__(self, cluster: ChaosCluster, history: History, *, every_s: float,
                 warmup_min_s: float) -> None:
        self.cluster = cluster
        self.history = history
        self.every_s = every_s
        self.warmup_min_s = warmup_min_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.history.record("sampler", every_s=self.every_s, warmup_min_s=self.warmup_min_s)
        self._thread = threading.Thread(target=self._loop, name="chaos-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def sample(self) -> None:
        state_bytes = self._state()
        for node in list(self.cluster.nodes):
            pid = node.pid
            if pid is None or not node.running:
                continue
            figures = read_process(pid)
            if figures is None:
                continue
            self.history.record("resource", node=node.node_id, pid=pid, paused=node.paused,
                                log_bytes=log_bytes(node.data_dir),
                                log_entries=self._log_entries(node), state_bytes=state_bytes,
                                **figures)

    def _log_entries(self, node: LocalNode) -> int | None:
        """The node's live Raft log entries (/metrics), which compaction bounds: its log on
        disk only shrinks by whole 64 MiB segments, so that alone can grow for hours."""
        if node.paused:
            return None
        try:
            status, text, _ = self.cluster.request(node, "GET", "/metrics", token=ADMIN,
                                                   timeout_s=2)
        except (OSError, http.client.HTTPException):
            return None
        for line in str(text).splitlines() if status == 200 else []:
            if line.startswith("raftcron_storage_log_entries"):
                return int(float(line.rsplit(" ", 1)[1]))
        return None

    def _state(self) -> int | None:
        """The replicated state's size by part (`state_size`): what every node's memory holds
        for it, beside its own; its bytes (None without an answer now)."""
        with contextlib.suppress(Exception):  # a cluster without a leader now: next time
            status, body, _ = self.cluster.call("GET", "/v1/settings", token=ADMIN,
                                                timeout_s=5)
            usage = body.get("usage") if status == 200 and isinstance(body, dict) else None
            if isinstance(usage, dict):
                self.history.record("state_size", state_bytes=usage.get("state_bytes"),
                                    budget_bytes=usage.get("budget_bytes"),
                                    parts=usage.get("parts"), kept=usage.get("kept"),
                                    evicted=usage.get("evicted"))
                return int(usage["state_bytes"])
        return None

    def _loop(self) -> None:
        while True:
            try:
                self.sample()
            except Exception as error:  # a sampler bug must show, never stop the run
                self.history.record("note", text=f"sampler failed: {error!r}")
            if self._stop.wait(self.every_s):
                return


def sampler_for(ctx: Context) -> Sampler:
    return Sampler(ctx.cluster, ctx.history,
                   every_s=_setting("CHAOS_SAMPLE_EVERY_S", SAMPLE_EVERY_S_DEFAULT),
                   warmup_min_s=_setting("CHAOS_WARMUP_MIN_S", WARMUP_MIN_S_DEFAULT))


def _kill_in_turn(ctx: Context, node_id: str) -> None:
    nemesis, rng = ctx.nemesis, ctx.rng
    fault = nemesis.kill([node_id])
    ctx.hold(rng.uniform(1.0, 5.0))
    nemesis.restart(fault, [node_id])


def _worker_fault(ctx: Context) -> None:
    nemesis, rng = ctx.nemesis, ctx.rng
    worker = ctx.workers.busy_worker(rng) or rng.choice(WORKERS)
    fault = nemesis.kill_worker(worker)
    ctx.hold(rng.uniform(1.0, 3.0))
    nemesis.restart_worker(fault, worker)


def plan_endurance(ctx: Context) -> None:
    """plan_mixed's faults until the deadline, node kills spaced (see the module docstring),
    the sampler running throughout."""
    sampler = sampler_for(ctx)
    sampler.start()
    try:
        kills: list[tuple[float, str]] = []
        order = ctx.rng.sample(ctx.node_ids(), len(ctx.node_ids()))
        for number in range(1, KILLS_PER_RUN + 1):  # seconds left when each kill is due
            kills.append((ctx.duration_s * (1 - number / (KILLS_PER_RUN + 1)),
                          order[(number - 1) % len(order)]))
        while ctx.left_s() > 10:
            if kills and ctx.left_s() <= kills[0][0]:
                _kill_in_turn(ctx, kills.pop(0)[1])
            else:
                roll = ctx.rng.random()
                if roll < 0.55:
                    _partition_once(ctx, ctx.rng.choice(PARTITIONS))
                elif roll < 0.65:
                    _worker_fault(ctx)
                else:
                    _pause_once(ctx)
            ctx.wait_ready(READY_TIMEOUT_S)
            ctx.hold(ctx.rng.uniform(1.0, 2.5))
    finally:
        sampler.sample()  # the last point at the end of the faults
        sampler.stop()


def endurance_settings(budget_bytes: int, kept: int) -> dict[str, Any]:
    """The endurance scenario's [settings]: a small retention, which the jobs kept reach
    within the warm-up and are then held at, and a budget above what the request ids and
    idempotency keys of the run take (they grow all run: the module's docstring)."""
    return {"budget": {"bytes": budget_bytes},
            "retention": {"succeeded": {"max_count": kept}, "failed": {"max_count": kept},
                          "cancelled": {"max_count": kept}}}
