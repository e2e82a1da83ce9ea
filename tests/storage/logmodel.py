"""What the storage tests share: a place to keep a log (a real folder or a SimDisk), and a
plain-Python model of what a `RaftLog` holds, to compare a reloaded log against."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from raftcron.chaos.sim.disk import SimDisk
from raftcron.cluster.storage.disk import Disk, OsDisk
from raftcron.cluster.storage.raftlog import RaftLog


@dataclass
class Place:
    """A folder on some disk where a log lives across reloads."""

    disk: Disk
    directory: str
    segment_bytes_max: int = 64 << 20
    cache_bytes_max: int = 32 << 20
    durable: bool = True

    @staticmethod
    def on_os(directory: str, **settings: int | bool) -> Place:
        return Place(OsDisk(), directory, **settings)  # type: ignore[arg-type]

    @staticmethod
    def in_memory(**settings: int | bool) -> Place:
        disk = SimDisk()
        disk.makedirs("/node")
        return Place(disk, "/node", **settings)  # type: ignore[arg-type]

    @property
    def sim(self) -> SimDisk:
        assert isinstance(self.disk, SimDisk)
        return self.disk

    def open(self) -> RaftLog:
        return RaftLog(self.directory, durable=self.durable, disk=self.disk,
                       segment_bytes_max=self.segment_bytes_max,
                       cache_bytes_max=self.cache_bytes_max)

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def segments(self) -> list[str]:
        return [name for name in self.disk.listdir(self.directory) if name.endswith(".seg")]

    def crash(self, log: RaftLog) -> RaftLog:
        """kill -9 and start again: nothing is synced or marked on the way down."""
        if isinstance(self.disk, SimDisk):
            self.disk.crash()
        log.close(clean=False)
        return self.open()

    @contextmanager
    def reopened(self, log: RaftLog, *, clean: bool = True) -> Iterator[RaftLog]:
        log.close(clean=clean)
        again = self.open()
        try:
            yield again
        finally:
            again.close(clean=False)


Entry = tuple[int, int, bytes]  # index, term, command


def entries(log: RaftLog) -> list[Entry]:
    if not len(log):
        return []
    return [(index, log.term_at(index), log.command_at(index))
            for index in range(log.first_index, log.last_index + 1)]


def command(index: int, term: int, size: int = 24) -> bytes:
    seed = f"{index}/{term}:".encode()
    return (seed * (size // len(seed) + 1))[:size]


def fill(log: RaftLog, first: int, last: int, term: int, *, sync_each: bool = False,
         size: int = 24) -> None:
    for index in range(first, last + 1):
        log.append(index, term, command(index, term, size))
        if sync_each:
            log.sync()
    log.sync()


def expected(first: int, last: int, term: int, size: int = 24) -> list[Entry]:
    return [(index, term, command(index, term, size)) for index in range(first, last + 1)]


@dataclass(frozen=True)
class Image:
    """What a log holds, as plain values."""

    entries: tuple[Entry, ...] = ()
    term: int = 0
    voted_for: str | None = None
    commit: int = 0

    @staticmethod
    def of(log: RaftLog) -> Image:
        return Image(tuple(entries(log)), log.term, log.voted_for, log.commit_index)


@dataclass
class LogModel:
    """The log as a plain list, and its image at the last sync: what a power cut must leave."""

    live: list[Entry] = field(default_factory=list)
    term: int = 0
    voted_for: str | None = None
    commit: int = 0
    durable: Image = field(default_factory=Image)

    def image(self) -> Image:
        return Image(tuple(self.live), self.term, self.voted_for, self.commit)

    def next_index(self, after_reset: int = 1) -> int:
        return self.live[-1][0] + 1 if self.live else after_reset

    def truncate_from(self, index: int) -> None:
        self.live = [entry for entry in self.live if entry[0] < index]

    def compact_to(self, index: int) -> None:
        self.live = [entry for entry in self.live if entry[0] >= index]

    def synced(self) -> None:
        self.durable = self.image()
