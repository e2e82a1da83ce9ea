"""SimDisk, the simulation's disk: OsDisk's semantics while running, and after a power cut
exactly what was made durable (plus, when tearing, a prefix of what was not)."""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from raftcron.chaos.sim.disk import UNLIMITED_FREE_BYTES, PowerCut, SimDisk
from raftcron.cluster.storage.disk import Disk, OsDisk

# -- both disks behave alike while nothing fails ------------------------------------------------


@pytest.fixture(params=["os", "sim"])
def disk_and_dir(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Disk, str]:
    if request.param == "os":
        return OsDisk(), str(tmp_path)
    disk = SimDisk()
    disk.makedirs("/data")
    return disk, "/data"


def test_an_appended_file_reads_back_at_offsets(disk_and_dir: tuple[Disk, str]) -> None:
    disk, folder = disk_and_dir
    file = disk.create(os.path.join(folder, "a"))
    file.append(b"hello ")
    file.append(b"world")
    assert file.size() == 11
    assert file.read_at(6, 5) == b"world"
    with pytest.raises(OSError) as short:
        file.read_at(6, 6)
    assert short.value.errno == errno.EIO
    file.truncate(5)
    file.append(b"!")
    assert disk.read(os.path.join(folder, "a")) == b"hello!"
    file.close()


def test_create_is_exclusive_and_open_needs_the_file(disk_and_dir: tuple[Disk, str]) -> None:
    disk, folder = disk_and_dir
    disk.create(os.path.join(folder, "a")).close()
    with pytest.raises(FileExistsError):
        disk.create(os.path.join(folder, "a"))
    with pytest.raises(FileNotFoundError):
        disk.open(os.path.join(folder, "b"))
    with pytest.raises(FileNotFoundError):
        disk.read(os.path.join(folder, "b"))
    with pytest.raises(FileNotFoundError):
        disk.unlink(os.path.join(folder, "b"))
    with pytest.raises(FileNotFoundError):
        disk.rename(os.path.join(folder, "b"), os.path.join(folder, "c"))


def test_rename_replaces_its_target_and_listdir_is_sorted(disk_and_dir: tuple[Disk, str]) -> None:
    disk, folder = disk_and_dir
    disk.write_file(os.path.join(folder, "b"), [b"new"], sync=True)
    disk.write_file(os.path.join(folder, "a"), [b"old", b"er"], sync=False)
    disk.makedirs(os.path.join(folder, "sub", "deeper"))
    assert disk.listdir(folder) == ["a", "b", "sub"]
    disk.rename(os.path.join(folder, "b"), os.path.join(folder, "a"))
    disk.sync_dir(folder)
    assert disk.listdir(folder) == ["a", "sub"]
    assert disk.read(os.path.join(folder, "a")) == b"new"
    assert disk.exists(os.path.join(folder, "a")) and disk.exists(os.path.join(folder, "sub"))
    assert not disk.exists(os.path.join(folder, "b"))
    disk.write_file(os.path.join(folder, "a"), [b"x"], sync=False)
    assert disk.read(os.path.join(folder, "a")) == b"x"
    assert disk.free_bytes(folder) > 0


def test_an_unlinked_file_stays_readable_through_an_open_handle(
        disk_and_dir: tuple[Disk, str]) -> None:
    disk, folder = disk_and_dir
    file = disk.create(os.path.join(folder, "a"))
    file.append(b"kept")
    disk.unlink(os.path.join(folder, "a"))
    assert file.read_at(0, 4) == b"kept"
    assert disk.listdir(folder) == []
    file.close()


# -- what a power cut leaves -------------------------------------------------------------------


def made(*, synced: bytes, unsynced: bytes = b"", folder_synced: bool = True) -> SimDisk:
    disk = SimDisk()
    disk.makedirs("/d")
    file = disk.create("/d/f")
    file.append(synced)
    file.sync()
    if folder_synced:
        disk.sync_dir("/d")
    file.append(unsynced)
    return disk


def test_a_power_cut_keeps_synced_bytes_and_drops_the_rest() -> None:
    disk = made(synced=b"durable", unsynced=b" and not")
    disk.power_cut(random.Random(0), tear=False)
    assert disk.read("/d/f") == b"durable"


def test_a_torn_power_cut_keeps_a_prefix_of_the_unsynced_appends() -> None:
    seen = set()
    for seed in range(60):
        disk = made(synced=b"durable", unsynced=b"0123456789")
        disk.power_cut(random.Random(seed))
        after = disk.read("/d/f")
        assert after.startswith(b"durable") and (b"durable0123456789").startswith(after)
        seen.add(len(after))
    assert min(seen) == len(b"durable") and max(seen) == len(b"durable0123456789")
    assert len(seen) > 5


def test_the_same_seed_tears_the_same_way() -> None:
    outcomes = []
    for _ in range(2):
        disk = made(synced=b"a" * 10, unsynced=b"b" * 1000)
        disk.power_cut(random.Random("same"))
        outcomes.append(disk.read("/d/f"))
    assert outcomes[0] == outcomes[1]


def test_a_synced_file_whose_name_was_never_synced_is_gone() -> None:
    disk = made(synced=b"data", folder_synced=False)
    disk.power_cut(random.Random(0), tear=False)
    assert disk.listdir("/d") == []


