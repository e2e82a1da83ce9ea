"""cluster/clock/clocks.py: one wrong clock cannot move the cluster's time (DESIGN.md §8.2).

Pure arithmetic: every wall and monotonic time is an argument, so these run no clock at all.
"""

from __future__ import annotations

import pytest

from raftcron.cluster.clock.clocks import (
    REFERENCE_WAIT_S,
    SAMPLE_FRESH_S,
    ClockBook,
    TickBound,
    decide_tick,
)

TRUE_MS = 1_800_000_000_000
DAY_MS = 86_400_000
SLACK_MS = 250


def book_of(node_id: str, peers: dict[str, int], *, mono_s: float = 100.0,
            members: list[str] | None = None) -> ClockBook:
    """A book of `node_id` holding one fresh sample of each peer's wall clock (ms)."""
    book = ClockBook(node_id, members or sorted([node_id, *peers]), max_skew_ms=1_000)
    for peer, wall_ms in peers.items():
        assert book.observe(peer, peer_wall_ms=wall_ms, sent_mono_s=mono_s - 0.001,
                            received_mono_s=mono_s + 0.001)
    return book


def test_a_leader_ten_days_ahead_is_skewed_and_ticks_only_the_majoritys_time() -> None:
    book = book_of("n1", {"n2": TRUE_MS, "n3": TRUE_MS + 20})
    decision = decide_tick(book, TickBound(SLACK_MS), wall_ms=TRUE_MS + 10 * DAY_MS,
                           mono_s=100.0, state_now_ms=TRUE_MS - 100)
    assert decision.now_ms == TRUE_MS + 20 and decision.reason == "skewed"
    assert decision.view.skew_ms == 10 * DAY_MS
    assert decision.view.agreeing() == ["n2", "n3"]  # where it hands leadership


def test_a_tick_carries_the_majoritys_time_not_the_leaders() -> None:
    """A clock 900 ms fast is within max_skew_ms: it may lead, at the majority's time (the
    2nd largest of 3 clocks), as a leader 300 ms slow would."""
    book = book_of("n1", {"n2": TRUE_MS, "n3": TRUE_MS - 300})
    decision = decide_tick(book, TickBound(SLACK_MS), wall_ms=TRUE_MS + 900, mono_s=100.0,
                           state_now_ms=TRUE_MS - 100)
    assert decision.reason == "ok" and decision.view.skew_ms == 900
    assert decision.now_ms == TRUE_MS
    slow = book_of("n3", {"n1": TRUE_MS + 900, "n2": TRUE_MS})
    assert decide_tick(slow, TickBound(SLACK_MS), wall_ms=TRUE_MS - 300, mono_s=100.0,
                       state_now_ms=TRUE_MS - 100).now_ms == TRUE_MS


def test_a_node_a_day_behind_is_skewed_and_the_others_are_not() -> None:
    behind = book_of("n3", {"n1": TRUE_MS, "n2": TRUE_MS})
    assert decide_tick(behind, TickBound(), wall_ms=TRUE_MS - DAY_MS, mono_s=100.0,
                       state_now_ms=TRUE_MS).reason == "skewed"
    honest = book_of("n1", {"n2": TRUE_MS, "n3": TRUE_MS - DAY_MS})
    decision = decide_tick(honest, TickBound(), wall_ms=TRUE_MS, mono_s=100.0,
                           state_now_ms=TRUE_MS)
    assert decision.reason == "ok" and decision.view.skew_ms == 0
    assert decision.view.offsets_ms == {"n1": 0, "n2": 0, "n3": -DAY_MS}


def test_without_the_peers_clocks_a_fast_clock_moves_time_only_as_fast_as_time_passes() -> None:
    """No peer answers (a partition of the HTTP ports): after the wait, the reference is the
    first committed time this process saw, and 100 Ticks a second apart (each committed) move
    the state's time 100 s plus one slack, not 100 x slack, whatever the wall clock says."""
    bound = TickBound(SLACK_MS)
    book = ClockBook("n1", ["n1", "n2", "n3"], max_skew_ms=1_000)
    state_ms, start_s = TRUE_MS, 50.0
    wall_ahead_ms = 10 * DAY_MS
    assert decide_tick(book, bound, wall_ms=TRUE_MS + wall_ahead_ms, mono_s=start_s,
                       state_now_ms=state_ms).reason == "no_evidence"
    for second in range(1, 101):
        mono_s = start_s + REFERENCE_WAIT_S + second
        decision = decide_tick(book, bound, wall_ms=TRUE_MS + wall_ahead_ms + 1000 * second,
                               mono_s=mono_s, state_now_ms=state_ms)
        assert decision.now_ms is not None
        state_ms = max(state_ms, decision.now_ms)  # the state machine's max()
    elapsed_ms = round((REFERENCE_WAIT_S + 100) * 1000)
    assert state_ms == TRUE_MS + elapsed_ms + SLACK_MS


