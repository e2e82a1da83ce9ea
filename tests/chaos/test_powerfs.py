"""powerfs on a real FUSE mount: what was made durable survives a power cut, nothing else does.

Each test mounts a fresh backing dir in a temp dir through `chaos.powerfs.harness.PowerFS`; the
fixture stops the daemon and unmounts in `finally`, and fails the test if the daemon logged a
bug. The tests skip only when FUSE cannot be used on this machine (no /dev/fuse, no libfuse3, or
a trivial FUSE filesystem does not mount), never because powerfs itself fails to mount.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from raftcron.chaos.powerfs.harness import PowerFS, mounted
from raftcron.chaos.powerfs.power import choose_torn_prefix

pytestmark = pytest.mark.processes  # starts processes: make integration

MiB = 1 << 20


def mnt(fs: PowerFS) -> Path:
    return Path(fs.mountpoint)


def disk(fs: PowerFS) -> Path:
    return Path(fs.backing)


def write(path: Path, data: bytes, *, sync: bool = False, append: bool = False) -> None:
    with open(path, "ab" if append else "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_file(fs: PowerFS, name: str, data: bytes) -> Path:
    path = mnt(fs) / name
    write(path, data, sync=True)
    fsync_dir(path.parent)
    return path


# -- the basic promise ------------------------------------------------------------------------


def test_synced_data_survives_a_cut(fs: PowerFS) -> None:
    path = durable_file(fs, "a", b"durable bytes\n")
    fs.cut()
    assert path.read_bytes() == b"durable bytes\n"
    assert (disk(fs) / "a").read_bytes() == b"durable bytes\n"


def test_changes_are_visible_at_once_but_reach_the_disk_only_when_synced(fs: PowerFS) -> None:
    path = mnt(fs) / "a"
    write(path, b"live")
    assert path.read_bytes() == b"live"
    assert not (disk(fs) / "a").exists()
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    assert not (disk(fs) / "a").exists()  # the name is not durable until the directory is
    fsync_dir(mnt(fs))
    assert (disk(fs) / "a").read_bytes() == b"live"


def test_data_written_after_the_last_fsync_is_gone_after_a_cut(fs: PowerFS) -> None:
    path = durable_file(fs, "log", b"first record\n")
    write(path, b"second record\n", append=True)
    with open(path, "rb+") as f:
        f.write(b"FIRST")  # an overwrite inside the durable part, not synced either
    assert path.read_bytes() == b"FIRST record\nsecond record\n"
    report = fs.cut()
    assert report["dirty_files"] == 1
    assert path.read_bytes() == b"first record\n"


def test_fdatasync_makes_content_and_size_durable(fs: PowerFS) -> None:
    path = durable_file(fs, "data", b"x" * 10)
    with open(path, "ab") as f:
        f.write(b"y" * 5000)
        f.flush()
        os.fdatasync(f.fileno())
    fs.cut()
    assert path.read_bytes() == b"x" * 10 + b"y" * 5000


def test_a_rename_not_followed_by_a_directory_fsync_is_undone_by_a_cut(fs: PowerFS) -> None:
    final = durable_file(fs, "state", b"old state")
    tmp = mnt(fs) / "state.tmp"
    write(tmp, b"new state", sync=True)
    os.rename(tmp, final)
    assert final.read_bytes() == b"new state"
    fs.cut()
    assert final.read_bytes() == b"old state"
    assert not tmp.exists()  # its name was never durable either


def test_a_rename_followed_by_a_directory_fsync_survives_a_cut(fs: PowerFS) -> None:
    final = durable_file(fs, "state", b"old state")
    tmp = mnt(fs) / "state.tmp"
    write(tmp, b"new state", sync=True)
    fsync_dir(mnt(fs))  # now tmp's name is durable too
    os.rename(tmp, final)
    fsync_dir(mnt(fs))
    fs.cut()
    assert final.read_bytes() == b"new state"
    assert sorted(p.name for p in mnt(fs).iterdir()) == ["state"]
    assert sorted(p.name for p in disk(fs).iterdir()) == [".powerfs-orphans", "state"]


def test_a_rename_between_directories_is_durable_where_each_directory_was_synced(
    fs: PowerFS,
) -> None:
    (mnt(fs) / "a").mkdir()
    (mnt(fs) / "b").mkdir()
    fsync_dir(mnt(fs))
    moved = durable_file(fs, "a/f", b"payload")
    os.rename(moved, mnt(fs) / "b" / "f")
    fsync_dir(mnt(fs) / "b")  # only the destination: the file now has both names on disk
    fs.cut()
    assert (mnt(fs) / "a" / "f").read_bytes() == b"payload"
    assert (mnt(fs) / "b" / "f").read_bytes() == b"payload"
    os.unlink(mnt(fs) / "a" / "f")
    fsync_dir(mnt(fs) / "a")
    fs.cut()
    assert not (mnt(fs) / "a" / "f").exists()
    assert (mnt(fs) / "b" / "f").read_bytes() == b"payload"


def test_a_new_file_whose_directory_was_not_fsynced_is_gone(fs: PowerFS) -> None:
    path = mnt(fs) / "new"
    write(path, b"content", sync=True)
    fs.cut()
    assert not path.exists()
    assert sorted(os.listdir(disk(fs))) == [".powerfs-orphans"]
    assert os.listdir(disk(fs) / ".powerfs-orphans") == []


def test_a_new_directory_needs_its_parent_synced_too(fs: PowerFS) -> None:
    nested = mnt(fs) / "d"
    nested.mkdir()
    durable_file(fs, "d/f", b"inside")  # f and d's entries are durable, d's own name is not
    fs.cut()
    assert not nested.exists()
    nested.mkdir()
    durable_file(fs, "d/f", b"inside")
    fsync_dir(mnt(fs))
    fs.cut()
    assert (nested / "f").read_bytes() == b"inside"


def test_an_unlink_not_followed_by_a_directory_fsync_is_undone(fs: PowerFS) -> None:
    path = durable_file(fs, "keep", b"still here")
    os.unlink(path)
    (mnt(fs) / "gone-dir").mkdir()
    assert not path.exists()
    fs.cut()
    assert path.read_bytes() == b"still here"
    assert not (mnt(fs) / "gone-dir").exists()


def test_truncate_semantics(fs: PowerFS) -> None:
    path = durable_file(fs, "t", bytes(range(256)) * 40)  # 10240 bytes
    os.truncate(path, 100)
    assert path.stat().st_size == 100
    with open(path, "rb+") as f:
        f.seek(5000)
        f.write(b"END")
    data = path.read_bytes()
    assert len(data) == 5003
    assert data[:100] == (bytes(range(256)) * 40)[:100]
    assert data[100:5000] == bytes(4900), "a truncated region must read as zeros when regrown"
    fs.cut()
    assert path.stat().st_size == 10240, "an unsynced truncate is undone by a cut"
    os.truncate(path, 100)
    with open(path, "rb+") as f:
        f.truncate(6000)
        os.fsync(f.fileno())
    fs.cut()
    assert path.read_bytes() == (bytes(range(256)) * 40)[:100] + bytes(5900)


def test_o_trunc_and_o_append(fs: PowerFS) -> None:
    path = durable_file(fs, "f", b"0123456789")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"ab")
        os.pwrite(fd, b"cd", 0)  # Linux: pwrite on O_APPEND appends
    finally:
        os.close(fd)
    assert path.read_bytes() == b"0123456789abcd"
    write(path, b"new")  # "wb" is O_TRUNC
    assert path.read_bytes() == b"new"
    fs.cut()
    assert path.read_bytes() == b"0123456789"


# -- torn writes ------------------------------------------------------------------------------


def test_torn_write_mode_keeps_a_prefix_of_the_last_unsynced_write(fs: PowerFS) -> None:
    durable = b"D" * 3000
    path = durable_file(fs, "wal", durable)
    write(path, b"lost entirely\n", append=True)
    last = bytes(random.Random(1).randrange(256) for _ in range(1000))
    write(path, last, append=True)
    report = fs.cut(torn=True, seed=42)
    (torn,) = report["torn_writes"]
    kept = choose_torn_prefix(1000, seed=42, path="wal")
    assert torn == {"path": "wal", "offset": 3014, "bytes": 1000, "kept_bytes": kept}
    assert 0 < kept < 1000
    data = path.read_bytes()
    assert data[:3000] == durable
    assert data[3000:3014] == bytes(14), "earlier unsynced bytes are lost (the gap reads zero)"
    assert data[3014:] == last[:kept]


def test_torn_prefixes_are_chosen_by_the_seed() -> None:
    picks = {seed: choose_torn_prefix(4096, seed=seed, path="raft.journal") for seed in range(20)}
    assert picks == {seed: choose_torn_prefix(4096, seed=seed, path="raft.journal")
                     for seed in range(20)}
    assert len(set(picks.values())) > 10 and all(0 < k < 4096 for k in picks.values())
    assert choose_torn_prefix(1, seed=0, path="x") == 0


def test_without_torn_mode_no_part_of_an_unsynced_write_survives(fs: PowerFS) -> None:
    path = durable_file(fs, "wal", b"D" * 100)
    write(path, b"X" * 1000, append=True)
    assert fs.cut()["torn_writes"] == []
    assert path.read_bytes() == b"D" * 100


# -- open handles, mmap, locks ----------------------------------------------------------------


def test_handles_opened_before_a_cut_fail_with_eio(fs: PowerFS) -> None:
    path = durable_file(fs, "f", b"abc")
    fd = os.open(path, os.O_RDWR)
    try:
        assert os.pread(fd, 3, 0) == b"abc"  # now in the kernel's page cache
        fs.cut()
        for operation in (lambda: os.pread(fd, 3, 0), lambda: os.write(fd, b"x"),
                          lambda: os.fsync(fd), lambda: os.ftruncate(fd, 0)):
            with pytest.raises(OSError) as caught:
                operation()
            assert caught.value.errno == errno.EIO
    finally:
        os.close(fd)
    assert path.read_bytes() == b"abc"


def test_a_mapping_made_before_a_cut_faults_with_sigbus(fs: PowerFS) -> None:
    path = durable_file(fs, "m", b"A" * 8192)
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import mmap, sys
            f = open(sys.argv[1], "rb")
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            print(m[:4].decode(), flush=True)
            sys.stdin.readline()
            print(m[:4].decode(), flush=True)
        """), str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "AAAA\n"
        fs.cut()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == -signal.SIGBUS
    finally:
        child.kill()
        child.wait(timeout=30)
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()


