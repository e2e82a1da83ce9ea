"""The soak's readings and its per-minute records: what the cluster said, minute by minute.

What it owns: one reading of the cluster (every node's `/metrics`, the node processes' RSS when
the bench started them, the bench's own counts of submits), the record made of two readings
(figures so far and rates over the interval between them), and the table the records print
as. Figures of the replicated state (jobs succeeded, backlog, state bytes, kept, evictions) are
read from the leader's page; figures of each node (refusals, claim latency, slow log syncs) are
summed over the nodes. It starts nothing and judges nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from raftcron.cluster.dev.bench import cpu, scrape
from raftcron.cluster.dev.bench.scale import rss_mb
from raftcron.cluster.dev.bench.target import BenchTarget

OUTCOMES = ("succeeded", "failed", "cancelled")
EVICTION_REASONS = ("age", "count", "budget")
CLAIM_LATENCY_SOURCE = (
    "raftcron_claim_latency_seconds: deltas of every node's histogram over the interval "
    "(a claim's commit round trip, its long-poll wait excluded), interpolated within buckets"
)
# A log sync longer than this (a bucket bound of raftcron_storage_sync_seconds, just past the
# default minimum election timeout of 0.4 s) held its node's Raft thread long enough for an
# election: a leader syncs before it counts itself, sending no heartbeats meanwhile, and one
# whose syncs take that long 3 times in 5 s hands leadership over (DESIGN.md §9.3). A soak's
# change of leader with no fault injected is read beside this count.
SLOW_SYNC_S = 0.5


@dataclass(frozen=True)
class ProducerCounts:
    """What the bench's own producers counted, at one moment."""

    submitted: int = 0  # jobs accepted (201)
    refused: int = 0  # submit requests answered 507 state_full
    refused_jobs: int = 0  # jobs in those requests


@dataclass(frozen=True)
class Reading:
    at_s: float  # time.monotonic()
    counts: ProducerCounts
    succeeded: float  # the soak queue's raftcron_jobs_succeeded_total
    backlog: float  # every queue's raftcron_queue_depth
    running: float  # every queue's raftcron_queue_running
    state_bytes: float
    budget_bytes: float | None  # None before the cluster is finalized
    parts: dict[str, float]  # raftcron_state_part_bytes
    kept: dict[str, float]
    evicted: dict[str, float]
    refusals: dict[str, float]  # raftcron_refusals_total by node url
    claims: dict[str, dict[float, float]]  # claim latency buckets by node url
    syncs: dict[str, dict[float, float]]  # log sync latency buckets by node url
    leader: str | None  # the node that said it leads (its id, or its url with --connect)
    rss_mb: dict[str, float] | None = field(default=None)  # by node id, local cluster only


async def pages(target: BenchTarget) -> dict[str, str]:
    """Every node's `/metrics` text, by url (a node that did not answer is left out)."""

    async def page(url: str) -> str | None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with target.session.get(url + "/metrics") as answer:
                if answer.status == 200:
                    return await answer.text()
        return None

    texts = await asyncio.gather(*(page(url) for url in target.urls))
    return {url: text for url, text in zip(target.urls, texts, strict=True) if text is not None}


def leader_url(texts: dict[str, str]) -> str | None:
    """The url of the node whose page says it leads (None: no page says so)."""
    for url, text in texts.items():
        if scrape.sample(text, "raftcron_raft_role", 'role="leader"') == 1:
            return url
    return None


def leader_page(texts: dict[str, str]) -> str:
    """The page of the node that says it leads; else the one that applied most."""
    url = leader_url(texts)
    if url is not None:
        return texts[url]
    return max(texts.values(), key=lambda t: scrape.sample(t, "raftcron_raft_applied_index"))


async def read(target: BenchTarget, queue: str, counts: ProducerCounts) -> Reading:
    texts = await pages(target)
    if not texts:
        raise RuntimeError("no node answered GET /metrics")
    main = leader_page(texts)
    has_budget = "\nraftcron_state_budget_bytes " in main  # only once finalized
    cluster = target.cluster
    return Reading(
        at_s=time.monotonic(),
        counts=counts,
        succeeded=scrape.sample(main, "raftcron_jobs_succeeded_total", f'queue="{queue}"'),
        backlog=scrape.total(main, "raftcron_queue_depth"),
        running=scrape.total(main, "raftcron_queue_running"),
        state_bytes=scrape.sample(main, "raftcron_state_bytes"),
        budget_bytes=scrape.sample(main, "raftcron_state_budget_bytes") if has_budget else None,
        parts=scrape.by_label(main, "raftcron_state_part_bytes", "part"),
        kept=scrape.by_label(main, "raftcron_jobs_kept", "outcome"),
        evicted=scrape.by_label(main, "raftcron_evictions_total", "reason"),
        refusals={url: scrape.total(text, "raftcron_refusals_total", 'reason="state_full"')
                  for url, text in texts.items()},
        claims={url: scrape.buckets(text, "raftcron_claim_latency_seconds")
                for url, text in texts.items()},
        syncs={url: scrape.buckets(text, "raftcron_storage_sync_seconds")
               for url, text in texts.items()},
        leader=_node_name(target, leader_url(texts)),
        rss_mb=None if cluster is None else {
            node.node_id: round(rss_mb(node.pid), 1)
            for node in cluster.nodes if node.pid is not None and node.running
        },
    )


