"""powerfs's disk faults (chaos/powerfs/faults.py): each one bites, and clearing heals.

The Volume tests run without FUSE (the unit tier): a failed fsync loses exactly the data
written since the last good one, even across a later good fsync ("fsyncgate"), and a read-only
disk keeps what it refused pending. The mount tests (processes tier, marked one by one) go
through a real powerfs daemon: a timed fsync, EIO then a power cut, EIO on write and read,
EROFS, the glob, the validation of the control request, and an fsync stall that does not stop
other processes' reads and writes (the daemon serves requests on a pool of threads).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftcron.chaos.powerfs.control import ControlError
from raftcron.chaos.powerfs.faults import DiskFaults, FaultInjector, FaultsError
from raftcron.chaos.powerfs.harness import PowerFS
from raftcron.chaos.powerfs.pages import PAGE_BYTES
from raftcron.chaos.powerfs.volume import Volume

# -- the Volume, no FUSE -------------------------------------------------------------------


@pytest.fixture
def volume() -> Iterator[Volume]:
    backing = tempfile.mkdtemp(prefix="powerfs-faults-")
    live = Volume(backing)
    try:
        yield live
    finally:
        live.close(sync=False)
        shutil.rmtree(backing)


def _write(volume: Volume, path: str, data: bytes, offset: int = 0) -> None:
    fh = volume.create(path, 0o644, os.O_RDWR, 0, 0)
    try:
        volume.write(fh, data, offset)
    finally:
        volume.release(fh)


def _fsync(volume: Volume, path: str, **failure: object) -> None:
    fh = volume.opendir(path) if path == "/" else volume.open(path, os.O_RDWR)
    try:
        volume.fsync(fh, **failure)  # type: ignore[arg-type]
    finally:
        volume.release(fh)


def _read(volume: Volume, path: str) -> bytes:
    fh = volume.open(path, os.O_RDONLY)
    try:
        return volume.read(fh, 1 << 20, 0)
    finally:
        volume.release(fh)


def test_a_failed_fsync_loses_the_data_even_after_a_later_good_fsync(volume: Volume) -> None:
    _write(volume, "/f", b"A" * PAGE_BYTES)
    _fsync(volume, "/f")
    _fsync(volume, "/")
    _write(volume, "/f", b"B" * 100, offset=10)  # the page that the failed fsync loses
    with pytest.raises(OSError) as failed:
        _fsync(volume, "/f", fail_errno=errno.EIO)
    assert failed.value.errno == errno.EIO
    assert _read(volume, "/f")[10:110] == b"B" * 100  # the page cache still shows it
    assert volume.status()["lost_files"] == 1
    _fsync(volume, "/f")  # succeeds, and writes nothing of the lost page
    assert (Path(volume.disk.root) / "f").read_bytes() == b"A" * PAGE_BYTES
    volume.cut()
    assert _read(volume, "/f") == b"A" * PAGE_BYTES


def test_data_written_after_a_failed_fsync_is_made_durable_by_the_next_good_one(
    volume: Volume,
) -> None:
    _write(volume, "/f", b"old")
    _fsync(volume, "/f")
    _fsync(volume, "/")
    _write(volume, "/f", b"lost", offset=PAGE_BYTES)  # the file grows: size stays pending
    with pytest.raises(OSError):
        _fsync(volume, "/f", fail_errno=errno.EIO)
    _write(volume, "/f", b"new", offset=3 * PAGE_BYTES)
    _fsync(volume, "/f")
    volume.cut()
    after = _read(volume, "/f")
    assert after[:3] == b"old"
    assert after[PAGE_BYTES : PAGE_BYTES + 4] == bytes(4)  # lost: the disk's zeros
    assert after[3 * PAGE_BYTES :] == b"new"


def test_a_write_into_a_lost_page_makes_the_whole_page_dirty_again(volume: Volume) -> None:
    _write(volume, "/f", b"a" * 50)
    with pytest.raises(OSError):
        _fsync(volume, "/f", fail_errno=errno.EIO)
    _write(volume, "/f", b"b", offset=60)  # the cached page, lost bytes and all, is rewritten
    _fsync(volume, "/f")
    _fsync(volume, "/")
    volume.cut()
    assert _read(volume, "/f") == b"a" * 50 + bytes(10) + b"b"


def test_a_failed_fsync_of_a_directory_keeps_its_entries_pending(volume: Volume) -> None:
    _write(volume, "/f", b"x")
    with pytest.raises(OSError):
        _fsync(volume, "/", fail_errno=errno.EIO)
    assert not (Path(volume.disk.root) / "f").exists()
    _fsync(volume, "/f")
    _fsync(volume, "/")
    volume.cut()
    assert _read(volume, "/f") == b"x"


def test_a_read_only_disk_refuses_a_pending_fsync_and_keeps_it_pending(volume: Volume) -> None:
    _write(volume, "/f", b"x")
    _fsync(volume, "/f")
    _fsync(volume, "/")
    _fsync(volume, "/f", read_only=True)  # nothing to write: a read-only disk answers
    _write(volume, "/f", b"y", offset=1)
    with pytest.raises(OSError) as refused:
        _fsync(volume, "/f", read_only=True)
    assert refused.value.errno == errno.EROFS
    _fsync(volume, "/f")  # healed: it was kept
    volume.cut()
    assert _read(volume, "/f") == b"xy"


@pytest.mark.parametrize(("request_fields", "message"), [
    ({"fsync_delay_s": -1}, "within"),
    ({"fsync_delay_s": "2"}, "number"),
    ({"fsync_jitter_s": True}, "number"),
    ({"fsync_errno": "EWHAT"}, "errno name"),
    ({"write_errno": 5}, "errno name"),
    ({"read_only": "yes"}, "true or false"),
    ({"paths": "/abs/*"}, "relative"),
    ({"paths": ""}, "non-empty"),
    ({"fsync_delay": 2}, "unknown fault field"),
])
def test_a_faults_request_is_validated_field_by_field(
    request_fields: dict[str, object], message: str,
) -> None:
    with pytest.raises(FaultsError, match=message):
        DiskFaults.from_request({"op": "faults", **request_fields})


def test_an_empty_faults_request_is_a_healthy_disk_and_a_glob_spares_other_files() -> None:
    assert DiskFaults.from_request({"op": "faults"}).healthy
    injector = FaultInjector(seed=1)
    injector.set(DiskFaults.from_request({"write_errno": "EIO", "fsync_delay_s": 1.0,
                                          "fsync_jitter_s": 0.5, "paths": "*.seg"}))
    injector.check_write("/notes.txt")
    with pytest.raises(OSError) as failed:
        injector.check_write("/data/log-1.seg")
    assert failed.value.errno == errno.EIO
    assert injector.fsync_delay_s("/notes.txt") == 0.0
    delays = [injector.fsync_delay_s("/log-1.seg") for _ in range(50)]
    assert all(0.5 <= d <= 1.5 for d in delays) and len(set(delays)) > 1
    assert injector.status()["injected"] == {"write_errors": 1, "fsync_delays": 50}


# -- on a real mount -----------------------------------------------------------------------


def _durable(fs: PowerFS, name: str, data: bytes) -> Path:
    path = Path(fs.mountpoint) / name
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(fs.mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def _timed_fsync(path: Path) -> float:
    with open(path, "ab") as f:
        f.write(b".")
        f.flush()
        started = time.monotonic()
        os.fsync(f.fileno())
        return time.monotonic() - started


@pytest.mark.processes
def test_a_delayed_fsync_takes_the_delay_and_clearing_makes_it_fast(fs: PowerFS) -> None:
    path = _durable(fs, "log", b"x")
    fs.set_faults(fsync_delay_s=0.8)
    assert _timed_fsync(path) >= 0.8
    assert fs.status()["injected"]["fsync_delays"] >= 1
    fs.clear_faults()
    assert _timed_fsync(path) < 0.5


@pytest.mark.processes
def test_a_stalled_fsync_does_not_stop_other_processes_on_the_mount(fs: PowerFS) -> None:
    stalled = _durable(fs, "stalled", b"x")
    other = _durable(fs, "other", b"y")
    fs.set_faults(fsync_delay_s=3.0, paths="stalled")
    stall = threading.Thread(target=_timed_fsync, args=(stalled,))
    stall.start()
    try:
        time.sleep(0.2)  # let the stalled fsync reach the daemon first
        started = time.monotonic()
        # another process: its own FUSE requests, not this one's
        subprocess.run([sys.executable, "-c", f"import os; p={str(other)!r}; "
                        "f=open(p,'ab'); f.write(b'z'); f.flush(); os.fsync(f.fileno()); "
                        "open(p,'rb').read(); os.stat(p)"], check=True, timeout=10)
        assert time.monotonic() - started < 2.0
        assert stall.is_alive()  # the stalled fsync still waits
    finally:
        stall.join(10)


@pytest.mark.processes
def test_fsync_eio_then_a_power_cut_loses_the_data_even_after_a_good_fsync(
    fs: PowerFS,
) -> None:
    path = _durable(fs, "log", b"durable;")
    fs.set_faults(fsync_errno="EIO")
    with open(path, "ab") as f:
        f.write(b"acknowledged?")
        f.flush()
        with pytest.raises(OSError) as failed:
            os.fsync(f.fileno())
        assert failed.value.errno == errno.EIO
        fs.clear_faults()
        os.fsync(f.fileno())  # succeeds, as Linux's does after the error was reported
    assert path.read_bytes() == b"durable;acknowledged?"  # still in the page cache
    report = fs.cut()
    assert report["lost_files"] == 1
    assert path.read_bytes().rstrip(b"\0") == b"durable;"


@pytest.mark.processes
def test_write_and_read_errnos_fail_those_calls_until_cleared(fs: PowerFS) -> None:
    path = _durable(fs, "data", b"abc")
    fs.set_faults(write_errno="EIO")
    with open(path, "ab", buffering=0) as f, pytest.raises(OSError) as failed:
        f.write(b"d")
    assert failed.value.errno == errno.EIO
    assert path.read_bytes() == b"abc"
    fs.set_faults(read_errno="EIO")
    with pytest.raises(OSError) as failed:
        path.read_bytes()
    assert failed.value.errno == errno.EIO
    fs.clear_faults()
    with open(path, "ab") as f:
        f.write(b"d")
    assert path.read_bytes() == b"abcd"
    injected = fs.status()["injected"]
    assert injected["write_errors"] == 1
    assert injected["read_errors"] >= 1  # the kernel may retry a failed read once


@pytest.mark.processes
def test_a_read_only_disk_refuses_changes_with_erofs_and_heals(fs: PowerFS) -> None:
    path = _durable(fs, "data", b"abc")
    fs.set_faults(read_only=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    attempts = [
        lambda: os.write(fd, b"x"),
        lambda: (Path(fs.mountpoint) / "new").write_bytes(b"x"),
        lambda: path.rename(Path(fs.mountpoint) / "moved"),
        lambda: path.unlink(),
        lambda: os.mkdir(Path(fs.mountpoint) / "dir"),
        lambda: os.truncate(path, 1),
    ]
    try:
        for attempt in attempts:
            with pytest.raises(OSError) as refused:
                attempt()
            assert refused.value.errno == errno.EROFS
    finally:
        os.close(fd)
    assert path.read_bytes() == b"abc"  # reads still work
    fs.clear_faults()
    path.write_bytes(b"healed")
    assert path.read_bytes() == b"healed"


@pytest.mark.processes
def test_the_command_sets_and_clears_faults_and_names_a_bad_field(fs: PowerFS) -> None:
    command = [sys.executable, "-m", "raftcron.chaos.powerfs", "faults", fs.mountpoint]
    done = subprocess.run([*command, "--fsync-delay", "0.6", "--paths", "*.seg"],
                          capture_output=True, text=True, timeout=30, check=True)
    assert '"fsync_delay_s": 0.6' in done.stdout and '"paths": "*.seg"' in done.stdout
    assert _timed_fsync(_durable(fs, "log-1.seg", b"x")) >= 0.6
    bad = subprocess.run([*command, "--fsync-errno", "EWHAT"], capture_output=True, text=True,
                         timeout=30, check=False)
    assert bad.returncode == 1 and "errno name" in bad.stderr
    with pytest.raises(ControlError, match="unknown fault field"):
        fs.set_faults(fsync_delay=1)
    subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
    assert fs.status()["faults"] == {}
