"""What a worker reports about a finished job, and the buffer those reports wait in.

An ack is the wire shape of DESIGN.md section 4 (`{"id", "token", "outcome", "result" |
"error", "retryable"}`). A result is checked here with the cluster's own parser before it is
sent: one bad result inside a claim would make the cluster reject the whole request (400/413),
acks and claim alike, so a result that is not JSON or is over 64 KiB becomes a failure of that
job alone, with a clear error. Error texts are cut to the cluster's limit, keeping the end (the
most specific lines of a traceback).

`AckBuffer` holds acks until the next claim carries them (one round trip) or the runtime's
flusher sends them on their own; it never drops one.
"""

from __future__ import annotations

import asyncio
import json
import traceback
from collections.abc import Iterable
from typing import Any

import orjson

from raftcron.cluster.worker.tasks import JobError
from raftcron.scheduler import limits, parse
from raftcron.scheduler.errors import Invalid

AckWire = dict[str, Any]  # an ack as a claim request carries it (scheduler.commands.Ack parses)
ACK_BATCH_BYTES_MAX = 256 * 1024  # JSON bytes of the acks in one request
PLAIN_ACK_BYTES_MAX = 80  # a success without a result, as JSON: 38 + two integers' digits


def _size(ack: AckWire) -> int:
    """Its bytes in a claim's body, which the client writes with orjson (asyncclient.py)."""
    if len(ack) == 3 and ack.get("outcome") == "succeeded":
        # {"id": N, "token": N, "outcome": "succeeded"}, two integers of at most 20
        # characters: a bound is enough to cut batches by, and costs no encoding.
        return PLAIN_ACK_BYTES_MAX
    try:
        return len(orjson.dumps(ack))
    except TypeError:
        return len(json.dumps(ack, default=str))


def success_ack(job_id: int, token: int, result: Any) -> AckWire:
    if result is None:  # most handlers return nothing: nothing to check
        return {"id": job_id, "token": token, "outcome": "succeeded"}
    try:
        parse.json_value(result, "result", bytes_max=limits.RESULT_BYTES_MAX)
    except Invalid as error:
        return failure_ack(
            job_id,
            token,
            f"the handler's result was refused: {error.message} (results must be JSON values "
            f"of at most {limits.RESULT_BYTES_MAX} bytes as msgpack)",
            retryable=False,
        )
    ack: AckWire = {"id": job_id, "token": token, "outcome": "succeeded"}
    if result is not None:
        ack["result"] = result
    return ack


def failure_ack(job_id: int, token: int, error: str, *, retryable: bool = True) -> AckWire:
    return {
        "id": job_id,
        "token": token,
        "outcome": "failed",
        "error": cut_error(error),
        "retryable": retryable,
    }


def cut_error(text: str) -> str:
    """At most ERROR_CHARS_MAX characters: the first line, then as much of the end as fits."""
    chars_max = limits.ERROR_CHARS_MAX
    if len(text) <= chars_max:
        return text
    first, _, rest = text.partition("\n")
    first = first[: chars_max // 4]
    marker = "\n[...]\n"
    return first + marker + rest[-(chars_max - len(first) - len(marker)) :]


def exception_text(error: BaseException) -> str:
    """A `JobError`'s message as it is; else `Type: message`, then the traceback (cut later,
    keeping its end)."""
    if isinstance(error, JobError):
        return str(error) or type(error).__name__
    headline = f"{type(error).__name__}: {error}".rstrip(": ")
    frames = "".join(traceback.format_exception(error)).rstrip()
    return f"{headline}\n{frames}"


class AckBuffer:
    """Acks waiting to be sent, in order; `take` removes a batch, `put_back` undoes a take.

    A batch is bounded in count (the cluster's ACKS_MAX) and in size (`batch_bytes_max`, well
    under the cluster's ~512 KiB per command): results of up to 64 KiB each add up fast.
    """

    def __init__(self, batch_bytes_max: int = ACK_BATCH_BYTES_MAX) -> None:
        self.batch_bytes_max = batch_bytes_max
        self._pending: list[tuple[AckWire, int]] = []
        self._nonempty = asyncio.Event()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, ack: AckWire) -> None:
        self._pending.append((ack, _size(ack)))
        self._nonempty.set()

    def take(self, count_max: int = limits.ACKS_MAX) -> list[AckWire]:
        """The oldest acks that fit one batch (at least one, when any is pending)."""
        count, total = 0, 0
        for _, size in self._pending[:count_max]:
            if count and total + size > self.batch_bytes_max:
                break
            count, total = count + 1, total + size
        taken, self._pending = self._pending[:count], self._pending[count:]
        if not self._pending:
            self._nonempty.clear()
        return [ack for ack, _ in taken]

    def put_back(self, acks: Iterable[AckWire]) -> None:
        returned = [(ack, _size(ack)) for ack in acks]
        if returned:
            self._pending[:0] = returned
            self._nonempty.set()

    async def wait(self) -> None:
        """Return when at least one ack is pending."""
        await self._nonempty.wait()
