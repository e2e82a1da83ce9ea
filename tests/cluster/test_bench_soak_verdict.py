"""A steady soak says whether its held rate kept up: a ramp's short window called 11,444/s
flat, and the minute held at 10,300/s ran 4,610/s with a backlog of 282,608 (2026-12-06).
And each minute says how many log syncs took over half a second and whether the leader
changed: a hold at 7,000/s saw a change of leader with no fault injected (2026-12-06)."""

from __future__ import annotations

import math
from typing import Any

from raftcron.cluster.dev.bench.soakrecord import (
    CLAIM_LATENCY_SOURCE,
    ProducerCounts,
    Reading,
    kept_up,
    line,
    record,
    table,
    verdict,
)


def held(submitted: int, backlog: int, mode: str = "steady") -> dict[str, Any]:
    return {"soak_mode": mode, "soak_submitted": submitted, "soak_backlog_at_end": backlog,
            "soak_submit_per_s": submitted // 60, "soak_succeeded_per_s":
            (submitted - backlog) // 60}


def test_a_hold_whose_backlog_grew_past_a_twentieth_of_the_submitted_did_not_keep_up() -> None:
    behind = held(558_000, 282_608)
    assert kept_up(behind) is False
    said = verdict(behind)
    assert said is not None and said.startswith("NOT kept up: a backlog of 282,608")
    assert "4,589/s ran of 9,300/s submitted" in said


def test_a_hold_with_a_small_backlog_at_the_end_kept_up() -> None:
    assert kept_up(held(479_000, 17_088)) is True  # 3.6%: batches in flight, a slow second
    assert kept_up(held(479_000, 0)) is True
    assert kept_up(held(479_000, 23_951)) is False  # just over 5%
    assert verdict(held(479_000, 0)) == "kept up: a backlog of 0 at the end (0.0% of the submitted)"


def test_a_flood_outruns_the_workers_on_purpose_and_gets_no_verdict() -> None:
    assert kept_up(held(100_000, 90_000, mode="flood")) is None
    assert verdict(held(100_000, 90_000, mode="flood")) is None


# -- slow log syncs and changes of leader, beside each minute's figures ----------------------

def reading(at_s: float, syncs: dict[str, dict[float, float]], leader: str | None) -> Reading:
    return Reading(at_s=at_s, counts=ProducerCounts(), succeeded=0.0, backlog=0.0, running=0.0,
                   state_bytes=0.0, budget_bytes=None, parts={}, kept={}, evicted={},
                   refusals={}, claims={}, syncs=syncs, leader=leader)


def sync_buckets(under_half_s: float, total: float) -> dict[float, float]:
    """Cumulative buckets: `under_half_s` syncs took at most 0.5 s, `total` in all."""
    return {0.25: under_half_s, 0.5: under_half_s, 1.0: total, math.inf: total}


def test_a_record_counts_the_log_syncs_over_half_a_second_and_says_when_the_leader_changed():
    first = reading(0.0, {"n1": sync_buckets(100, 100), "n2": sync_buckets(90, 91)}, "n1")
    now = reading(60.0, {"n1": sync_buckets(700, 702), "n2": sync_buckets(690, 694),
                         "n3": sync_buckets(5, 9)}, "n2")  # n3 answered only now: not counted
    rec = record(first, first, now)
    assert rec["slow_syncs"] == 2 + 3  # n1's new ones and n2's; a node seen once adds none
    assert rec["leader"] == "n2" and rec["leader_changed"] is True
    assert record(first, now, now)["leader_changed"] is False
    assert record(first, reading(0.0, {}, None), now)["leader_changed"] is False  # none before
    assert line(rec).split()[-2] == "5"  # the column before RSS

    figures = {"soak_mode": "steady", "soak_workers": 2, "soak_concurrency": 128,
               "soak_minutes": 1.0, "soak_records": [rec], "soak_elapsed_s": 60.0,
               "soak_submitted": 0, "soak_submit_per_s": 0, "soak_succeeded": 0,
               "soak_succeeded_per_s": 0, "soak_refused": 0, "soak_refused_jobs": 0,
               "soak_rss_mb_max": None, "soak_backlog_at_end": 0,
               "soak_claim_latency_source": CLAIM_LATENCY_SOURCE}
    assert "the leader changed before minute 1.00 (now n2)" in table(figures).splitlines()


def test_a_reading_in_the_middle_of_an_election_hides_no_change_of_leader():
    """n1, then no leader (an election), then n3: the change is said at n3, against n1."""
    first = reading(0.0, {}, "n1")
    electing = reading(60.0, {}, None)
    later = reading(120.0, {}, "n3")
    during = record(first, first, electing, "n1")
    after = record(first, electing, later, "n1")
    assert during["leader"] is None and during["leader_changed"] is False
    assert after["leader"] == "n3" and after["leader_changed"] is True
    assert record(first, electing, reading(120.0, {}, "n1"), "n1")["leader_changed"] is False
    figures = {"soak_mode": "steady", "soak_workers": 2, "soak_concurrency": 128,
               "soak_minutes": 2.0, "soak_records": [during, after], "soak_elapsed_s": 120.0,
               "soak_submitted": 0, "soak_submit_per_s": 0, "soak_succeeded": 0,
               "soak_succeeded_per_s": 0, "soak_refused": 0, "soak_refused_jobs": 0,
               "soak_rss_mb_max": None, "soak_backlog_at_end": 0,
               "soak_claim_latency_source": CLAIM_LATENCY_SOURCE}
    lines = table(figures).splitlines()
    assert "no leader at minute 1.00" in lines
    assert "the leader changed before minute 2.00 (now n3)" in lines
