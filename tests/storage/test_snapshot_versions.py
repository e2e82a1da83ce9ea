"""The versioning rule for snapshots (docs/operations/upgrade.md): a snapshot of a newer format than
this release reads is refused with both versions named; a key that older releases ignore needs
no new version, and a snapshot without it (written by the previous release) still loads (the
member book as an empty one, the cluster name as unknown)."""

from __future__ import annotations

import struct
import zlib

import msgpack
import pytest

from raftcron.cluster.membership.book import BeginMemberChange, Member, MemberBook
from raftcron.cluster.storage import snapshots
from raftcron.cluster.storage.raftlog import LogDamaged
from raftcron.scheduler import snapshot as core_snapshot
from raftcron.scheduler.state import SchedulerState

PREV, LAST = (b"\x01", 9, 2), (b"\x01", 10, 2)


def snapshot_file(body: dict[str, object], version: int = snapshots.FORMAT_VERSION) -> bytes:
    data = b"".join(snapshots.encode(10, 2, body))
    if version == snapshots.FORMAT_VERSION:
        return data
    # The same file with another version in its header (and the header's checksum redone).
    head = bytearray(data[:snapshots._HEAD.size])
    struct.pack_into("<I", head, len(snapshots.MAGIC), version)
    return bytes(head) + struct.pack("<I", zlib.crc32(bytes(head))) + data[snapshots.HEADER_BYTES:]


def body(**extra: object) -> dict[str, object]:
    state = core_snapshot.snapshot(SchedulerState())
    return {"prev": list(PREV), "last": list(LAST), "cluster": ["a:1"], "state": state, **extra}


def test_a_storage_snapshot_of_a_newer_format_is_refused_naming_both_versions() -> None:
    newer = snapshots.FORMAT_VERSION + 1
    with pytest.raises(LogDamaged) as caught:
        snapshots.decode(snapshot_file(body(), version=newer), "snap")
    assert f"format version {newer}" in str(caught.value)
    assert f"this release reads version {snapshots.FORMAT_VERSION}" in str(caught.value)


def test_a_core_snapshot_of_a_newer_version_is_refused_naming_both_versions() -> None:
    blob = bytearray(core_snapshot.snapshot(SchedulerState()))
    newer = core_snapshot.SNAPSHOT_VERSION + 1
    blob[1] = newer  # the version: the first field, a positive fixint after the array header
    with pytest.raises(ValueError) as caught:
        core_snapshot.restore(bytes(blob))
    assert f"snapshot version {newer}" in str(caught.value)
    assert str(core_snapshot.SNAPSHOT_VERSIONS_READ) in str(caught.value)


def test_the_member_book_is_a_new_key_read_when_present_and_empty_when_absent() -> None:
    previous_release = snapshots.decode(snapshot_file(body()), "snap")
    assert previous_release.members is None
    assert MemberBook.from_wire(previous_release.members) == MemberBook()
    member = Member("n4", "h:1", "h:2")
    book, _ = MemberBook().apply(BeginMemberChange("add", member, (Member("n1", "h:3", "h:4"),)))
    this_release = snapshots.decode(snapshot_file(body(members=book.to_wire())), "snap")
    assert MemberBook.from_wire(this_release.members) == book
    # What an older reader takes from the body is unchanged by the new key.
    fields = msgpack.unpackb(zlib.decompress(snapshot_file(body(members=book.to_wire()))[
        snapshots.HEADER_BYTES:]), raw=False)
    assert {"prev", "last", "cluster", "state"} <= set(fields)


def test_the_cluster_name_is_a_new_key_read_when_present_and_unknown_when_absent() -> None:
    previous_release = snapshot_file(body())
    assert snapshots.decode(previous_release, "snap").cluster_name is None
    assert snapshots.cluster_name_in(previous_release) is None
    this_release = snapshot_file({"cluster_name": "staging", **body()})
    assert snapshots.decode(this_release, "snap").cluster_name == "staging"
    assert snapshots.cluster_name_in(this_release[:snapshots.HEADER_BYTES + 512]) == "staging"
    # What an older reader takes from the body is unchanged by the new key.
    fields = msgpack.unpackb(zlib.decompress(this_release[snapshots.HEADER_BYTES:]), raw=False)
    assert {"prev", "last", "cluster", "state"} <= set(fields)
    # A name that is not a string is damage, named as such; bytes that are not a snapshot
    # body tell no name.
    with pytest.raises(LogDamaged, match="cluster_name"):
        snapshots.decode(snapshot_file({"cluster_name": 7, **body()}), "snap")
    assert snapshots.cluster_name_in(b"x" * (snapshots.HEADER_BYTES + 40)) is None
