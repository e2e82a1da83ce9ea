"""Core snapshots as earlier releases wrote them, made from one of this release's.

Format 1 (raftcron 0.1) held each job as its list of fields (what a later row's packed record
holds) and each remembered request's answer itself (format 2 keeps it packed). A state without
any of the sections format 3 added is written as format 2 (scheduler/snapshot.py), so only such
a state has a format 2 (or 1) form.
"""

from typing import Any

import msgpack


def as_version_1(blob: bytes) -> bytes:
    data: list[Any] = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    assert data[0] == 2, "made from a format 2 snapshot (a state without format 3's sections)"
    data[0] = 1
    data[5] = [msgpack.unpackb(row[5], raw=False) for row in data[5]]
    data[10] = [
        [rid, tag, fingerprint, msgpack.unpackb(value, raw=False, strict_map_key=False), at_ms]
        for rid, tag, fingerprint, value, at_ms in data[10]
    ]
    packed: bytes = msgpack.packb(data, use_bin_type=True)
    return packed