def test_an_unlinked_open_file_stays_usable_until_closed(fs: PowerFS) -> None:
    path = durable_file(fs, "f", b"abc")
    with open(path, "rb+") as f:
        os.unlink(path)
        fsync_dir(mnt(fs))
        f.seek(0, os.SEEK_END)
        f.write(b"def")
        f.flush()
        os.fsync(f.fileno())
        f.seek(0)
        assert f.read() == b"abcdef"
        f.truncate(2)
        f.seek(0)
        assert f.read() == b"ab"
    assert not path.exists()
    assert os.listdir(disk(fs) / ".powerfs-orphans") == []
    fs.cut()
    assert not path.exists()


def test_mmap_reads_and_shared_mmap_writes_with_msync(fs: PowerFS) -> None:
    path = durable_file(fs, "journal", bytes(2 * mmap.PAGESIZE))
    with open(path, "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 0)
        try:
            assert mapped[:4] == bytes(4)
            mapped[0:5] = b"hello"
            mapped.flush()  # msync: what PySyncObj's journal does after each write
            mapped[mmap.PAGESIZE : mmap.PAGESIZE + 5] = b"later"  # never flushed
        finally:
            mapped.close()
    assert path.read_bytes()[:5] == b"hello"
    fs.cut()
    data = path.read_bytes()
    assert data[:5] == b"hello"
    assert data[mmap.PAGESIZE : mmap.PAGESIZE + 5] == bytes(5)


def test_fcntl_and_flock_locks_work_between_processes(fs: PowerFS) -> None:
    path = durable_file(fs, "lock", b"")
    other = textwrap.dedent(f"""
        import fcntl, sys
        f = open({str(path)!r}, "rb+")
        for lock in (lambda: fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB),
                     lambda: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)):
            try:
                lock()
                print("got", flush=True)
            except OSError:
                print("busy", flush=True)
    """)
    with open(path, "rb+") as f:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True,
                              timeout=30, check=True)
    assert done.stdout.split() == ["busy", "busy"]