def test_a_rename_before_sync_dir_is_lost_and_the_old_target_stays() -> None:
    disk = SimDisk()
    disk.makedirs("/d")
    disk.write_file("/d/current", [b"old"], sync=True)
    disk.sync_dir("/d")
    disk.write_file("/d/next.tmp", [b"new"], sync=True)
    disk.rename("/d/next.tmp", "/d/current")
    disk.power_cut(random.Random(0), tear=False)
    assert disk.listdir("/d") == ["current"] and disk.read("/d/current") == b"old"
    disk.write_file("/d/next.tmp", [b"new"], sync=True)
    disk.rename("/d/next.tmp", "/d/current")
    disk.sync_dir("/d")
    disk.power_cut(random.Random(0), tear=False)
    assert disk.listdir("/d") == ["current"] and disk.read("/d/current") == b"new"


def test_a_torn_power_cut_keeps_name_changes_in_order() -> None:
    """The names after a cut are those of some prefix of the pending changes, never a mix."""
    outcomes = set()
    for seed in range(40):
        disk = SimDisk()
        disk.makedirs("/d")
        for name in ("a", "b", "c"):
            disk.write_file(f"/d/{name}", [name.encode()], sync=True)
        disk.unlink("/d/a")
        disk.power_cut(random.Random(seed))
        outcomes.add(tuple(disk.listdir("/d")))
    assert outcomes == {(), ("a",), ("a", "b"), ("a", "b", "c"), ("b", "c")}


def test_an_unlink_before_sync_dir_comes_back() -> None:
    disk = made(synced=b"data")
    disk.unlink("/d/f")
    disk.power_cut(random.Random(0), tear=False)
    assert disk.read("/d/f") == b"data"


def test_an_unsynced_rewrite_or_truncation_leaves_the_old_bytes_without_tearing() -> None:
    disk = made(synced=b"old bytes")
    disk.write_file("/d/f", [b"new"], sync=False)
    disk.power_cut(random.Random(0), tear=False)
    assert disk.read("/d/f") == b"old bytes"
    file = disk.open("/d/f")
    file.truncate(3)
    disk.power_cut(random.Random(0), tear=False)
    assert disk.read("/d/f") == b"old bytes"


def test_a_torn_cut_after_a_truncation_keeps_the_old_bytes_or_the_cut_and_a_prefix() -> None:
    outcomes = set()
    for seed in range(40):
        disk = made(synced=b"old bytes")
        file = disk.open("/d/f")
        file.truncate(3)
        file.append(b"NEW")
        disk.power_cut(random.Random(seed))
        outcomes.add(disk.read("/d/f"))
    assert outcomes == {b"old bytes", b"old", b"oldN", b"oldNE", b"oldNEW"}


def test_a_crash_keeps_the_page_cache_but_the_dead_process_files_stop_working() -> None:
    disk = made(synced=b"durable", unsynced=b" cached", folder_synced=False)
    file = disk.open("/d/f")
    disk.crash()
    assert disk.read("/d/f") == b"durable cached"
    with pytest.raises(OSError) as dead:
        file.append(b"more")
    assert dead.value.errno == errno.EBADF
    disk.open("/d/f").append(b"!")  # the next process opens it again
    assert disk.read("/d/f") == b"durable cached!"


# -- power cut inside a call, damage, a full disk -----------------------------------------------


def count_operations(work: Callable[[SimDisk], None]) -> int:
    disk = SimDisk()
    disk.makedirs("/d")
    before = disk.operations
    work(disk)
    return disk.operations - before


def write_and_publish(disk: SimDisk) -> None:
    file = disk.create("/d/f")
    file.append(b"payload")
    file.sync()
    disk.sync_dir("/d")


def test_an_armed_cut_fires_inside_the_chosen_call_and_leaves_a_state_of_that_instant() -> None:
    total = count_operations(write_and_publish)
    assert total == 4
    survived = []
    for operation in range(total):
        disk = SimDisk()
        disk.makedirs("/d")
        disk.cut_power_at(operation, random.Random(0), tear=False)
        with pytest.raises(PowerCut):
            write_and_publish(disk)
        survived.append(disk.listdir("/d") and disk.read("/d/f"))
    # create, append, sync (cut before it), sync_dir (cut before it): only the last leaves
    # nothing either, because the name was never durable.
    assert survived == [[], [], [], []]
    disk = SimDisk()
    disk.makedirs("/d")
    disk.cut_power_at(total, random.Random(0), tear=False)
    write_and_publish(disk)
    with pytest.raises(PowerCut):
        disk.unlink("/d/f")
    assert disk.read("/d/f") == b"payload"


def test_a_flipped_bit_changes_one_bit_of_the_live_and_the_durable_bytes() -> None:
    disk = made(synced=b"\x00" * 16)
    offset, bit = disk.flip_bit("/d/f", random.Random(3), start=4, end=8)
    assert 4 <= offset < 8
    expected = bytearray(16)
    expected[offset] = 1 << bit
    assert disk.read("/d/f") == bytes(expected) == disk.durable_bytes("/d/f")
    disk.power_cut(random.Random(0))
    assert disk.read("/d/f") == bytes(expected)


def test_a_full_disk_writes_what_fits_then_fails_with_enospc_until_room_is_made() -> None:
    disk = made(synced=b"12345678")
    assert disk.free_bytes("/d") == UNLIMITED_FREE_BYTES
    disk.fill_up(4)
    assert disk.free_bytes("/d") == 4
    file = disk.open("/d/f")
    with pytest.raises(OSError) as full:
        file.append(b"abcdef")
    assert full.value.errno == errno.ENOSPC
    assert disk.read("/d/f") == b"12345678abcd" and disk.free_bytes("/d") == 0
    with pytest.raises(OSError):
        disk.write_file("/d/g", [b"x"], sync=True)
    file.truncate(8)
    assert disk.free_bytes("/d") == 4
    disk.fill_up(None)
    file.append(b"abcdef")
    assert disk.read("/d/f") == b"12345678abcdef"
