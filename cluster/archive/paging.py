"""One page of a search over the state and the archive (DESIGN.md §9.2): the two halves read
over the same range of ids, merged, each job once, and the cursor for the next page.

The state's half (`views.search_jobs`, under the apply lock, with the archive's hand-over)
says its floor: every live job from the floor up to the cursor was examined. The archive's half
is read over the same range (ids from the floor, below the cursor), after the state's: a job
that left the state in between is in the archive by then (it leaves the hand-over only once
written). So a page is exact over its range, and the next one starts below it: paging never
repeats or skips a job, however jobs move from the state to the archive meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def merge_page(halves: Iterable[list[dict[str, Any]]], *, floor: int,
               limit: int) -> tuple[list[dict[str, Any]], int | None]:
    """The page (newest first, at most `limit`, none below `floor`) and the next cursor
    (None: nothing below). `halves`: the state's views first (a job read in both is the
    state's). `floor`: the higher of the halves' floors (a half cut short for bytes is
    complete only down to its last job), so the next page starts there."""
    merged: dict[int, dict[str, Any]] = {}
    for half in halves:
        for view in half:
            if int(view["id"]) >= floor:
                merged.setdefault(int(view["id"]), view)
    jobs = sorted(merged.values(), key=lambda view: -int(view["id"]))[:limit]
    if len(jobs) == limit:
        return jobs, int(jobs[-1]["id"])
    return jobs, floor or None
