"""Commands to bytes and back: msgpack `[version, tag, {field: value}]`.

A version is bumped only when an existing field changes meaning; new fields get defaults and
new commands get new tags, so old log entries always decode. `decode` never raises anything but
`Invalid`, whatever bytes it is given: a log entry is input like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack

from raftcron.scheduler.commands import BY_TAG, Command, wire_fingerprint
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.packing import to_msgpack

WIRE_VERSION = 1


def encode(command: Command) -> bytes:
    body: bytes = to_msgpack([WIRE_VERSION, command.TAG, command.to_wire()])
    return body


def encode_request(command: Command) -> tuple[bytes, int | None]:
    """`encode`, and the fingerprint `decode_request` finds in those bytes. A node applying a
    command it proposed itself takes both from here instead of decoding its own entry (the
    command decoded from its bytes equals it: the model test holds the two equal, and the
    replicas that decode reach the same state)."""
    wire = command.to_wire()
    frame: bytes = to_msgpack([WIRE_VERSION, command.TAG, wire])
    fingerprint = wire_fingerprint(command.TAG, wire) if wire.get("request_id") else None
    return frame, fingerprint


def decode(data: bytes) -> Command:
    cls, fields = _frame(data)
    command: Command = cls.from_wire(fields)
    return command


def decode_request(data: bytes) -> tuple[Command, int | None]:
    """The command and, when it carries a request_id, its fingerprint (`command_fingerprint`)
    taken from the decoded fields."""
    cls, fields = _frame(data)
    command: Command = cls.from_wire(fields)
    fingerprint = wire_fingerprint(cls.TAG, fields) if fields.get("request_id") else None
    return command, fingerprint


def _frame(data: bytes) -> tuple[type[Any], Mapping[str, Any]]:
    try:
        frame: Any = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as error:  # msgpack raises several unrelated types on garbage
        raise Invalid("command", f"is not msgpack ({type(error).__name__})") from None
    if not (isinstance(frame, list) and len(frame) == 3):
        raise Invalid("command", "must be [version, tag, fields]")
    version, tag, fields = frame
    if version != WIRE_VERSION:
        raise Invalid("command", f"has wire version {version!r}; this node speaks {WIRE_VERSION}")
    cls = BY_TAG.get(tag) if isinstance(tag, int) and not isinstance(tag, bool) else None
    if cls is None:
        raise Invalid("command", f"has unknown tag {tag!r}")
    if not isinstance(fields, Mapping):
        raise Invalid("command", "fields must be a map")
    return cls, fields
