"""scheduler/leases.py: the lease ends of running jobs give back exactly what one heap of every
entry gave (the structure it replaced): at every time, every entry ending then or before, and
the soonest end; whatever order entries come in, lease lengths beyond its lines included."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from raftcron.scheduler.leases import LINES_MAX, LeaseEnds

# One step: ("claim", lease_ms, advance_ms) leases a new job from now; ("refile", end_ms)
# files an entry with any end (a heartbeat's extension, a restore's rebuild); ("take",
# advance_ms) moves time on and takes what is due.
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("claim"), st.sampled_from([1_000, 30_000, 30_000, 60_000, None])
                  | st.integers(1, 40), st.integers(0, 500)),
        st.tuples(st.just("refile"), st.integers(0, 100_000)),
        st.tuples(st.just("take"), st.integers(0, 20_000)),
    ),
    max_size=200,
)


@settings(max_examples=300)
@given(STEPS)
def test_the_same_entries_fall_due_as_from_one_heap(steps: list[tuple]) -> None:
    ends, heap = LeaseEnds(), []
    now_ms, next_id = 0, 1
    for step in steps:
        if step[0] == "claim":
            _, lease_ms, advance_ms = step
            now_ms += advance_ms
            entry = (now_ms + (lease_ms or 5_000), next_id)
            ends.add(*entry, lease_ms)
            next_id += 1
        elif step[0] == "refile":
            entry = (step[1], next_id)
            ends.add(*entry, 30_000)
            next_id += 1
        else:
            now_ms += step[1]
            due = []
            while heap and heap[0][0] <= now_ms:
                due.append(heapq.heappop(heap))
            assert sorted(ends.take_due(now_ms)) == sorted(due)
            entry = None
        if entry is not None:
            heapq.heappush(heap, entry)
        assert len(ends) == len(heap) and bool(ends) == bool(heap)
        assert ends.first_ms() == (heap[0][0] if heap else None)
        assert len(ends.lines) <= LINES_MAX
        for line in ends.lines.values():  # each line in order of its ends: taken from the front
            ends_ms = [end for end, _ in line]
            assert ends_ms == sorted(ends_ms)


def test_a_claim_s_entry_goes_to_its_length_s_line_and_an_earlier_end_to_the_heap() -> None:
    ends = LeaseEnds()
    ends.add(31_000, 1, 30_000)
    ends.add(32_000, 2, 30_000)
    ends.add(20_000, 3, 30_000)  # a re-filed lease ending before the line's last: the heap
    assert list(ends.lines[30_000]) == [(31_000, 1), (32_000, 2)] and ends.heap == [(20_000, 3)]
    assert ends.first_ms() == 20_000
    assert sorted(ends.take_due(31_000)) == [(20_000, 3), (31_000, 1)]
    assert ends.take_due(31_999) == [] and ends.first_ms() == 32_000
    assert ends.take_due(32_000) == [(32_000, 2)]
    assert not ends and ends.lines == {}  # an emptied line gives its place back
