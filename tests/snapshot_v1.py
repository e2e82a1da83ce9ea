"""A core snapshot as raftcron 0.1 wrote it (format 1), or as the release before this one
did (format 2), made from one of this release's (format 3).

Format 1 held each job as its list of fields (what a format 2 row's packed record holds) and
each remembered request's answer itself (format 2 keeps it packed).
"""

from typing import Any

import msgpack


def as_version_2(blob: bytes) -> bytes:
    """Format 3 less its 15th field (notifications: there must be none to drop)."""
    data: list[Any] = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    assert data[0] == 3, "made from a format 3 snapshot"
    assert data[14] == [0, 0, [], []], "format 2 has no notifications"
    packed: bytes = msgpack.packb([2, *data[1:14]], use_bin_type=True)
    return packed


def as_version_1(blob: bytes) -> bytes:
    data: list[Any] = msgpack.unpackb(as_version_2(blob), raw=False, strict_map_key=False)
    data[0] = 1
    data[5] = [msgpack.unpackb(row[5], raw=False) for row in data[5]]
    data[10] = [
        [rid, tag, fingerprint, msgpack.unpackb(value, raw=False, strict_map_key=False), at_ms]
        for rid, tag, fingerprint, value, at_ms in data[10]
    ]
    packed: bytes = msgpack.packb(data, use_bin_type=True)
    return packed
