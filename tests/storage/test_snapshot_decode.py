"""Decoding a snapshot file holds its state's bytes once.

A follower decodes the leader's snapshot beside the state it still has (the install lets go
of that state only once the snapshot checked out). Decompressing the body whole and unpacking
it held the state's bytes twice over: zlib's output in blocks and then joined, then the body
and msgpack's copy of the state out of it (2.1 times the state at the peak). The body is now
decompressed in pieces and the state's bytes filled in place.
"""

from __future__ import annotations

import os
import tracemalloc
import zlib
from typing import Any

import msgpack
import pytest

from raftcron.cluster.storage import snapshots
from raftcron.cluster.storage.raftlog import LogDamaged

ENTRIES: dict[str, Any] = {"prev": [b"p", 6, 2], "last": [b"l", 7, 2], "cluster": ["n1", "n2"]}


def file_of(body: dict[str, Any] | bytes, index: int = 7, term: int = 2) -> bytes:
    """A snapshot file around `body` (a mapping packed as the writer packs it, or raw bytes)."""
    packed = body if isinstance(body, bytes) else msgpack.packb(body, use_bin_type=True)
    compressed = zlib.compress(packed, 1)
    head = snapshots._HEAD.pack(snapshots.MAGIC, snapshots.FORMAT_VERSION, index, term,
                                len(compressed), zlib.crc32(compressed))
    return head + snapshots._HEAD_CRC.pack(zlib.crc32(head)) + compressed


def test_decoding_a_40_mib_state_allocates_it_once() -> None:
    state = os.urandom(20 << 20).hex().encode()  # poorly compressible, as payloads can be
    data = b"".join(snapshots.encode(7, 2, {"cluster_name": "c", **ENTRIES, "state": state,
                                            "members": {"recorded": []}}))
    tracemalloc.start()
    try:
        decoded = snapshots.decode(data, "f")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoded.state == state and decoded.cluster_name == "c"
    assert decoded.members == {"recorded": []} and decoded.cluster == ["n1", "n2"]
    # Whole: 2.1 times the state, at zlib's end and again as msgpack copied the state out.
    assert peak < len(state) * 1.2, f"decoding peaked at {peak} bytes for {len(state)}"


@pytest.mark.parametrize("state_bytes", [0, 1, 300, 70_000, (1 << 20) + 3, 3 << 20])
@pytest.mark.parametrize("name", [None, "a-cluster"])
def test_every_size_of_state_decodes_to_what_was_written(state_bytes: int,
                                                         name: str | None) -> None:
    state = os.urandom(state_bytes)
    body = {**({} if name is None else {"cluster_name": name}), **ENTRIES, "state": state}
    for members in (None, {"recorded": [["n1", "a:1", "b:1"]]}):
        if members is not None:
            body["members"] = members
        decoded = snapshots.decode(file_of(body), "f")
        assert (decoded.state, decoded.members, decoded.cluster_name) == (state, members, name)
        assert (decoded.index, decoded.term, decoded.prev, decoded.last) == (
            7, 2, (b"p", 6, 2), (b"l", 7, 2))


def test_a_state_written_before_the_entries_decodes_as_well() -> None:
    """Only this release's writer puts the entries first; the key order is not the format's."""
    state = os.urandom(2 << 20)
    decoded = snapshots.decode(file_of({"state": state, **ENTRIES}), "f")
    assert decoded.state == state and decoded.cluster == ["n1", "n2"]


@pytest.mark.parametrize(("body", "why"), [
    ({**ENTRIES}, "state"),  # no state at all
    ({**ENTRIES, "state": 5}, ""),  # not bytes: bytes(5) is five zero bytes, as it always was
    (msgpack.packb({**ENTRIES, "state": b"s" * 5000}, use_bin_type=True)[:-100], "early"),
    (msgpack.packb({**ENTRIES, "state": b"s"}, use_bin_type=True) + b"\x01", "after"),
    (msgpack.packb([1, 2], use_bin_type=True), ""),
    (b"\xc1" * 10, ""),
])
def test_a_body_that_does_not_decode_is_damage_naming_the_file(body: Any, why: str) -> None:
    data = file_of(body)
    if body == {**ENTRIES, "state": 5}:
        assert snapshots.decode(data, "f").state == bytes(5)
        return
    with pytest.raises(LogDamaged) as damaged:
        snapshots.decode(data, "the file")
    assert damaged.value.path == "the file" and "does not decode" in damaged.value.problem
    assert why in damaged.value.problem


def test_a_zlib_stream_cut_short_is_damage() -> None:
    packed = msgpack.packb({**ENTRIES, "state": os.urandom(1 << 20)}, use_bin_type=True)
    compressed = zlib.compress(packed, 1)[:-50]
    head = snapshots._HEAD.pack(snapshots.MAGIC, snapshots.FORMAT_VERSION, 7, 2,
                                len(compressed), zlib.crc32(compressed))
    data = head + snapshots._HEAD_CRC.pack(zlib.crc32(head)) + compressed
    with pytest.raises(LogDamaged, match="truncated"):
        snapshots.decode(data, "f")