def _node_name(target: BenchTarget, url: str | None) -> str | None:
    """A node's id when the bench started the cluster, else its url."""
    if url is None or target.cluster is None:
        return url
    return next((node.node_id for node in target.cluster.nodes if node.url == url), url)


def record(first: Reading, before: Reading, now: Reading,
           known_leader: str | None = None) -> dict[str, Any]:
    """The figures at `now`: totals since `first` (the soak's start), rates and claim latency
    over the interval since `before` (the previous record). The leader changed when `now`
    names one other than `known_leader`, the last one a reading named (default: `before`'s):
    a reading in the middle of an election names none, and says nothing of a change."""
    known = before.leader if known_leader is None else known_leader
    interval_s = max(now.at_s - before.at_s, 1e-9)
    claims = _bucket_deltas(before.claims, now.claims)
    syncs = _bucket_deltas(before.syncs, now.syncs)
    p50, p99 = scrape.quantile(claims, 0.5), scrape.quantile(claims, 0.99)
    return {
        "minute": round((now.at_s - first.at_s) / 60, 2),
        "submitted": now.counts.submitted - first.counts.submitted,
        "succeeded": int(now.succeeded - first.succeeded),
        "submit_per_s": round((now.counts.submitted - before.counts.submitted) / interval_s),
        "succeeded_per_s": round((now.succeeded - before.succeeded) / interval_s),
        "backlog": int(now.backlog),
        "running": int(now.running),
        "state_bytes": int(now.state_bytes),
        "budget_bytes": None if now.budget_bytes is None else int(now.budget_bytes),
        "state_part_bytes": {part: int(size) for part, size in now.parts.items()},
        "kept": {outcome: int(now.kept.get(outcome, 0)) for outcome in OUTCOMES},
        "evicted": {
            reason: int(now.evicted.get(reason, 0) - first.evicted.get(reason, 0))
            for reason in EVICTION_REASONS
        },
        "refused": now.counts.refused - first.counts.refused,
        "refused_jobs": now.counts.refused_jobs - first.counts.refused_jobs,
        "refusals_counted": int(sum(
            now.refusals[url] - first.refusals[url] for url in now.refusals if url in first.refusals
        )),
        "claims": int(claims.get(max(claims), 0)) if claims else 0,
        "claim_p50_ms": None if p50 is None else round(p50 * 1000, 2),
        "claim_p99_ms": None if p99 is None else round(p99 * 1000, 2),
        "slow_syncs": int(syncs.get(math.inf, 0) - syncs.get(SLOW_SYNC_S, 0)) if syncs else 0,
        "leader": now.leader,
        "leader_changed": known is not None and now.leader is not None and now.leader != known,
        "rss_mb": now.rss_mb,
    }


def _bucket_deltas(before: dict[str, dict[float, float]],
                   now: dict[str, dict[float, float]]) -> dict[float, float]:
    """A histogram's bucket counts observed between two readings (by node url), summed over
    the nodes in both (a node restarted meanwhile starts again from zero: its negative deltas
    count as none)."""
    deltas: dict[float, float] = {}
    for url, buckets in now.items():
        earlier = before.get(url)
        if earlier is None:
            continue
        for bound, count in buckets.items():
            deltas[bound] = deltas.get(bound, 0.0) + max(0.0, count - earlier.get(bound, 0.0))
    return deltas


# -- the table ----------------------------------------------------------------------------

COLUMNS = (
    ("min", 5), ("submitted", 11), ("succeeded", 11), ("sub/s", 7), ("done/s", 7),
    ("backlog", 9), ("state MB", 9), ("budget", 7), ("kept", 10), ("evicted a/c/b", 17),
    ("refused", 8), ("claim p50/p99 ms", 17), (f"syncs>{SLOW_SYNC_S:g}s", 10), ("RSS MB", 0),
)


def header() -> str:
    return " ".join(f"{name:>{width}}" if width else name for name, width in COLUMNS)


