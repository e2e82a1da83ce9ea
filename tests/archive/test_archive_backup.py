"""A backup's archive as a file (cluster/archive/copies.py, cluster/ops/backup.py): a copy made
while the archive is written is the archive whole; a damaged archive, one of another schema, or one
of another backup is refused by the check and by a restore, which then leaves the data dir
empty; a restore keeps the jobs that left the state up to the snapshot's index, and a restore
that fails while writing leaves nothing behind."""

from __future__ import annotations

import argparse
import os
import sqlite3
import threading
from pathlib import Path

import pytest
from archives import backup_file, job, make_archive, node_config

from raftcron.cluster.archive.copies import (
    COPY_NAME,
    ArchiveCopier,
    check_file,
    mark_backup_of,
    remove_leftovers,
)
from raftcron.cluster.archive.store import ARCHIVE_NAME, ArchiveError, ArchiveStore, Row
from raftcron.cluster.ops import backup
from raftcron.cluster.storage.raftlog import RaftLog
from raftcron.cluster.storage.snapshots import SNAPSHOT_NAME
from raftcron.scheduler.snapshot import digest, restore


def copied(directory: Path, out: Path) -> Path:
    """A copy of the archive in `directory`, as the backup route makes and streams it."""
    archive, handle = ArchiveCopier(str(directory)).copy()
    with handle:
        out.write_bytes(handle.read())
    assert archive.size_bytes == out.stat().st_size
    return out


def test_a_copy_made_while_the_archive_is_written_is_the_archive_as_of_one_commit(
        tmp_path: Path) -> None:
    node = tmp_path / "node"
    make_archive(node, {n: n for n in range(1, 201)}, payload_bytes=500)
    store = ArchiveStore(str(node))
    stop = threading.Event()

    def write_more() -> None:  # the node's writer goes on meanwhile, in batches of 50
        next_id = 1_000
        while not stop.is_set():
            store.write([Row.of_view(job(next_id + n), 300) for n in range(50)], 300)
            next_id += 50

    writer = threading.Thread(target=write_more)
    writer.start()
    try:
        copies = [check_file(str(copied(node, tmp_path / f"copy{n}"))) for n in range(5)]
    finally:
        stop.set()
        writer.join(30)
        store.close()
    for archive in copies:
        db = sqlite3.connect(archive.path)
        try:
            counted = db.execute("SELECT count(*) FROM jobs").fetchone()[0]
        finally:
            db.close()
        # Whole batches only, and the totals kept beside the rows are the rows'.
        assert counted == archive.rows and (counted - 200) % 50 == 0, archive
    assert not [name for name in os.listdir(node) if name.startswith(COPY_NAME)]


def test_a_copy_left_by_a_node_that_stopped_is_removed(tmp_path: Path) -> None:
    (tmp_path / COPY_NAME).write_bytes(b"half a copy")
    (tmp_path / (COPY_NAME + "-journal")).write_bytes(b"")
    remove_leftovers(str(tmp_path))
    assert os.listdir(tmp_path) == []


