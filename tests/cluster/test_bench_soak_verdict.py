"""A steady soak says whether its held rate kept up: a ramp's short window called 11,444/s
flat, and the minute held at 10,300/s ran 4,610/s with a backlog of 282,608 (2026-12-06)."""

from __future__ import annotations

from typing import Any

from raftcron.cluster.dev.bench.soakrecord import kept_up, verdict


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