def line(rec: dict[str, Any]) -> str:
    budget = rec["budget_bytes"]
    share = f"{rec['state_bytes'] / budget:.0%}" if budget else "-"
    evicted = "/".join(f"{rec['evicted'][reason]:,}" for reason in EVICTION_REASONS)
    p50, p99 = rec["claim_p50_ms"], rec["claim_p99_ms"]
    claim = "-" if p50 is None else f"{p50:.1f}/{p99:.1f}"
    rss = "/".join(f"{mb:.0f}" for mb in rec["rss_mb"].values()) if rec["rss_mb"] else "-"
    cells = (
        f"{rec['minute']:.2f}", f"{rec['submitted']:,}", f"{rec['succeeded']:,}",
        f"{rec['submit_per_s']:,}", f"{rec['succeeded_per_s']:,}", f"{rec['backlog']:,}",
        f"{rec['state_bytes'] / 2**20:,.1f}", share, f"{sum(rec['kept'].values()):,}", evicted,
        f"{rec['refused']:,}", claim, f"{rec['slow_syncs']:,}", rss,
    )
    return " ".join(
        f"{cell:>{width}}" if width else cell
        for cell, (_, width) in zip(cells, COLUMNS, strict=True)
    )


# "Flat": a backlog that grows by at most this share of what is submitted. A ramp's window
# judges its growth per second against the rate; a hold, its backlog at the end against all it
# submitted (the same share, over the whole hold).
FLAT_SHARE = 0.05


def kept_up(figures: dict[str, Any]) -> bool | None:
    """Whether a steady soak's held rate ran as fast as it was submitted (None: a flood, which
    outruns the workers on purpose). A ramp's window is short: a rate it calls flat can still
    fall behind over minutes, and the hold is where that shows."""
    if figures["soak_mode"] != "steady":
        return None
    backlog: int = figures["soak_backlog_at_end"]
    submitted: int = figures["soak_submitted"]
    return backlog <= FLAT_SHARE * submitted


def verdict(figures: dict[str, Any]) -> str | None:
    held = kept_up(figures)
    if held is None:
        return None
    backlog = figures["soak_backlog_at_end"]
    share = backlog / max(1, figures["soak_submitted"])
    if held:
        return f"kept up: a backlog of {backlog:,} at the end ({share:.1%} of the submitted)"
    return (f"NOT kept up: a backlog of {backlog:,} at the end ({share:.1%} of the submitted, "
            f"more than {FLAT_SHARE:.0%}); {figures['soak_succeeded_per_s']:,}/s ran of "
            f"{figures['soak_submit_per_s']:,}/s submitted")


def _leader_line(rec: dict[str, Any]) -> str | None:
    """What a record says of the leader, when it says something: a change, or none known
    (a reading in the middle of an election)."""
    if rec.get("leader_changed"):
        return f"the leader changed before minute {rec['minute']:.2f} (now {rec['leader']})"
    if "leader" in rec and rec["leader"] is None:
        return f"no leader at minute {rec['minute']:.2f}"
    return None


def table(figures: dict[str, Any]) -> str:
    """The soak's figures as a compact table: how the rate was chosen, one line per record,
    the end figures."""
    workers = figures["soak_workers"]
    lines = [f"soak ({figures['soak_mode']}), {workers} worker{'s' if workers != 1 else ''} x "
             f"{figures['soak_concurrency']} slots, {figures['soak_minutes']:g} min"]
    for window in figures.get("soak_ramp") or []:
        lines.append(
            f"  ramp {window['rate_per_s']:>7,}/s: submitted {window['submit_per_s']:,}/s, "
            f"succeeded {window['succeeded_per_s']:,}/s, backlog "
            f"{window['backlog_growth_per_s']:+,}/s -> {'flat' if window['flat'] else 'grows'}"
        )
    if figures.get("soak_rate_held_per_s"):
        found = figures.get("soak_rate_found_per_s")
        lines.append(f"  rate found {found:,}/s, held {figures['soak_rate_held_per_s']:,}/s"
                     if found else f"  rate held {figures['soak_rate_held_per_s']:,}/s")
    lines += [header(), *(line(rec) for rec in figures["soak_records"])]
    lines += [said for rec in figures["soak_records"] if (said := _leader_line(rec))]
    lines.append(
        f"in {figures['soak_elapsed_s']} s: {figures['soak_submitted']:,} submitted "
        f"({figures['soak_submit_per_s']:,}/s), {figures['soak_succeeded']:,} succeeded "
        f"({figures['soak_succeeded_per_s']:,}/s), {figures['soak_refused']:,} submits refused "
        f"state_full ({figures['soak_refused_jobs']:,} jobs)"
        + (f", RSS at most {rss} MB" if (rss := figures["soak_rss_mb_max"]) else "")
    )
    if (said := verdict(figures)) is not None:
        lines.append(f"the held rate {said}")
    if figures.get("soak_cpu_us_per_job"):
        lines.append(cpu.line(figures["soak_cpu_us_per_job"]))
    if figures.get("soak_worker_warnings"):
        counts = ", ".join(f"{k}: {n:,}" for k, n in figures["soak_worker_warnings"].items())
        lines.append(f"worker log lines: {counts}")
    lines.append(f"claim latency from {figures['soak_claim_latency_source']}")
    for name, value in figures.items():
        if name.startswith("soak_end_") and value is not None:
            lines.append(f"{name[len('soak_end_'):]:<28} {value}")
    return "\n".join(lines)