def test_stat_statvfs_readdir_symlinks_and_hard_links(fs: PowerFS) -> None:
    root = mnt(fs)
    (root / "sub").mkdir(mode=0o750)
    durable_file(fs, "sub/f", b"12345")
    os.symlink("sub/f", root / "link")
    os.link(root / "sub" / "f", root / "hard")
    fsync_dir(root)
    assert sorted(os.listdir(root)) == ["hard", "link", "sub"]
    assert (root / "link").read_bytes() == b"12345"
    assert os.stat(root / "hard").st_nlink == 2
    assert os.stat(root / "hard").st_ino == os.stat(root / "sub" / "f").st_ino
    assert oct(os.stat(root / "sub").st_mode & 0o777) == oct(0o750)
    vfs = os.statvfs(root)
    assert vfs.f_bsize > 0 and vfs.f_blocks > 0 and vfs.f_namemax == 255
    fs.cut()
    assert os.readlink(root / "link") == "sub/f"
    assert os.stat(root / "hard").st_nlink == 2
    assert os.path.samefile(disk(fs) / "hard", disk(fs) / "sub" / "f")


def test_utimes_including_now_and_omit_and_their_durability(fs: PowerFS) -> None:
    path = durable_file(fs, "f", b"x")
    os.utime(path, ns=(1_500_000_000_123_456_789, 1_600_000_000_987_654_321))
    assert os.stat(path).st_mtime_ns == 1_600_000_000_987_654_321
    subprocess.run(["touch", "-a", str(path)], check=True, timeout=30)  # mtime: UTIME_OMIT
    st = os.stat(path)
    assert st.st_mtime_ns == 1_600_000_000_987_654_321
    assert abs(st.st_atime_ns - time.time_ns()) < 60 * 10**9  # atime: UTIME_NOW
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    os.utime(path)  # now, never synced
    fs.cut()
    assert os.stat(path).st_mtime_ns == 1_600_000_000_987_654_321