def damage(data: bytes, how: str) -> bytes:
    if how == "a_page_overwritten":
        return data[:4096 * 5] + b"\xff" * 4096 + data[4096 * 6:]
    if how == "cut_in_half":
        return data[:len(data) // 2]
    if how == "not_sqlite":
        return b"{}" * 40
    return b""


@pytest.mark.parametrize(("how", "said"), [
    ("a_page_overwritten", "is damaged"), ("cut_in_half", "is damaged"),
    ("not_sqlite", "is damaged, or not a SQLite file"), ("empty", "is empty")])
def test_a_damaged_archive_is_refused_naming_the_damage(tmp_path: Path, how: str,
                                                        said: str) -> None:
    make_archive(tmp_path / "node", {n: n for n in range(1, 301)}, payload_bytes=1_000)
    good = copied(tmp_path / "node", tmp_path / "good")
    assert check_file(str(good)).rows == 300
    bad = tmp_path / "bad"
    bad.write_bytes(damage(good.read_bytes(), how))
    with pytest.raises(ArchiveError, match=said) as refused:
        check_file(str(bad))
    assert str(bad) in str(refused.value)


def test_an_archive_of_another_schema_or_no_archive_at_all_is_refused(tmp_path: Path) -> None:
    make_archive(tmp_path / "node", {1: 1})
    other = copied(tmp_path / "node", tmp_path / "other")
    db = sqlite3.connect(other)
    db.execute("UPDATE meta SET value = 99 WHERE name = 'schema'")
    db.commit()
    db.close()
    with pytest.raises(ArchiveError, match="is of schema 99; this release reads 1"):
        check_file(str(other))
    plain = tmp_path / "plain.sqlite"
    db = sqlite3.connect(plain)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    with pytest.raises(ArchiveError, match="not a raftcron archive"):
        check_file(str(plain))


# -- restore ----------------------------------------------------------------------------------


def backup_with_archive(tmp_path: Path, left_at: dict[int, int], *, mark: bool = True,
                        index: int = 10) -> Path:
    """FILE (a backup at log `index`) and FILE.archive beside it, as `backup --with-archive`
    writes them."""
    tmp_path.mkdir(exist_ok=True)
    out = tmp_path / "b.backup"
    out.write_bytes(backup_file(index))
    make_archive(tmp_path / "source", left_at)
    archive = copied(tmp_path / "source", tmp_path / "b.backup.archive")
    if mark:
        _, info = backup.check(out.read_bytes(), str(out))
        mark_backup_of(str(archive), backup.backup_mark(info))
    return out


def run_restore(tmp_path: Path, source: Path, *, archive: Path | None = None,
                without_archive: bool = False) -> int:
    return backup.run_restore(argparse.Namespace(
        source=str(source), config=node_config(tmp_path),
        archive=None if archive is None else str(archive), without_archive=without_archive))


def data_dir_is_empty(tmp_path: Path) -> bool:
    data = tmp_path / "data"
    return not data.exists() or not any(data.iterdir())


@pytest.mark.parametrize("how", ["a_page_overwritten", "cut_in_half", "not_sqlite"])
def test_a_restore_refuses_a_damaged_archive_and_leaves_the_data_dir_untouched(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str) -> None:
    source = backup_with_archive(tmp_path, {n: n for n in range(1, 301)})
    archive = tmp_path / "b.backup.archive"
    archive.write_bytes(damage(archive.read_bytes(), how))
    assert run_restore(tmp_path, source) == 1
    err = capsys.readouterr().err
    assert str(archive) in err and "is damaged" in err and "--without-archive" in err, err
    assert data_dir_is_empty(tmp_path)


def test_a_restore_refuses_the_archive_of_another_backup_or_one_of_no_backup(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = backup_with_archive(tmp_path, {1: 5})
    source.write_bytes(backup_file(index=12))  # FILE replaced, its old archive left beside it
    assert run_restore(tmp_path, source) == 1
    err = capsys.readouterr().err
    assert "belongs to another backup (of log index 10" in err and "log index 12" in err, err
    assert data_dir_is_empty(tmp_path)

    unmarked = backup_with_archive(tmp_path / "2", {1: 5}, mark=False)
    assert run_restore(tmp_path / "2", unmarked) == 1
    assert "names no backup" in capsys.readouterr().err
    assert data_dir_is_empty(tmp_path / "2")
    # Named on the command line, the operator vouches for it: restored, with a note.
    assert run_restore(tmp_path / "2", unmarked, archive=tmp_path / "2" / "b.backup.archive") == 0
    printed = capsys.readouterr().out
    assert "archive: 1 archived jobs restored" in printed and "note: the archive" in printed


def test_a_restore_keeps_the_jobs_that_left_up_to_the_snapshot_and_says_how_many(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Jobs 1-6 left at indexes up to the snapshot's (10); 7-9 after it (the archive is copied
    # after the snapshot): in the snapshot's state still, or made after it.
    source = backup_with_archive(tmp_path, {1: 3, 2: 3, 3: 7, 4: 9, 5: 10, 6: 10, 7: 11,
                                            8: 12, 9: 14})
    assert run_restore(tmp_path, source) == 0
    printed = capsys.readouterr().out
    assert ("archive: 6 archived jobs restored from " + str(source) + ".archive (3 that left "
            "the state after log index 10 left out)") in printed, printed
    store = ArchiveStore(str(tmp_path / "data"))
    try:
        assert [store.get(n) is not None for n in range(1, 10)] == [True] * 6 + [False] * 3
        totals = store.totals()
        assert totals["rows"] == 6 and totals["row_bytes"] == sum(
            Row.of_view(store.get(n) or {}, 0).bytes for n in range(1, 7))
        assert store.through_index() == 10
        assert store.db.execute("SELECT value FROM meta WHERE name = 'backup_of'"
                                ).fetchone() is None  # the node's own archive now
    finally:
        store.close()
    restored = (tmp_path / "data" / SNAPSHOT_NAME).read_bytes()
    _, info = backup.check(restored, "restored")
    assert info.index == 10 and info.digest == digest(restore(backup.check(
        backup_file(10), "b")[0].state))


def test_without_an_archive_a_restored_node_starts_with_an_empty_one_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = backup_with_archive(tmp_path, {1: 3})
    assert run_restore(tmp_path, source, without_archive=True) == 0
    assert "archive: none restored (--without-archive): the node's archive starts empty" in \
        capsys.readouterr().out
    assert not (tmp_path / "data" / ARCHIVE_NAME).exists()
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "b.backup").write_bytes(backup_file())
    assert run_restore(alone, alone / "b.backup") == 0
    assert f"archive: none restored (no {alone / 'b.backup'}.archive)" in capsys.readouterr().out


def test_a_restore_that_fails_while_writing_leaves_the_data_dir_empty(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    source = backup_with_archive(tmp_path, {1: 3, 2: 4})

    def disk_full(self: RaftLog) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(RaftLog, "sync", disk_full)  # after the archive and the snapshot
    assert run_restore(tmp_path, source) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert data_dir_is_empty(tmp_path)
    monkeypatch.undo()
    assert run_restore(tmp_path, source) == 0  # and a second try finds it empty
    assert "archive: 2 archived jobs restored" in capsys.readouterr().out
