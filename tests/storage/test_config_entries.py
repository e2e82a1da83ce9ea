"""The Raft configuration a node's own log holds (cluster/storage/configlog.py and the log's
index of configuration entries): what a restarted node and a snapshot's voters come from."""

from __future__ import annotations

import pysyncobj.pickle as pysyncobj_pickle
from pysyncobj.node import TCPNode

from raftcron.cluster.storage import configlog

from .logmodel import Place

A, B, C, D = "10.0.0.1:7001", "10.0.0.2:7001", "10.0.0.3:7001", "10.0.0.4:7001"


def change(kind: str, address: str) -> bytes:
    """A configuration entry's command as PySyncObj writes it."""
    return b"\x02" + pysyncobj_pickle.dumps([kind, address, TCPNode(address)])


def test_configuration_entries_are_decoded_and_other_entries_are_not() -> None:
    assert configlog.decode(change("add", D)) == ("add", D)
    assert configlog.decode(change("rem", A)) == ("rem", A)
    assert configlog.decode(b"\x00" + pysyncobj_pickle.dumps((0, (b"x",)))) is None
    assert configlog.decode(b"\x02not a pickle") is None


def test_undo_is_the_inverse_of_apply() -> None:
    changes = [("add", D), ("rem", A), ("rem", B), ("add", A)]
    after = configlog.apply([A, B, C], changes)
    assert after == [A, C, D]
    assert configlog.undo(after, changes) == [A, B, C]


def test_the_log_knows_its_configuration_entries_across_truncation_compaction_and_reload(
        tmp_path: object) -> None:
    place = Place.in_memory()
    log = place.open()
    commands = {1: b"\x01", 2: change("add", D), 3: b"\x00x", 4: change("rem", A),
                5: b"\x00y", 6: change("add", A)}
    for index, command in commands.items():
        log.append(index, 1, command)
    assert log.config_indexes == [2, 4, 6]
    log.truncate_from(6)
    log.sync()
    assert log.config_indexes == [2, 4]
    log.compact_to(3)
    log.sync()
    assert log.config_indexes == [4]
    log = place.crash(log)
    assert log.config_indexes == [4]
    assert configlog.changes_after(3, log.config_indexes, log.command_at) == [("rem", A)]
    assert configlog.changes_after(4, log.config_indexes, log.command_at) == []