def test_killing_the_daemon_is_a_cut_and_a_restart_serves_the_durable_state(
    fs: PowerFS,
) -> None:
    durable_file(fs, "kept", b"kept")
    write(mnt(fs) / "kept", b" and more", append=True)
    write(mnt(fs) / "lost", b"lost")
    fs.kill()
    assert not mounted(fs.mountpoint)
    fs.start()
    assert (mnt(fs) / "kept").read_bytes() == b"kept"
    assert not (mnt(fs) / "lost").exists()


def test_a_clean_unmount_syncs_everything(fs: PowerFS) -> None:
    (mnt(fs) / "d").mkdir()
    write(mnt(fs) / "d" / "f", b"unsynced")
    fs.stop()
    assert (disk(fs) / "d" / "f").read_bytes() == b"unsynced"
    assert not (disk(fs) / ".powerfs-orphans").exists()
    fs.start()
    assert (mnt(fs) / "d" / "f").read_bytes() == b"unsynced"


# -- size and speed ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_many_files_in_nested_directories(fs: PowerFS) -> None:
    root = mnt(fs)
    expected: dict[str, bytes] = {}
    for d in range(10):
        (root / f"d{d}").mkdir()
        for i in range(50):
            data = f"file {d}/{i}\n".encode() * (i + 1)
            write(root / f"d{d}" / f"f{i}", data, sync=True)
            expected[f"d{d}/f{i}"] = data
        fsync_dir(root / f"d{d}")
    fsync_dir(root)
    for d in range(10):
        for i in range(50, 70):
            write(root / f"d{d}" / f"f{i}", b"unsynced")
    assert len(list(root.rglob("f*"))) == 700
    fs.cut()
    found = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("f*")}
    assert found == expected


