"""A start log: when recent starts happened, as runs of (time, count) in a flat array of 64-bit
integers (time, count, time, count, ... oldest first), what a rate window counts (a queue's,
scheduler/queues.py; a key's, scheduler/ratekeys.py).

A start is recorded at the end of its slice of window_ms / runs_max ms (rounded up), so a
window holds at most runs_max + 1 runs and a start counts as a little later than it was, never
earlier: it leaves the window late by less than a slice, which can only delay a start, never
allow one more.
"""

from __future__ import annotations

from array import array


def slice_end(at_ms: int, window_ms: int, runs_max: int) -> int:
    slice_ms = -(-window_ms // runs_max)  # rounded up: at most runs_max slices in a window
    return at_ms - at_ms % slice_ms + slice_ms - 1


def record_starts(log: array[int], now_ms: int, count: int, window_ms: int,
                  runs_max: int) -> None:
    """Add `count` starts at now_ms to a start log (time, count, ...), forgetting the runs out
    of every window from now on. A start is recorded at the end of its slice of window_ms /
    runs_max ms, so a window holds at most runs_max + 1 runs (module docstring: a start counts
    a little later than it was, never earlier)."""
    since_ms = now_ms - window_ms
    drop = 0
    while drop < len(log) and log[drop] <= since_ms:
        drop += 2
    if drop:
        del log[:drop]
    at_ms = slice_end(now_ms, window_ms, runs_max)
    if log and log[-2] >= at_ms:  # time never goes back: the same slice
        log[-1] += count
    else:
        log.append(at_ms)
        log.append(count)