def test_a_just_started_node_waits_for_the_majoritys_clocks_before_ticking() -> None:
    """Just after a start, the state's time is when the cluster stopped: no Tick from it
    until a majority's clocks are known or REFERENCE_WAIT_S have passed."""
    bound = TickBound(SLACK_MS)
    lonely = ClockBook("n1", ["n1", "n2", "n3"], max_skew_ms=1_000)
    assert decide_tick(lonely, bound, wall_ms=TRUE_MS, mono_s=10.0,
                       state_now_ms=TRUE_MS - DAY_MS).now_ms is None
    assert decide_tick(lonely, bound, wall_ms=TRUE_MS, mono_s=10.0 + REFERENCE_WAIT_S,
                       state_now_ms=TRUE_MS - DAY_MS).now_ms == (
        TRUE_MS - DAY_MS + round(REFERENCE_WAIT_S * 1000) + SLACK_MS)


def test_after_whole_cluster_downtime_the_jump_to_the_present_waits_for_a_majority() -> None:
    """A day down: the jump is taken as soon as a majority's clocks (here: 2 of 3) agree."""
    bound = TickBound(SLACK_MS)
    book = ClockBook("n1", ["n1", "n2", "n3"], max_skew_ms=1_000)
    stopped_ms = TRUE_MS - DAY_MS
    assert decide_tick(book, bound, wall_ms=TRUE_MS, mono_s=10.0,
                       state_now_ms=stopped_ms).now_ms is None
    book.observe("n2", peer_wall_ms=TRUE_MS + 500, sent_mono_s=10.4, received_mono_s=10.6)
    decision = decide_tick(book, bound, wall_ms=TRUE_MS + 500, mono_s=10.5,
                           state_now_ms=stopped_ms)
    assert decision.now_ms == TRUE_MS + 500  # both clocks are at or past it


def test_a_peer_is_aged_by_the_monotonic_clock_so_our_own_leap_shows_as_our_offset() -> None:
    book = book_of("n1", {"n2": TRUE_MS, "n3": TRUE_MS}, mono_s=100.0)
    later = book.view(wall_ms=TRUE_MS + 2_000 + 300_000, mono_s=102.0)  # we stepped +5 min
    assert later.offsets_ms == {"n1": 0, "n2": -300_000, "n3": -300_000}
    assert later.skewed and later.skew_ms == 300_000
    stale = book.view(wall_ms=TRUE_MS, mono_s=100.0 + SAMPLE_FRESH_S + 1)
    assert stale.offsets_ms == {"n1": 0} and stale.quorum_clock_ms is None


@pytest.mark.parametrize(("sent_s", "received_s"), [(10.0, 9.0), (10.0, 12.0)])
def test_a_backwards_or_slow_round_trip_is_not_a_sample(sent_s: float, received_s: float) -> None:
    book = ClockBook("n1", ["n1", "n2"], max_skew_ms=1_000)
    assert not book.observe("n2", peer_wall_ms=TRUE_MS, sent_mono_s=sent_s,
                            received_mono_s=received_s)
    assert not book.observe("n9", peer_wall_ms=TRUE_MS, sent_mono_s=10.0, received_mono_s=10.1)
    assert book.samples == {}


def test_alone_a_node_takes_its_own_clock_once_then_keeps_to_its_monotonic_clock() -> None:
    """One member is its own majority: at a start (the whole cluster's downtime) it jumps to
    its clock; a step of its clock 10 days forward later moves nothing but elapsed time."""
    bound = TickBound(SLACK_MS)
    book = ClockBook("n1", ["n1"], max_skew_ms=1_000)
    first = decide_tick(book, bound, wall_ms=TRUE_MS, mono_s=5.0, state_now_ms=TRUE_MS - DAY_MS)
    assert first.now_ms == TRUE_MS
    leapt = decide_tick(book, bound, wall_ms=TRUE_MS + 10 * DAY_MS + 1_000, mono_s=6.0,
                        state_now_ms=TRUE_MS)
    assert leapt.now_ms == TRUE_MS + 1_000 + SLACK_MS


def test_two_clocks_that_disagree_without_a_third_hand_the_lead_to_the_later_one() -> None:
    """No majority agrees (3 members, 2 known, 60 s apart): the earlier clock is the majority's
    time (the lower median) and the later one is skewed; time runs late, never early."""
    ahead = book_of("n3", {"n1": TRUE_MS - 30_000}, members=["n1", "n2", "n3"])
    assert ahead.view(wall_ms=TRUE_MS + 30_000, mono_s=100.0).skewed
    behind = book_of("n1", {"n3": TRUE_MS + 30_000}, members=["n1", "n2", "n3"])
    view = behind.view(wall_ms=TRUE_MS - 30_000, mono_s=100.0)
    assert not view.skewed and view.quorum_clock_ms == TRUE_MS - 30_000


def test_a_book_needs_its_own_node_among_the_members() -> None:
    with pytest.raises(ValueError, match="not among the members"):
        ClockBook("n4", ["n1", "n2"], max_skew_ms=1_000)
