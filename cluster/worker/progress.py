"""A handler's progress reports (`ctx.progress`), checked here and sent as heartbeats, at most
one a second per job.

The rules it keeps (DESIGN.md §9.4):
- a report is checked where the handler made it: a wrong type is a TypeError, a value out of
  bounds a ValueError, each naming the argument (`value`, `message`, `data`), with the core's
  own bounds (scheduler/progress.py), so a report taken here is one the node takes;
- a report triggers a heartbeat that carries it, at most one per `interval_s` (a loop that
  reports every row must not put a log entry per row through Raft); the newest report wins: one
  made while a heartbeat is in flight or within the second waits, replacing any waiting one,
  and goes at the next opportunity;
- the last report is never dropped: when the handler returns, a waiting report is sent at once,
  before the job's outcome (which would make a later heartbeat stale), so a finished job shows
  where it got to. That one heartbeat may come sooner than a second after the one before: it is
  one per job, not per report;
- nothing is sent for a job whose lease is lost, or once a node answered that it does not know
  the field (a member of the previous release during a rolling upgrade): the job runs on.

`report` may be called from any thread (plain handlers run in threads); the sending happens on
the event loop. No task exists until a job reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import numbers
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from raftcron.scheduler import limits, parse
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.progress import ProgressReport

INTERVAL_S = 1.0  # at most one heartbeat per job this often for its progress

Report = dict[str, Any]  # {"value", "message"?, "data"?}: a heartbeat's `progress`


def checked_report(value: Any, message: str | None = None, data: Any = None) -> Report:
    """The report as a heartbeat carries it; TypeError or ValueError naming the argument."""
    report: Report = {"value": _checked_value(value)}
    if message is not None:
        if not isinstance(message, str):
            raise TypeError(f"message must be a string, not {type(message).__name__}")
        if len(message) > limits.PROGRESS_MESSAGE_CHARS_MAX:
            raise ValueError(f"message must be at most {limits.PROGRESS_MESSAGE_CHARS_MAX} "
                             f"characters, not {len(message)}")
        report["message"] = message
    if data is not None:
        try:
            parse.json_value(data, "data", bytes_max=limits.PROGRESS_DATA_BYTES_MAX)
        except Invalid as error:
            kind = TypeError if "not a JSON value" in error.message or "keys" in error.message \
                else ValueError
            raise kind(f"data {error.message}") from None
        report["data"] = data
    try:
        ProgressReport.parse(report)  # the node's own check: what passes here, it takes
    except Invalid as error:
        raise ValueError(f"{error.field} {error.message}") from None
    return report


def _checked_value(value: Any) -> float | int | dict[str, int]:
    if isinstance(value, Mapping):
        unknown = sorted(str(k) for k in value if k not in ("done", "total"))
        if unknown:
            raise ValueError(f"value has an unknown key {unknown[0]!r} (known: done, total)")
        counts = {}
        for name in ("done", "total"):
            number = value.get(name)
            if isinstance(number, bool) or not isinstance(number, numbers.Integral):
                raise TypeError(f"value[{name!r}] must be an int, not {type(number).__name__}")
            counts[name] = int(number)
        if counts["total"] < 1:
            raise ValueError(f"value['total'] must be at least 1, not {counts['total']}")
        if not 0 <= counts["done"] <= counts["total"]:
            raise ValueError(f"value['done'] must be between 0 and total ({counts['total']}), "
                             f"not {counts['done']}")
        return counts
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("value must be a fraction in [0, 1] or {'done': int, 'total': int}, "
                        f"not {type(value).__name__}")
    fraction = int(value) if isinstance(value, numbers.Integral) else float(value)
    if math.isnan(fraction) or not 0 <= fraction <= 1:
        raise ValueError(f"value must be a fraction between 0 and 1, not {value}")
    return fraction


class ProgressReporter:
    """One job's reports on their way: the newest waiting one, and the task that sends it.

    `send(report)` is one heartbeat carrying it: False when the lease is known to be lost.
    `clock` and `pause` are time.monotonic and a sleep that `finish` cuts short; a test gives
    its own to run the pacing without waiting.
    """

    def __init__(
        self,
        send: Callable[[Report], Awaitable[bool]],
        loop: asyncio.AbstractEventLoop,
        *,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        pause: Callable[[float], Awaitable[None]] | None = None,
        record: bool = False,
    ) -> None:
        self._send = send
        self._loop = loop
        self.interval_s = interval_s
        self._clock = clock
        self._pause = pause or self._pause_unless_hurried
        self._lock = threading.Lock()  # `pending` and `closed`, written by handler threads
        self._pending: Report | None = None
        self._closed = False
        self._hurry = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.last_sent_at: float | None = None  # clock() when the last heartbeat left
        self.sent = 0  # heartbeats sent with a report
        self.reported: list[Report] | None = [] if record else None  # every report, if asked

    def report(self, report: Report) -> bool:
        """Take the newest report (any thread). False once nothing more will be sent."""
        with self._lock:
            if self._closed:
                return False
            self._pending = report
            if self.reported is not None:
                self.reported.append(report)
        try:
            here = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            here = False
        if here:
            self._start()
        else:
            self._loop.call_soon_threadsafe(self._start)
        return True

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._run())

    async def _run(self) -> None:
        while True:
            with self._lock:
                if self._pending is None:
                    return
            if not self._hurry.is_set() and self.last_sent_at is not None:
                wait_s = self.last_sent_at + self.interval_s - self._clock()
                if wait_s > 0:
                    await self._pause(wait_s)
                    continue
            if not await self._send_pending():
                return

    async def _send_pending(self) -> bool:
        """Send the waiting report, if any; False when no more may be sent."""
        with self._lock:
            report, self._pending = self._pending, None
        if report is None:
            return True
        self.last_sent_at = self._clock()
        self.sent += 1
        if await self._send(report):
            return True
        self.close()
        return False

    async def _pause_unless_hurried(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hurry.wait(), seconds)

    async def finish(self) -> None:
        """The handler returned: no more reports; a waiting one goes now (after one in flight,
        so the newest is applied last)."""
        with self._lock:
            self._closed = True
        self._hurry.set()
        if self._task is not None:
            await self._task
        await self._send_pending()

    def close(self) -> None:
        """Take and send nothing more (the lease is lost, or the node refused the field)."""
        with self._lock:
            self._closed = True
            self._pending = None

    async def abandon(self) -> None:
        """The job is abandoned: drop what waits, stop what is in flight."""
        self.close()
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
