"""Core snapshots as earlier releases wrote them, made from one of this release's.

Format 1 (raftcron 0.1) held each job as its list of fields (what a later row's packed record
holds) and each remembered request's answer itself (format 2 keeps it packed). Format 2 had no
15th field (the sections of state added since: queue limits, held jobs), so only a snapshot
without any of that state has a format 2 (or 1) form.
"""

from typing import Any

import msgpack


def as_version_2(blob: bytes) -> bytes:
    data: list[Any] = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    assert data[0] == 3, "made from a format 3 snapshot"
    assert data[14] == {}, "format 2 has no sections: made from a state without any"
    data[0] = 2
    del data[14]
    packed: bytes = msgpack.packb(data, use_bin_type=True)
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
