"""Purge: finished jobs removed for good, from the state and from every member's archive, for
data that must go (DESIGN.md §9.2).

The shell picks the jobs (a search over the state and its archive, cluster/http/flow.py) and
proposes `PurgeJobs` with their ids. A finished job still in the state leaves it without being
archived; an id the state does not hold (archived, or never seen) gets a **tombstone**: every
member deletes its row, and no fill from a peer writes it again (the archive's writer checks
the tombstones: cluster/archive/writer.py). A tombstone records the archive number the next
job to leave would get: every row of the purged job is numbered below it, so once archive
retention's floor passes it, every member has dropped such rows anyway and the tombstone goes.
Unfinished jobs are skipped (cancel them first), and so is a job that did not succeed while a
job depending on it remains, as a delete does (scheduler/bulk.py).

A replicated behaviour of this release: refused (`not_finalized`) before the upgrade gate, as
the previous release, which does not know the command, refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from raftcron.scheduler import jobs as j
from raftcron.scheduler import limits, parse
from raftcron.scheduler.archiving import ArchiveLedger
from raftcron.scheduler.errors import Invalid, Ok, Rejected, Result
from raftcron.scheduler.frozen import FrozenJob
from raftcron.scheduler.store import JobTable

PURGE_IDS_MAX = limits.BULK_MAX  # ids one command names


@dataclass(frozen=True, slots=True)
class PurgeJobs:
    TAG: ClassVar[int] = 52
    request_id: str | None
    ids: tuple[int, ...]

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"ids": list(self.ids)}
        return wire if self.request_id is None else {"request_id": self.request_id, **wire}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PurgeJobs:
        ids = data.get("ids")
        if not isinstance(ids, list | tuple) or not 1 <= len(ids) <= PURGE_IDS_MAX:
            raise Invalid("ids", f"must be a list of 1 to {PURGE_IDS_MAX} job ids")
        checked = tuple(parse.integer(job_id, "ids", low=1)
                        for job_id in ids)
        if len(set(checked)) != len(checked):
            raise Invalid("ids", "names a job twice")
        request_id = parse.optional_text(data.get("request_id"), "request_id",
                                         chars_max=limits.KEY_CHARS_MAX)
        return cls(request_id, checked)


class PurgeState(Protocol):
    table: JobTable
    archive_ledger: ArchiveLedger

    @property
    def finalized(self) -> bool: ...

    def remove_job(self, job: j.Job | FrozenJob, *, archived: bool = True) -> None: ...


def apply(state: PurgeState, command: PurgeJobs) -> Result:
    if not state.finalized:
        return Rejected("not_finalized", "purge takes effect once the cluster is finalized "
                        "(raftcron cluster finalize, when every member runs this release)")
    purged = skipped = 0
    for job_id in command.ids:
        job = state.table.get(job_id)
        if job is None:  # archived, if anywhere: its rows go on every member, for good
            state.archive_ledger.tombstone(job_id)
        elif not job.final or (job.status != j.SUCCEEDED and state.table.has_dependents(job)):
            skipped += 1
            continue
        else:
            state.remove_job(job, archived=False)  # it leaves no row in any archive
        purged += 1
    return Ok({"purged": purged, "skipped": skipped})
