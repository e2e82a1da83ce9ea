"""One page of a job search over the state and the node's archive (DESIGN.md §9.2), shared by
`GET /v1/jobs` and the purge (`POST /v1/jobs/bulk` with `"action": "purge"`).

The state's half (and the archive's hand-over) is read under the apply lock, a bounded number
of jobs per read; the archive's file over the same range of ids after it; merged, each job
once (cluster/archive/paging.py).
"""

from __future__ import annotations

from typing import Any

from raftcron.cluster.archive.paging import merge_page
from raftcron.cluster.http.common import HttpError
from raftcron.cluster.replica import RaftNode
from raftcron.scheduler import views
from raftcron.scheduler.search import JobFilter
from raftcron.scheduler.state import SchedulerState

EVERYWHERE = ("state", "archive")


def check_filter(query: JobFilter, field: str = "created_from_ms") -> JobFilter:
    """400 for a filter the archive would answer by scanning it all: a payload field with no
    created or finished range."""
    if query.payload and not query.has_time_range:
        raise HttpError(400, "invalid", f"a filter on {query.payload[0].name} (not a search "
                        "attribute) needs a created or finished range: created_from_ms, "
                        "created_to_ms, finished_from_ms or finished_to_ms", field)
    return query


async def search_page(node: RaftNode, query: JobFilter, *, cursor: int | None, limit: int,
                      sources: tuple[str, ...] = EVERYWHERE
                      ) -> tuple[list[dict[str, Any]], int | None]:
    """The newest `limit` jobs below `cursor` that `query` matches, and the next cursor (None:
    no more). `sources`: the state, the archive, or both."""
    archive = node.archive if "archive" in sources else None

    def live(state: SchedulerState) -> tuple[list[dict[str, Any]], int]:
        # The hand-over under the same lock as the state: a job is in one or the other.
        pending = () if archive is None else archive.writer.pending_jobs()
        return views.search_jobs(state, query, before_id=cursor, limit=limit, extra=pending,
                                 in_state="state" in sources)

    live_page, floor = node.machine.read(live)
    archived = [] if archive is None else await archive.search(
        query, before_id=cursor, limit=limit, min_id=floor)
    jobs, next_cursor = merge_page((live_page, archived), floor=floor, limit=limit)
    if archived:  # read after the file: a purge applied since hides what it purged (the
        # cursor stays the merge's: the page may hold fewer, the next goes on below)
        purged = node.machine.state.archive_ledger.tombstones
        jobs = [view for view in jobs if not (view.get("archived") and view["id"] in purged)]
    return jobs, next_cursor