@pytest.mark.timeout(120)
def test_a_10_mb_file_survives_a_cut_intact(fs: PowerFS) -> None:
    data = random.Random(10).randbytes(10 * MiB)
    path = mnt(fs) / "big"
    write(path, data, sync=True)
    fsync_dir(mnt(fs))
    write(path, b"tail that is not synced", append=True)
    assert hashlib.sha256(path.read_bytes()[: len(data)]).digest() == hashlib.sha256(data).digest()
    fs.cut()
    assert path.stat().st_size == 10 * MiB
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert hashlib.sha256((disk(fs) / "big").read_bytes()).digest() == hashlib.sha256(data).digest()


@pytest.mark.timeout(300)
def test_throughput_50_mb_with_an_fsync_every_mb(
    fs: PowerFS, capsys: pytest.CaptureFixture[str],
) -> None:
    chunk = random.Random(50).randbytes(MiB)
    path = mnt(fs) / "stream"
    started = time.monotonic()
    with open(path, "wb", buffering=0) as f:
        for _ in range(50):
            for offset in range(0, MiB, 128 * 1024):
                f.write(chunk[offset : offset + 128 * 1024])
            os.fsync(f.fileno())
    elapsed = time.monotonic() - started
    fsync_dir(mnt(fs))
    read_started = time.monotonic()
    with open(path, "rb", buffering=0) as f:
        while f.read(MiB):
            pass
    read_elapsed = time.monotonic() - read_started
    with capsys.disabled():
        print(f"\npowerfs throughput: write+fsync {50 / elapsed:.1f} MB/s "
              f"({elapsed:.2f} s for 50 MB, fsync every 1 MB, 128 KiB writes); "
              f"read {50 / read_elapsed:.1f} MB/s")
    fs.cut()
    assert path.stat().st_size == 50 * MiB


PYSYNCOBJ_WRITER = textwrap.dedent("""
    import sys, time
    from pysyncobj.journal import createJournal
    journal = createJournal(sys.argv[1])
    if sys.argv[2] == "create":
        journal._destroy()  # msync and close: the file's content is durable, its name is not
        sys.exit(0)
    for i in range(1, 101):
        journal.add(b"command-%d" % i * 5, i, 1)
        journal.flush()  # msync of the shared mapping
    journal.setCurrentTerm(7, "node-2")  # written to a .tmp file and renamed, never fsynced
    print("done", flush=True)
    time.sleep(60)
""")


