"""The Raft configuration as a node's log and snapshot hold it (PySyncObj's format).

PySyncObj writes a configuration change as a log entry whose command is the byte
``_COMMAND_TYPE.MEMBERSHIP`` (2) and a pickle of ``['add' | 'rem', node id, node]``, where a
node's id is its Raft address; a snapshot carries the voters as of its last entry (our
snapshot's ``cluster`` list). With Raft's single-server changes a node's configuration is the
one the LATEST change in its log names, committed or not (it takes effect when appended). This
module reads those entries; it never writes any (PySyncObj does, `cluster.membership` asks it
to) and it acts on nothing.

Unpickling: only entries of this node's own log, which only members holding the cluster
password could have written (PySyncObj unpickles every entry it applies, too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pysyncobj.pickle as pysyncobj_pickle

from raftcron.cluster.storage.raftlog import CONFIG_COMMAND

ConfigChange = tuple[str, str]  # ("add" | "rem", raft address)


def decode(command: bytes) -> ConfigChange | None:
    """The change a log entry's command makes, None for any other entry."""
    if command[:1] != CONFIG_COMMAND:
        return None
    try:
        request = pysyncobj_pickle.loads(command[1:])
        kind, address = request[0], request[1]
    except Exception:  # not PySyncObj's format: nothing PySyncObj would apply either
        return None
    if kind not in ("add", "rem") or not isinstance(address, str):
        return None
    return kind, address


def apply(voters: Iterable[str], changes: Iterable[ConfigChange]) -> list[str]:
    """The voters after `changes` (oldest first), sorted."""
    result = set(voters)
    for kind, address in changes:
        if kind == "add":
            result.add(address)
        else:
            result.discard(address)
    return sorted(result)


def undo(voters: Iterable[str], changes: Iterable[ConfigChange]) -> list[str]:
    """The voters before `changes` (oldest first) were made, sorted."""
    result = set(voters)
    for kind, address in reversed(list(changes)):
        if kind == "add":
            result.discard(address)
        else:
            result.add(address)
    return sorted(result)


def changes_after(index: int, config_indexes: Iterable[int],
                  command_at: Callable[[int], bytes]) -> list[ConfigChange]:
    """The configuration changes of the log's entries after `index`, oldest first."""
    found = []
    for entry_index in config_indexes:
        if entry_index > index:
            change = decode(command_at(entry_index))
            if change is not None:
                found.append(change)
    return found
