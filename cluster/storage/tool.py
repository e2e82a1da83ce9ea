"""`raftcron storage check | repair | migrate --config FILE`: the data dir, offline.

- ``check`` reads everything a start would read and changes nothing: exit 0 when the node
  would start as it is, 1 when something is damaged (named: file, offset, what), 2 when the
  data dir cannot be read at all (in use by a running node, not raftcron's, 0.1.0 format).
  A torn last batch is not damage (the node cuts it at start) but is reported.
- ``repair`` cuts a torn last batch, as a start would, and says what it cut. Damage inside
  the log is left alone unless ``--discard-after-damage`` is given: then the log is cut at the
  damaged batch, everything after it is dropped, and this node must catch up from its peers.
- ``migrate`` turns a 0.1.0 data dir (PySyncObj's journal, meta and dump) into this format,
  and keeps the old files under ``legacy-0.1.0/``.
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
from pathlib import Path
from typing import Any

from raftcron.cluster.storage import datadir as datadir_module
from raftcron.cluster.storage import records
from raftcron.cluster.storage.disk import OsDisk
from raftcron.cluster.storage.journal import disagreement
from raftcron.cluster.storage.raftlog import (
    LogDamaged,
    RaftLog,
    StorageError,
    segment_name,
    segment_number,
)
from raftcron.cluster.storage.snapshots import SNAPSHOT_NAME, decode, encode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (("check", "read the data dir and report damage (changes nothing)"),
                       ("repair", "cut a torn tail (and, if told, everything after damage)"),
                       ("migrate", "convert a raftcron 0.1.0 data dir to this format")):
        action = actions.add_parser(name, help=text)
        action.add_argument("--config", default=os.environ.get("RAFTCRON_CONFIG"),
                            help="the node's TOML config (env RAFTCRON_CONFIG); without "
                            "one, the node's RAFTCRON_* variables alone, as `raftcron node`")
        if name == "repair":
            action.add_argument("--discard-after-damage", action="store_true",
                                help="cut the log at damage too; this node then catches up "
                                     "from its peers")


def run(args: argparse.Namespace) -> int:
    from raftcron.cluster import config as configuration

    try:
        config = configuration.load(args.config or None)
    except configuration.ConfigError as error:
        print(f"raftcron storage: config error: {error}", file=sys.stderr)
        return 2
    directory, node_id = str(config.data_dir), config.node_id
    try:
        if args.action == "check":
            return check(directory, node_id)
        if args.action == "repair":
            return repair(directory, node_id, discard_after_damage=args.discard_after_damage)
        return migrate(directory, node_id)
    except StorageError as error:
        print(f"raftcron storage {args.action}: {error}", file=sys.stderr)
        return 2


def _lock(directory: str) -> int:
    if not os.path.isdir(directory):
        raise StorageError(f"{directory} does not exist")
    names = os.listdir(directory)
    if datadir_module.MARK_NAME not in names and not datadir_module.holds_storage(names):
        legacy = [name for name in datadir_module.LEGACY_NAMES if name in names]
        if legacy:
            raise datadir_module.LegacyDataDir(
                f"{directory} holds a raftcron 0.1.0 data dir ({', '.join(legacy)}); run "
                f"`raftcron storage migrate --config <node.toml>`")
        raise StorageError(f"{directory} holds no raftcron data dir")
    return datadir_module._lock(directory)


def check(directory: str, node_id: str) -> int:
    lock_fd = _lock(directory)
    try:
        names = sorted(os.listdir(directory))
        try:
            _open_checked(directory, node_id, names)
            log = RaftLog(directory, read_only=True)
            snapshot_path = os.path.join(directory, SNAPSHOT_NAME)
            snapshot = decode(Path(snapshot_path).read_bytes(), snapshot_path) \
                if os.path.exists(snapshot_path) else None
            problem = disagreement(log, snapshot, snapshot_path)
            if problem is not None:
                raise problem
        except LogDamaged as damage:
            print(f"DAMAGED {damage.path}: {damage.problem}")
            return 1
        print(f"data dir {directory}: node {node_id}, {log.report.segments} segment(s), "
              f"entries {log.first_index}..{log.last_index}, term {log.term}, "
              f"voted for {log.voted_for or '-'}, commit {log.commit_index}")
        if snapshot is not None:
            print(f"snapshot: index {snapshot.index}, term {snapshot.term}, "
                  f"{os.path.getsize(snapshot_path)} bytes")
        if log.report.torn_segment:
            print(f"torn tail: {log.report.torn_bytes_cut} bytes at the end of "
                  f"{log.report.torn_segment} ({log.report.torn_problem}); the node cuts it "
                  f"at start (or `raftcron storage repair`)")
        print("OK")
        return 0
    finally:
        os.close(lock_fd)


def _open_checked(directory: str, node_id: str, names: list[str]) -> None:
    mark = os.path.join(directory, datadir_module.MARK_NAME)
    if datadir_module.MARK_NAME not in names:
        if datadir_module.holds_storage(names):
            raise LogDamaged(mark, "is missing, but the data dir holds a log or a snapshot")
        return
    if datadir_module._check_mark(OsDisk(), mark, node_id)[0] and \
            not datadir_module.holds_log(names):
        raise LogDamaged(os.path.join(directory, segment_name(1)), "is missing: the data dir "
                                                                   "holds no log segment")


def repair(directory: str, node_id: str, *, discard_after_damage: bool) -> int:
    lock_fd = _lock(directory)
    try:
        numbers = sorted(n for n in map(segment_number, os.listdir(directory)) if n is not None)
        sequence: int | None = None
        for position, number in enumerate(numbers):
            path = os.path.join(directory, segment_name(number))
            data = Path(path).read_bytes()
            scan = records.scan(data, 0, sequence)
            newest = position == len(numbers) - 1
            if scan.problem is None:
                sequence = scan.batches[-1].sequence if scan.batches else sequence
                continue
            if (scan.damaged or not newest) and not discard_after_damage:
                print(f"DAMAGED {path}: {scan.problem}; not cut (--discard-after-damage cuts "
                      f"it and everything after it)")
                return 1
            with open(path, "r+b") as file:
                file.truncate(scan.good_end)
                file.flush()
                os.fsync(file.fileno())
            print(f"cut {path} at offset {scan.good_end}: {len(data) - scan.good_end} bytes "
                  f"({scan.problem})")
            for later in numbers[position + 1:]:
                os.replace(os.path.join(directory, segment_name(later)),
                           os.path.join(directory, segment_name(later) + ".discarded"))
                print(f"set aside {segment_name(later)} as {segment_name(later)}.discarded")
            clean = os.path.join(directory, "log.clean")
            if os.path.exists(clean):
                os.unlink(clean)
            break
        else:
            print("nothing to repair")
        return 0
    finally:
        os.close(lock_fd)


def migrate(directory: str, node_id: str) -> int:
    """0.1.0 -> this format: entries, term, vote, commit index and the dump's snapshot."""
    import pysyncobj.journal as library_journal
    import pysyncobj.pickle as library_pickle

    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    if datadir_module.MARK_NAME in names:
        print(f"{directory} is already in this format; nothing to migrate")
        return 0
    if "raft.journal" not in names:
        raise StorageError(f"{directory} holds no raftcron 0.1.0 journal (raft.journal)")
    journal = library_journal.FileJournal(os.path.join(directory, "raft.journal"))
    entries = [journal[i] for i in range(len(journal))]
    term, vote, commit = journal.getCurrentTerm(), journal.getVotedForNodeId(), \
        journal.getRaftCommitIndex()
    journal._destroy()
    snapshot_body: dict[str, Any] | None = None
    if "raft.dump" in names:
        with gzip.open(os.path.join(directory, "raft.dump"), "rb") as dump:
            data = library_pickle.loads(dump.read())
        consumers, last, prev, cluster = data
        state = consumers[1]["snapshot"]
        snapshot_body = {"prev": list(prev), "last": list(last), "state": bytes(state),
                         "cluster": sorted(str(getattr(n, "id", n)) for n in cluster)}
    legacy = os.path.join(directory, "legacy-0.1.0")
    os.makedirs(legacy, exist_ok=True)
    for name in datadir_module.LEGACY_NAMES:
        if name in names:
            os.replace(os.path.join(directory, name), os.path.join(legacy, name))
    data_dir = datadir_module.open_data_dir(directory, node_id)
    try:
        if snapshot_body is not None:
            last_entry = snapshot_body["last"]
            OsDisk().write_file(os.path.join(directory, SNAPSHOT_NAME),
                                encode(last_entry[1], last_entry[2], snapshot_body), sync=True)
        log = RaftLog(directory)
        for command, index, entry_term in entries:
            log.append(index, entry_term, bytes(command))
        log.term, log.voted_for = term, vote
        log.set_hard_state(term, vote)
        log.set_commit(commit)
        log.ensure_segment()
        log.sync()
        log.close(clean=True)
        data_dir.mark_initialised(OsDisk())
        OsDisk().sync_dir(directory)
    finally:
        data_dir.release()
    print(f"migrated {directory}: {len(entries)} log entries, term {term}, commit {commit}"
          f"{', and the snapshot' if snapshot_body else ''}; the 0.1.0 files are in {legacy}")
    return 0
