"""`GET /metrics`: Prometheus text format, written by hand (the format is a few lines).

Counters that the replicated state keeps (jobs submitted, claimed, succeeded, ... by queue;
fires and skipped fires by schedule) are the same on every node; gauges describe this node
(Raft role, term, commit and applied index) and counters of its own (stale writes it answered,
proposals, failed proposals).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raftcron.cluster.clock.clocks import ClockBook, ClockView
from raftcron.cluster.membership.reach import ReachBook
from raftcron.cluster.ops import notifier
from raftcron.cluster.telemetry.gcpauses import GcPauses
from raftcron.cluster.telemetry.histogram import Histogram
from raftcron.scheduler import jobs as j
from raftcron.scheduler import retention
from raftcron.scheduler.flowviews import HELD_REASONS, all_queues
from raftcron.scheduler.state import SchedulerState
from raftcron.scheduler.views import queue_stats

if TYPE_CHECKING:  # only what the gauges read
    from raftcron.cluster.consensus.proposer import Proposer
    from raftcron.cluster.ops.notifier import NotifierStats
    from raftcron.cluster.storage.node import RaftStorage

RAFT_ROLES = {0: "follower", 1: "candidate", 2: "leader"}


@dataclass
class NodeStats:
    """Counters and histograms of this node (not replicated)."""

    stale_writes_rejected: int = 0
    leader_changes: int = 0
    http_requests: dict[str, int] = field(default_factory=dict)  # "method status" -> count
    fire_lateness: Histogram = field(default_factory=Histogram)  # applied on the leader - fire time
    claim_latency: Histogram = field(default_factory=Histogram)  # claim proposed -> applied here
    refusals: dict[str, int] = field(default_factory=dict)  # requests refused, by code
    # A follower's claims on rate-window queues by how the leader's stamp went
    # (cluster/http/stamps.py): stamped, failed, skipped.
    claim_stamps: dict[str, int] = field(default_factory=dict)
    clocks: ClockBook | None = None  # the peers' clocks (cluster/clock/clocks.py), set by the node
    notifier: NotifierStats | None = None  # this node's POSTs to notification receivers
    reach: ReachBook | None = None  # whom this node reaches over Raft, set by the node
    gc_pauses: GcPauses | None = None  # the process's cycle collector, set by the node

    def clock_view(self) -> ClockView | None:
        if self.clocks is None:
            return None
        return self.clocks.view(wall_ms=time.time_ns() // 1_000_000, mono_s=time.monotonic())


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.declared: set[str] = set()

    def metric(
        self, name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]
    ) -> None:
        self._declare(name, kind, help_text)
        for labels, value in samples:
            text = ",".join(f'{key}="{_escape(val)}"' for key, val in labels.items())
            rendered = repr(float(value)) if isinstance(value, float) else str(value)
            self.lines.append(f"{name}{{{text}}} {rendered}" if text else f"{name} {rendered}")

    def histogram(
        self, name: str, help_text: str, histogram: Histogram, labels: dict[str, str]
    ) -> None:
        self._declare(name, "histogram", help_text)
        for suffix, sample_labels, value in histogram.samples(labels):
            text = ",".join(f'{key}="{_escape(val)}"' for key, val in sample_labels.items())
            rendered = repr(value) if isinstance(value, float) else str(value)
            self.lines.append(f"{name}{suffix}{{{text}}} {rendered}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def _declare(self, name: str, kind: str, help_text: str) -> None:
        """HELP and TYPE once per family, before its first sample, whatever its label sets."""
        if name not in self.declared:
            self.lines.append(f"# HELP {name} {help_text}")
            self.lines.append(f"# TYPE {name} {kind}")
            self.declared.add(name)


_JOB_COUNTERS = {
    "submitted": "Jobs submitted (fires included)",
    "claimed": "Job attempts started by a claim",
    "succeeded": "Jobs that succeeded",
    "failed": "Jobs that failed for good (dead letter)",
    "retried": "Failed attempts scheduled for a retry",
    "cancelled": "Jobs cancelled",
    "lease_expired": "Attempts whose lease expired",
}


def render(
    state: SchedulerState,
    *,
    node_id: str,
    role: int,
    term: int,
    commit_index: int,
    applied_index: int,
    stats: NodeStats,
    proposer: Proposer,
    storage: RaftStorage | None = None,
    archive: dict[str, Any] | None = None,
    claims_waiting: int = 0,
) -> str:
    proposals, proposal_failures = proposer.proposals, proposer.failures
    out = Writer()
    out.metric(
        "raftcron_raft_role",
        "gauge",
        "Raft role of this node (1 for the current role)",
        [
            ({"node": node_id, "role": name}, 1 if number == role else 0)
            for number, name in RAFT_ROLES.items()
        ],
    )
    out.metric("raftcron_raft_term", "gauge", "Current Raft term", [({"node": node_id}, term)])
    out.metric(
        "raftcron_raft_commit_index",
        "gauge",
        "Raft commit index",
        [({"node": node_id}, commit_index)],
    )
    out.metric(
        "raftcron_raft_applied_index",
        "gauge",
        "Last applied log index",
        [({"node": node_id}, applied_index)],
    )
    out.metric(
        "raftcron_raft_leader_changes_total",
        "counter",
        "Leader changes seen by this node",
        [({"node": node_id}, stats.leader_changes)],
    )
    out.metric(
        "raftcron_proposals_total",
        "counter",
        "Log entries proposed by this node",
        [({"node": node_id}, proposals)],
    )
    out.metric(
        "raftcron_proposal_failures_total",
        "counter",
        "Proposals that did not commit, by reason",
        [
            ({"node": node_id, "reason": reason}, count)
            for reason, count in sorted(proposal_failures.items())
        ],
    )
    out.metric(
        "raftcron_claim_stamps_total",
        "counter",
        "Claims on rate-window queues made through this follower, by how the leader's time was "
        "asked for: stamped, failed (no Tick came back: claimed at the last Tick's time), "
        "skipped (no leader known, or within a second of a failure)",
        [({"node": node_id, "outcome": outcome}, count)
         for outcome, count in sorted(stats.claim_stamps.items())],
    )
    out.metric(
        "raftcron_claims_waiting",
        "gauge",
        "Claims long-polling this node for work (idle worker requests)",
        [({"node": node_id}, claims_waiting)],
    )
    out.metric(
        "raftcron_stale_writes_rejected_total",
        "counter",
        "Heartbeats, completions and failures refused for a stale token or a cancelled job",
        [({"node": node_id}, stats.stale_writes_rejected)],
    )
    out.metric(
        "raftcron_jobs",
        "gauge",
        "Jobs by status",
        [({"status": status}, state.table.count_by_status[status]) for status in j.STATUSES],
    )
    for counter, help_text in _JOB_COUNTERS.items():
        by_queue = state.counters.get(counter, {})
        out.metric(
            f"raftcron_jobs_{counter}_total",
            "counter",
            help_text,
            [({"queue": queue}, count) for queue, count in sorted(by_queue.items())],
        )
    stats_by_queue = queue_stats(state)
    out.metric(
        "raftcron_queue_depth",
        "gauge",
        "Queued jobs by queue (held back ones too: raftcron_queue_held_jobs says by what)",
        [({"queue": q}, s["queued"]) for q, s in stats_by_queue.items()],
    )
    out.metric(
        "raftcron_queue_running",
        "gauge",
        "Running (leased) jobs by queue",
        [({"queue": q}, s["running"]) for q, s in stats_by_queue.items()],
    )
    _flow_metrics(out, state)
    schedules = sorted(state.schedules.values(), key=lambda s: s.name)
    out.metric(
        "raftcron_schedule_fires_total",
        "counter",
        "Fire times that created work",
        [({"schedule": s.name}, s.fires) for s in schedules],
    )
    out.metric(
        "raftcron_schedule_misfires_total",
        "counter",
        "Fire times found late past the misfire grace",
        [({"schedule": s.name}, s.misfires) for s in schedules],
    )
    out.metric(
        "raftcron_schedule_skipped_total",
        "counter",
        "Fire times not fired, by reason (state_full: refused for want of room)",
        [({"schedule": s.name, "reason": "misfire"}, s.misfire_skipped) for s in schedules]
        + [({"schedule": s.name, "reason": "overlap"}, s.overlap_skipped) for s in schedules]
        + [({"schedule": s.name, "reason": "state_full"}, s.misfires_state_full)
           for s in schedules if s.misfires_state_full],
    )
    _budget_metrics(out, state, stats, node_id)
    out.metric("raftcron_state_now_seconds", "gauge", "The replicated clock (Unix time)",
               [({}, state.now_ms / 1000)])
    notifier.write_metrics(out, state, stats.notifier, node_id)
    _clock_metrics(out, stats.clock_view(), node_id)
    if stats.reach is not None:
        out.metric("raftcron_member_reachable", "gauge",
                   "1 while this node reaches the member over Raft (0: no connection to it for "
                   "longer than raft.connection_timeout_s); itself included",
                   [({"node": node_id, "member": member}, 1 if up else 0) for member, up
                    in stats.reach.reachable(time.monotonic()).items()])
    out.histogram(
        "raftcron_fire_lateness_seconds",
        "Fire applied on this (leader) node minus its fire time",
        stats.fire_lateness,
        {"node": node_id},
    )
    out.histogram(
        "raftcron_commit_latency_seconds",
        "A log entry proposed by this node until it was applied here",
        proposer.commit_latency,
        {"node": node_id},
    )
    out.histogram(
        "raftcron_commands_per_entry",
        "Client commands coalesced into one log entry proposed by this node (group commit)",
        proposer.batch_sizes,
        {"node": node_id},
    )
    out.histogram(
        "raftcron_claim_latency_seconds",
        "A claim's commit round trip through Raft",
        stats.claim_latency,
        {"node": node_id},
    )
    if stats.gc_pauses is not None:
        for generation, pauses in stats.gc_pauses.pauses.items():
            out.histogram(
                "raftcron_gc_pause_seconds",
                "Each run of this node's cycle collector, by generation: every thread of the "
                "node waits while it runs",
                pauses,
                {"node": node_id, "generation": str(generation)},
            )
    if storage is not None:
        _storage_metrics(out, storage, node_id)
    if archive is not None:
        _archive_metrics(out, archive, node_id)
    requests = sorted(stats.http_requests.items())
    out.metric(
        "raftcron_http_requests_total",
        "counter",
        "HTTP requests served, by method and status",
        [({"method": key.split()[0], "status": key.split()[1]}, n) for key, n in requests],
    )
    return out.text()


def _budget_metrics(out: Writer, state: SchedulerState, stats: NodeStats, node_id: str) -> None:
    """The state against its budget (DESIGN.md §9.1): the same on every node but refusals,
    which count the requests this node answered 507."""
    out.metric("raftcron_state_bytes", "gauge",
               "The replicated state's size in the memory model (what the budget bounds)",
               [({}, state.state_bytes())])
    out.metric("raftcron_state_part_bytes", "gauge", "raftcron_state_bytes by what fills it",
               [({"part": part}, size) for part, size in retention.parts(state).items()])
    if state.finalized:  # before the upgrade gate opens there is no budget
        out.metric("raftcron_state_budget_bytes", "gauge", "The state budget (settings)",
                   [({}, state.settings.budget.bytes)])
    out.metric("raftcron_cluster_level", "gauge",
               "The behaviour the cluster runs (2: before the upgrade gate, 3: finalized)",
               [({}, state.level)])
    out.metric("raftcron_jobs_kept", "gauge", "Finished jobs kept in the state, by outcome",
               [({"outcome": status}, state.table.count_by_status[status])
                for status in sorted(j.FINAL)])
    evicted = state.counters.get("evicted", {})
    out.metric("raftcron_evictions_total", "counter",
               "Finished jobs evicted from the state, by reason (age, count, budget)",
               [({"reason": reason}, evicted.get(reason, 0))
                for reason in ("age", "count", "budget")])
    out.metric("raftcron_refusals_total", "counter",
               "Requests this node refused for want of room (state_full, HTTP 507)",
               [({"node": node_id, "reason": reason}, stats.refusals.get(reason, 0))
                for reason in ("state_full",)])


def _flow_metrics(out: Writer, state: SchedulerState) -> None:
    """Queue limits: gauges of the replicated state, the same on every node (DESIGN.md §8.5)."""
    queues = all_queues(state)
    out.metric(
        "raftcron_queue_paused",
        "gauge",
        "1 while the queue is paused (it hands out no job)",
        [({"queue": q["name"]}, 1 if q["paused"] else 0) for q in queues],
    )
    out.metric(
        "raftcron_queue_held_jobs",
        "gauge",
        "Queued jobs a claim would not hand out now, by the first limit that stops them: "
        "paused, queue_concurrency, queue_rate, key_concurrency, key_rate",
        [
            ({"queue": q["name"], "reason": reason}, q["held"][reason])
            for q in queues
            for reason in HELD_REASONS
        ],
    )
    out.metric(
        "raftcron_queue_concurrency_max",
        "gauge",
        "A queue's cap on running jobs (queues with a cap only)",
        [({"queue": q["name"]}, q["concurrency_max"]) for q in queues
         if q["concurrency_max"] is not None],
    )
    out.metric(
        "raftcron_queue_rate_tokens",
        "gauge",
        "Jobs a queue's rate limit allows now (queues with a rate limit only)",
        [({"queue": q["name"]}, q["tokens"]) for q in queues if q["tokens"] is not None],
    )


def _clock_metrics(out: Writer, view: ClockView | None, node_id: str) -> None:
    if view is None:
        return
    if view.skew_ms is not None:
        out.metric("raftcron_clock_skew_seconds", "gauge",
                   "This node's wall clock minus the majority's (past [clock] max_skew_ms it "
                   "ticks the majority's time, not its own)",
                   [({"node": node_id}, view.skew_ms / 1000)])
    out.metric("raftcron_clock_skewed", "gauge",
               "1 while this node's clock is off from the majority's (it ticks theirs)",
               [({"node": node_id}, 1 if view.skewed else 0)])
    out.metric("raftcron_clock_offset_seconds", "gauge",
               "A member's wall clock minus this node's, as last read",
               [({"node": node_id, "member": member}, offset_ms / 1000)
                for member, offset_ms in sorted(view.offsets_ms.items())])


def _archive_metrics(out: Writer, archive: dict[str, Any], node_id: str) -> None:
    """The node's archive (cluster/archive/node.py `summary`); figures it could not read
    are left out (the writer's backlog and health are always there)."""
    labels = {"node": node_id}
    if "rows" in archive:
        out.metric("raftcron_archive_rows", "gauge",
                   "Finished jobs kept in this node's archive", [(labels, archive["rows"])])
        out.metric("raftcron_archive_bytes", "gauge",
                   "Bytes of the archive's rows as archive retention counts them",
                   [(labels, archive["row_bytes"])])
        out.metric("raftcron_archive_file_bytes", "gauge",
                   "Bytes of the archive's files on disk", [(labels, archive["file_bytes"])])
        oldest = archive["oldest_finished_ms"]
        out.metric("raftcron_archive_oldest_finished_seconds", "gauge",
                   "When the oldest archived job finished (Unix seconds; absent when empty)",
                   [] if oldest is None else [(labels, oldest / 1000)])
        out.metric("raftcron_archive_missing_jobs", "gauge",
                   "Archived jobs this node misses and fills from a peer (a snapshot installed "
                   "past their evictions)", [(labels, archive["missing_jobs"])])
    if "filled_rows" in archive:
        out.metric("raftcron_archive_filled_rows_total", "counter",
                   "Rows this node's archive took from peers since it started",
                   [(labels, archive["filled_rows"])])
    out.metric("raftcron_archive_pending_jobs", "gauge",
               "Jobs that left the state and wait for the archive's writer",
               [(labels, archive["pending_jobs"])])
    out.metric("raftcron_archive_healthy", "gauge",
               "1 while the archive can be written; 0: the storage is unhealthy",
               [(labels, 1 if archive["problem"] is None else 0)])


def _storage_metrics(out: Writer, storage: RaftStorage, node_id: str) -> None:
    labels = {"node": node_id}
    out.metric("raftcron_storage_free_bytes", "gauge",
               "Free bytes on the filesystem of the data dir", [(labels, storage.free_bytes())])
    out.metric("raftcron_storage_healthy", "gauge",
               "1 while the log can be written; 0: not acknowledging, voting or leading",
               [(labels, 1 if storage.healthy else 0)])
    out.metric("raftcron_storage_fsync_failed", "gauge",
               "1 once an fsync of the log failed: latched until the node restarts",
               [(labels, 0 if storage.fsync_failed is None else 1)])
    out.metric("raftcron_storage_log_entries", "gauge",
               "Entries in the log since the last compaction", [(labels, len(storage.log))])
    current = storage.snapshots.current
    out.metric("raftcron_storage_snapshot_index", "gauge",
               "Last log index the current snapshot covers (0: none yet)",
               [(labels, current.index if current else 0)])
    out.histogram("raftcron_storage_sync_seconds",
                  "One batch of log changes written and (durability fsync) fdatasync'ed",
                  storage.sync_latency, labels)