@pytest.mark.timeout(120)
def test_pysyncobj_journal_on_the_mount_keeps_msynced_entries_but_not_its_meta(
    fs: PowerFS,
) -> None:
    """PySyncObj's FileJournal writes through a shared mmap (resized as it grows) and msyncs.

    What survives a cut shows what its storage makes durable: entries flushed by msync do,
    once the journal's name is durable (PySyncObj never fsyncs the directory: here the test
    does it); the term and vote in `.meta` do not (never fsynced), which DESIGN.md §8.1 fixes.
    """
    from pysyncobj.journal import createJournal

    path = str(mnt(fs) / "raft.journal")
    run = [sys.executable, "-c", PYSYNCOBJ_WRITER, path]
    subprocess.run([*run, "create"], check=True, timeout=30)
    fs.cut()
    assert not os.path.exists(path), "a journal whose directory was never fsynced is lost"
    subprocess.run([*run, "create"], check=True, timeout=30)
    fsync_dir(mnt(fs))
    writer = subprocess.Popen([*run, "write"], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "done\n"
    finally:
        writer.kill()
        writer.wait(timeout=30)
        if writer.stdout is not None:
            writer.stdout.close()
    assert os.path.exists(path + ".meta")
    fs.cut()
    journal = createJournal(path)
    try:
        assert len(journal) == 100
        assert journal[99] == (b"command-100" * 5, 100, 1)
        assert journal.getCurrentTerm() == 0 and not os.path.exists(path + ".meta")
    finally:
        journal._destroy()


# -- the demo: SQLite on the mount ------------------------------------------------------------

SQLITE_WRITER = textwrap.dedent("""
    import sqlite3, sys
    con = sqlite3.connect(sys.argv[1], isolation_level=None)
    con.execute("PRAGMA synchronous=" + sys.argv[2])
    for i in range(1, 100_000):
        con.execute("BEGIN")
        con.execute("INSERT INTO acks (id, payload) VALUES (?, ?)", (i, "x" * 200))
        con.execute("COMMIT")
        print(i, flush=True)  # acknowledged: the commit returned
""")
SQLITE_ACKS = 150


def _sqlite_acks_then_power_cut(fs: PowerFS, synchronous: str) -> tuple[list[int], list[int]]:
    """Commit transactions in a child until SQLITE_ACKS are acknowledged, then kill it and cut
    the power; returns (acknowledged ids, ids found afterwards)."""
    import sqlite3

    db = mnt(fs) / "acks.db"
    with sqlite3.connect(db, isolation_level=None) as setup:
        assert setup.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
        setup.execute("PRAGMA synchronous=FULL")
        setup.execute("CREATE TABLE acks (id INTEGER PRIMARY KEY, payload TEXT)")
    setup.close()
    fsync_dir(mnt(fs))  # the installer makes the new database's name durable
    writer = subprocess.Popen([sys.executable, "-c", SQLITE_WRITER, str(db), synchronous],
                              stdout=subprocess.PIPE, text=True)
    acked: list[int] = []
    try:
        deadline = time.monotonic() + 60
        assert writer.stdout is not None
        while len(acked) < SQLITE_ACKS and time.monotonic() < deadline:
            line = writer.stdout.readline()
            if not line:
                break
            acked.append(int(line))
    finally:
        writer.kill()  # power loss: the process dies with the machine...
        writer.wait(timeout=30)
        if writer.stdout is not None:
            writer.stdout.close()
    fs.cut()  # ...and so does everything the disk had not made durable
    assert len(acked) == SQLITE_ACKS, "the writer did not get far enough"
    with sqlite3.connect(db) as after:
        assert after.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        found = [row[0] for row in after.execute("SELECT id FROM acks ORDER BY id")]
    after.close()
    return acked, found


@pytest.mark.timeout(120)
def test_sqlite_wal_with_synchronous_full_loses_no_committed_transaction(fs: PowerFS) -> None:
    acked, found = _sqlite_acks_then_power_cut(fs, "FULL")
    assert set(acked) <= set(found)
    assert found == list(range(1, len(found) + 1))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("synchronous", ["OFF", "NORMAL"])
def test_sqlite_wal_without_synchronous_full_loses_committed_transactions(
    fs: PowerFS, synchronous: str,
) -> None:
    # OFF never syncs; NORMAL in WAL mode syncs only at checkpoints (none in 150 small commits).
    acked, found = _sqlite_acks_then_power_cut(fs, synchronous)
    lost = set(acked) - set(found)
    assert lost, f"synchronous={synchronous} did not fsync the commits, so a cut must lose some"
    assert found == list(range(1, len(found) + 1)), "what survives is a prefix"
