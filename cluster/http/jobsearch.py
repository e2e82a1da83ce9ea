"""One page of a job search over the state and the node's archive (DESIGN.md §9.2), shared by
`GET /v1/jobs` and the purge (`POST /v1/jobs/bulk` with `"action": "purge"`).

The state's half (and the archive's hand-over) is read under the apply lock, a bounded number
of jobs per read; the archive's file over the same range of ids after it; merged, each job
once (cluster/archive/paging.py).
"""

from __future__ import annotations

from typing import Any

from raftcron.cluster.archive.node import NodeArchive
from raftcron.cluster.archive.paging import merge_page
from raftcron.cluster.archive.query import indexed
from raftcron.cluster.consensus.replica import RaftNode
from raftcron.cluster.http import bounds
from raftcron.cluster.http.common import HttpError
from raftcron.scheduler import views
from raftcron.scheduler.search import JobFilter
from raftcron.scheduler.state import SchedulerState

EVERYWHERE = ("state", "archive")


def check_search(node: RaftNode, query: JobFilter, archive: NodeArchive | None,
                 field: str = "created_from_ms") -> None:
    """`check_indexed` with this node's search attributes and its archive's indexes."""
    if query.payload and not query.has_time_range:
        attributes = node.machine.read(lambda state: state.settings.search_attributes.paths)
        check_indexed(query, attributes, None if archive is None else archive.writer.indexed,
                      field)


def check_indexed(query: JobFilter, attributes: tuple[str, ...],
                  indexed_here: frozenset[str] | None, field: str = "created_from_ms") -> None:
    """A payload filter without a time range is answered only by a search attribute's index
    (DESIGN.md §9.2): 400 naming `field` (created_from_ms) for one that is not; 503 while this
    node's archive (`indexed_here`, None: not searched) is still building it."""
    if not query.payload or query.has_time_range:
        return
    for wanted in query.payload:
        if not indexed(wanted, attributes):
            why = ("a filter on null is not indexed" if wanted.value is None and
                   ".".join(wanted.path) in attributes else
                   "not a search attribute: PUT /v1/settings/search_attributes")
            raise HttpError(400, "invalid", f"a filter on {wanted.name} ({why}) needs a "
                            "created or finished range: created_from_ms, created_to_ms, "
                            "finished_from_ms or finished_to_ms", field)
    for wanted in query.payload:
        if indexed_here is not None and ".".join(wanted.path) not in indexed_here:
            raise HttpError(503, "unavailable", f"{wanted.name} is a search attribute this "
                            "node's archive is still indexing: retry, ask another member, or "
                            "give a created or finished range", field,
                            headers={"Retry-After": "5"})


async def search_page(node: RaftNode, query: JobFilter, *, cursor: int | None, limit: int,
                      sources: tuple[str, ...] = EVERYWHERE
                      ) -> tuple[list[dict[str, Any]], int | None]:
    """The newest `limit` jobs below `cursor` that `query` matches, and the next cursor (None:
    no more); fewer when they are large (each half ends past `bounds.PAGE_BYTES_MAX`: a page
    of jobs with 64 KiB payloads would otherwise be ~100 MB of JSON). `sources`: the state,
    the archive, or both."""
    archive = node.archive if "archive" in sources else None

    def live(state: SchedulerState) -> tuple[list[dict[str, Any]], int]:
        # The hand-over under the same lock as the state: a job is in one or the other.
        pending = () if archive is None else archive.writer.pending_jobs()
        return views.search_jobs(state, query, before_id=cursor, limit=limit, extra=pending,
                                 in_state="state" in sources, bytes_max=bounds.PAGE_BYTES_MAX)

    live_page, floor = node.machine.read(live)
    archived: list[dict[str, Any]] = []
    if archive is not None:
        archived, archive_floor = await archive.search(
            query, before_id=cursor, limit=limit, min_id=floor, bytes_max=bounds.PAGE_BYTES_MAX)
        floor = max(floor, archive_floor)
    jobs, next_cursor = merge_page((live_page, archived), floor=floor, limit=limit)
    if archive is not None:  # read after the file: a purge applied since hides what it
        # purged (the cursor stays the merge's: the page may hold fewer, the next goes on)
        jobs = [view for view in jobs
                if not (view.get("archived") and archive.writer.purged(view["id"]))]
    return jobs, next_cursor
