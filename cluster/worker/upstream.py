"""`ctx.upstream`: a workflow job's parents' results, by the parents' names in the workflow.

The claim answer brings them (`upstream`, built by scheduler/upstream.py up to
UPSTREAM_CLAIM_BYTES_MAX of results per claim). A parent it left out is read on demand with
`GET /v1/jobs/{id}`, consistent (a follower that lags must not answer "still running"), which
answers archived jobs too (a parent evicted for space, as the budget's last resort).

How a handler reads a result that did not come with the claim:
- a plain handler runs in a thread: its first read of that name sends the request on the
  worker's event loop and waits for it there (as `ctx.heartbeat()` does);
- a coroutine handler runs on the event loop, where a blocking read would stall every other
  job: the worker reads every left-out result before it starts the handler (concurrently, at
  most DEPENDS_ON_MAX of them, within a third of the lease; only results past the claim's cap
  are left out, so this is rare), and `ctx.upstream[name]` never waits there.
A read that failed (no node answered, the parent left the archive too) raises
`UpstreamUnavailable` at `ctx.upstream[name]`: the attempt fails (retryable) unless the
handler catches it. A name that is not a parent raises KeyError naming the parents.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

READ_WAIT_S_MAX = 60.0  # a plain handler's wait for one parent's result


class UpstreamUnavailable(RuntimeError):
    """A parent's result was not delivered with the claim and could not be read on demand."""


class ResultReader(Protocol):
    """The call that reads a parent (`AsyncClient.job`; in `raftcron.testing`, the core's)."""

    async def job(self, job_id: int, *, consistent: bool = False) -> dict[str, Any]: ...


class Upstream(Mapping[str, Any]):
    """Read-only: parent name -> the JSON result its handler returned."""

    def __init__(
        self,
        wire: Mapping[str, Any] | None = None,
        *,
        reader: ResultReader | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """`wire`: a claimed job's `upstream` (`{name: {"job_id", "delivered", "result"}}`)."""
        self._ids: dict[str, int] = {}
        self._results: dict[str, Any] = {}
        self._errors: dict[str, str] = {}
        for name, entry in (wire or {}).items():
            self._ids[name] = int(entry["job_id"])
            if entry.get("delivered"):
                self._results[name] = entry.get("result")
        self._reader = reader
        self._loop = loop

    def __repr__(self) -> str:
        return f"Upstream({list(self._ids)})"

    def __getitem__(self, name: str) -> Any:
        results = self._results
        if name in results:
            return results[name]
        if name not in self._ids:
            parents = ", ".join(self._ids)
            raise KeyError(
                f"{name!r} is not a parent of this job: "
                + (f"its parents are {parents}" if parents
                   else "it has none (only a workflow job's parents are upstream)")
            )
        return self._read(name)

    def __contains__(self, name: object) -> bool:
        return name in self._ids  # a name, not its result: nothing read

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def job_id(self, name: str) -> int:
        """The parent's job id (KeyError if `name` is not a parent)."""
        return self._ids[name]

    @property
    def missing(self) -> list[str]:
        """Parents whose result is neither here nor known to be unreadable."""
        if not self._ids:  # most jobs have no parents: asked for each of them
            return []
        return [name for name in self._ids if name not in self._results
                and name not in self._errors]

    def _read(self, name: str) -> Any:
        """From a handler thread: read one parent on the event loop and wait for it."""
        if name not in self._errors:
            loop = self._loop
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if loop is None or running is loop:
                # A coroutine handler's results were all read before it started: this is a
                # mapping made by hand, or read on a loop that cannot wait for itself.
                raise UpstreamUnavailable(f"the result of parent {name!r} was not delivered "
                                          "and cannot be read from this thread")
            future = asyncio.run_coroutine_threadsafe(self.fetch(name), loop)
            try:
                future.result(READ_WAIT_S_MAX)
            except concurrent.futures.TimeoutError:
                future.cancel()
                self._errors[name] = f"no answer within {READ_WAIT_S_MAX:g} s"
        if name in self._results:
            return self._results[name]
        job_id = self._ids[name]
        raise UpstreamUnavailable(
            f"the result of parent {name!r} (job {job_id}) could not be read: {self._errors[name]}"
        )

    async def fetch(self, name: str) -> None:
        """Read one parent's result into the mapping; a failure is kept, to raise on reading."""
        if self._reader is None:
            self._errors[name] = "this worker has no client to read it with"
            return
        try:
            job = await self._reader.job(self._ids[name], consistent=True)
        except Exception as error:  # any failure is the handler's to see, when it reads
            self._errors[name] = f"{type(error).__name__}: {error}"
            return
        if job.get("status") != "succeeded":
            self._errors[name] = f"it is {job.get('status')}, with no result"
            return
        self._results[name] = job.get("result")

    async def prefetch(self, timeout_s: float) -> None:
        """Before a coroutine handler starts: read every left-out result, within `timeout_s`;
        what is not read by then is unavailable (the lease is running)."""
        missing = self.missing
        if not missing:
            return
        _, pending = await asyncio.wait(
            [asyncio.ensure_future(self.fetch(name)) for name in missing], timeout=timeout_s
        )
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        for name in self.missing:
            self._errors[name] = f"not read within {timeout_s:g} s, before the handler started"


NO_UPSTREAM = Upstream()  # what a job that is not a workflow's child sees: nothing
