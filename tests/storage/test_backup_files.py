"""Backup files (cluster/ops/backup.py) without a cluster: what a backup says of itself, and what a
restore writes and prints, the cluster's name above all (DESIGN.md §8.4: a backup carries its
cluster identity)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from raftcron.cluster.ops import backup
from raftcron.cluster.storage import snapshots
from raftcron.scheduler import snapshot as core_snapshot
from raftcron.scheduler.state import SchedulerState

PREV, LAST = (b"\x01", 9, 2), (b"\x01", 10, 2)


def backup_file(cluster_name: str | None) -> bytes:
    """A backup as a node of the cluster `cluster_name` serves it (None: an older release's)."""
    body: dict[str, object] = {} if cluster_name is None else {"cluster_name": cluster_name}
    body |= {"prev": list(PREV), "last": list(LAST), "cluster": ["127.0.0.1:7001"],
             "state": core_snapshot.snapshot(SchedulerState())}
    return b"".join(snapshots.encode(10, 2, body))


def node_config(folder: Path, cluster_name: str) -> Path:
    path = folder / "n1.toml"
    path.write_text(f'node_id = "n1"\nraft_address = "127.0.0.1:7001"\n'
                    f'http_address = "127.0.0.1:8001"\ndata_dir = "data"\n\n'
                    f'[cluster]\nname = "{cluster_name}"\n')
    return path


def test_a_backup_says_which_cluster_it_came_from() -> None:
    _, info = backup.check(backup_file("prod"), "b")
    assert info.cluster_name == "prod" and info.index == 10
    _, older = backup.check(backup_file(None), "b")
    assert older.cluster_name is None  # a release before cluster names: unknown


def test_a_restored_node_names_its_own_cluster_and_says_when_the_backup_is_of_another(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "prod.backup").write_bytes(backup_file("prod"))
    args = argparse.Namespace(source=str(tmp_path / "prod.backup"),
                              config=node_config(tmp_path, "staging"), archive=None,
                              without_archive=False)
    assert backup.run_restore(args) == 0
    printed = capsys.readouterr().out
    assert "of cluster staging from a backup of cluster prod" in printed
    assert "note: the backup is of cluster prod, but this node's config names cluster " \
           "staging" in printed
    restored = (tmp_path / "data" / snapshots.SNAPSHOT_NAME).read_bytes()
    _, info = backup.check(restored, "restored")
    assert info.cluster_name == "staging"  # a clone is a cluster of its own
    assert snapshots.cluster_name_in(restored) == "staging"


@pytest.mark.parametrize("backup_of, note", [("prod", None), (None, "names no cluster")])
def test_a_restore_notes_a_backup_of_no_known_cluster_but_not_one_of_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], backup_of: str | None,
        note: str | None) -> None:
    (tmp_path / "b.backup").write_bytes(backup_file(backup_of))
    args = argparse.Namespace(source=str(tmp_path / "b.backup"),
                              config=node_config(tmp_path, "prod"), archive=None,
                              without_archive=False)
    assert backup.run_restore(args) == 0
    printed = capsys.readouterr().out
    assert f"from a backup of cluster {backup_of or 'unknown'}" in printed
    assert ("note:" in printed) == (note is not None)
    assert note is None or note in printed
