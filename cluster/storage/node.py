"""`RaftStorage`: one node's storage, as PySyncObj is handed it.

It opens the data dir (lock, format mark), loads the log and the snapshot, makes them agree
(`journal.reconcile`) and then serves PySyncObj: the same object is given as ``journalFile``
and ``fullDumpFile`` of its ``SyncObjConf``, and `hooks` turns it into the journal and the
serializer (its path is the current snapshot's; the hooks load it at the first tick).

It also keeps what the rest of the node asks about the storage: whether it can write (a full
disk makes it unhealthy until a write succeeds again), free bytes, what loading found.
Durability modes: ``"fsync"`` (every batch fdatasync'ed before anything acts on it) and
``"os"`` (written to the page cache only: survives a process crash, not a power loss).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from raftcron.cluster.storage import configlog
from raftcron.cluster.storage.datadir import DataDir, open_data_dir
from raftcron.cluster.storage.disk import Disk, OsDisk
from raftcron.cluster.storage.journal import StorageJournal, reconcile
from raftcron.cluster.storage.raftlog import (
    SEGMENT_BYTES_MAX,
    Flight,
    LoadReport,
    RaftLog,
    StorageError,
    StorageUnavailable,
    SyncFailed,
)
from raftcron.cluster.storage.snapshots import SnapshotSource, SnapshotStore
from raftcron.cluster.storage.syncworker import SyncWorker
from raftcron.cluster.telemetry.histogram import Histogram

log = logging.getLogger("raftcron.storage")

DURABILITY_MODES = ("fsync", "os")
UNHEALTHY_LOG_EVERY_S = 5.0
# A compaction asked for by size is asked again at most this often (a snapshot takes seconds;
# asking at every sync while it is written would change nothing).
COMPACTION_ASK_EVERY_S = 5.0


class SlowSyncs:
    """The leader's stalled syncs: `STRIKES` syncs of over `bound_s` within `WINDOW_S` say
    its disk stalls, and a leader whose disk stalls hands leadership over (storage.hooks):
    every commit waits for the leader's own sync, so one sick disk slowed the whole cluster.
    `bound_s` is set by the node: the minimum election timeout, a stall the followers may
    already have stood for (a busy disk's occasional slow fsync is not a sick one)."""

    STRIKES = 3
    WINDOW_S = 5.0

    def __init__(self, bound_s: float = 0.4) -> None:
        self.bound_s = bound_s
        self._at: list[float] = []

    def observe(self, started_s: float, took_s: float) -> None:
        # Counted when the sync ended: back-to-back 2 s stalls counted at their starts were
        # never three within 5 s of the check that follows the third.
        ended_s = started_s + took_s
        if took_s > self.bound_s:
            self._at = [*(t for t in self._at if ended_s - t < self.WINDOW_S), ended_s]

    def stalling(self, now_s: float) -> bool:
        return sum(1 for t in self._at if now_s - t < self.WINDOW_S) >= self.STRIKES

    def forget(self) -> None:
        self._at = []


class StorageFatal(StorageError):
    """The storage cannot go on; the node must stop (the default `on_fatal` raises this)."""


def _raise(message: str) -> None:
    raise StorageFatal(message)


class RaftStorage(os.PathLike[str]):
    def __init__(self, directory: str | os.PathLike[str], *, node_id: str,
                 source: SnapshotSource, durability: str = "fsync", fork: bool = True,
                 disk: Disk | None = None, segment_bytes_max: int = SEGMENT_BYTES_MAX,
                 on_fatal: Callable[[str], None] = _raise,
                 monotonic: Callable[[], float] = time.monotonic,
                 rejoin_empty: bool = False, cluster_name: str | None = None,
                 sync_thread: bool = True) -> None:
        if durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {DURABILITY_MODES}, not {durability!r}")
        self.directory = os.fspath(directory)
        self.durability = durability
        self.disk: Disk = disk or OsDisk()
        self.on_fatal = on_fatal
        self.monotonic = monotonic
        durable = durability == "fsync"
        self.datadir: DataDir = open_data_dir(self.directory, node_id, disk=self.disk,
                                              rejoin_empty=rejoin_empty)
        try:
            self.log = RaftLog(self.directory, durable=durable, disk=self.disk,
                               segment_bytes_max=segment_bytes_max)
            self.snapshots = SnapshotStore(self.directory, source, durable=durable, fork=fork,
                                           disk=self.disk, inherited_fds=self._fds_to_close,
                                           cluster_name=cluster_name)
            self.snapshots.cluster_at = self.voters_at
            self._log_load_report()
            reconcile(self.log, self.snapshots.current, self.snapshots.path)
            self.log.ensure_segment()
            self.datadir.mark_initialised(self.disk)
        except BaseException:
            self.datadir.release()
            raise
        self.journal = StorageJournal(self)
        # A follower's batches are written on this thread (`sync_async`); without it (the
        # simulation) they are written at once and taken as done at the next tick.
        self.worker = SyncWorker() if sync_thread else None
        if self.worker is not None:
            self.log.flight_waiter = self.worker.wait
        self._flight_started = 0.0
        self.slow_syncs = SlowSyncs()  # a leader on a stalling disk hands over (storage.hooks)
        self.flight_ticks: Callable[[], int] = lambda: 0  # the simulation's slow disk
        self._flight_ticks_left = 0
        self.sync_latency = Histogram()  # one batch: write + fdatasync (fsync mode)
        # Past this many bytes of commands in the log, a compaction is asked for (the node
        # sets `request_compaction`): PySyncObj compacts by entry count and time only, so a
        # flood of large commands (refused ones too) would fill the disk before either.
        self.compaction_max_bytes: int | None = None
        self.request_compaction: Callable[[], None] = lambda: None
        self._compaction_asked_s = -COMPACTION_ASK_EVERY_S
        self.write_error: str | None = None
        # What keeps the node's archive from writing, if anything (cluster/archive): the
        # storage is unhealthy then too, as for the log.
        self.archive_problem: Callable[[], str | None] = lambda: None
        self._unhealthy_logged_at = -UNHEALTHY_LOG_EVERY_S
        self._closed = False
        # Whether this node may vote now, as the node sees its membership (a node that is not
        # a member yet, or no more, is a learner: `hooks`). Set by the node; True alone.
        self.may_vote: Callable[[], bool] = lambda: True
        # Whether it may lead: False while its own removal is in progress (it hands over).
        self.may_lead: Callable[[], bool] = lambda: True
        self.held_back = False  # a learner because may_vote() said no, until caught up
        # The voters before any change in this node's log, as its config file says (the node
        # sets them): what `voters()` starts from when no snapshot names them.
        self.configured_voters: list[str] = []
        self._voters_cache: tuple[Any, list[str]] | None = None
        # Whether the membership ever changed (set by the node: its member book, or a change
        # in the log). Until then the config files are the configuration, as they always were
        # (the chaos suite's relay gives each node its own address for a peer: no snapshot's
        # voters could be everyone's); from then on, the snapshot and the log are.
        self.voters_recorded: Callable[[], bool] = lambda: bool(self.log.config_indexes)

    def _log_load_report(self) -> None:
        report = self.log.report
        if report.torn_segment:
            log.warning("cut a torn tail: %d bytes at the end of %s (%s): the last write before "
                        "a crash, never acknowledged", report.torn_bytes_cut, report.torn_segment,
                        report.torn_problem, extra={"action": "storage_torn_tail_cut"})
        if self.datadir.rejoining:
            log.warning("rejoining empty: this node lost its data; it will not vote or stand for "
                        "election until it has caught up with a leader",
                        extra={"action": "rejoin_started"})
        snapshot = self.snapshots.current
        log.info("storage loaded: %d segment(s), entries %d..%d, term %d, commit %d, snapshot "
                 "%s, durability %s%s", report.segments, self.log.first_index,
                 self.log.last_index, self.log.term, self.log.commit_index,
                 snapshot.index if snapshot else "none", self.durability,
                 ", after a clean stop" if report.clean_stop else "",
                 extra={"action": "storage_loaded"})

    def __fspath__(self) -> str:
        return self.snapshots.path

    def _fds_to_close(self) -> list[int]:
        return [self.datadir.lock_fd] if self.datadir.lock_fd >= 0 else []

    @property
    def rejoining(self) -> bool:
        """Lost its data and came back empty: a learner (no vote, no candidacy) until caught
        up with a leader (`hooks`)."""
        return self.datadir.rejoining

    @property
    def learner(self) -> bool:
        """Neither votes nor stands for election: rejoining empty, or not a member."""
        return self.datadir.rejoining or self.held_back

    def voters_at(self, voters: list[str], index: int) -> list[str]:
        """The voters as of log index `index`, given the voters now (the latest change in
        the log): the changes after it undone."""
        return configlog.undo(voters, configlog.changes_after(
            index, self.log.config_indexes, self.log.command_at))

    def voters_at_start(self, configured: list[str]) -> list[str]:
        """The voters this node's own storage names: the snapshot's, with every change in the
        log after it; `configured` (the config file's) only where no snapshot says otherwise."""
        if not self.voters_recorded():
            return sorted(configured)
        snapshot = self.snapshots.current
        base = snapshot.cluster if snapshot is not None and snapshot.cluster else configured
        after = 0 if snapshot is None else snapshot.index
        return configlog.apply(base, configlog.changes_after(
            after, self.log.config_indexes, self.log.command_at))

    def voters(self) -> list[str]:
        """`voters_at_start` of `configured_voters`, now (cached until the log's configuration
        entries or the snapshot change): who votes, as this node's storage says."""
        snapshot = self.snapshots.current
        key = (None if snapshot is None else snapshot.index, tuple(self.log.config_indexes),
               tuple(self.configured_voters), self.voters_recorded())
        if self._voters_cache is None or self._voters_cache[0] != key:
            self._voters_cache = (key, self.voters_at_start(list(self.configured_voters)))
        return self._voters_cache[1]

    def finish_rejoin(self) -> None:
        self.datadir.finish_rejoin(self.disk)
        log.warning("caught up with the leader after rejoining empty: a voter again",
                    extra={"action": "rejoin_caught_up"})

    @property
    def load_report(self) -> LoadReport:
        return self.log.report

    @property
    def fsync_failed(self) -> str | None:
        """The log's first failed fsync (`raftlog.SyncFailed`): latched until a restart."""
        return self.log.sync_failed

    @property
    def problem(self) -> str | None:
        """What keeps this node's storage from writing: its log, or its archive."""
        if self.log.sync_failed is not None:
            return (f"fsync failed: {self.log.sync_failed}; the data it covered may not be on "
                    "the disk, so this node acknowledges nothing until it is restarted "
                    "(after the disk is checked)")
        if self.write_error is not None:
            return self.write_error
        archive_problem = self.archive_problem()
        return None if archive_problem is None else f"archive: {archive_problem}"

    @property
    def healthy(self) -> bool:
        return self.problem is None

    def free_bytes(self) -> int:
        return self.disk.free_bytes(self.directory)

    def summary(self, wall_s: float) -> dict[str, Any]:
        """What `raftcron cluster doctor` judges: health, headroom, log size, snapshot age."""
        current = self.snapshots.current
        age_s = None
        if current is not None:
            with contextlib.suppress(OSError):
                age_s = round(max(0.0, wall_s - os.stat(self.snapshots.path).st_mtime), 1)
        try:
            free = self.free_bytes()
        except OSError:
            free = None
        return {
            "healthy": self.healthy,
            "problem": self.problem,
            "free_bytes": free,
            "log_entries": len(self.log),
            "snapshot_index": 0 if current is None else current.index,
            "snapshot_age_s": age_s,
        }

    def _compact_if_large(self, now_s: float) -> None:
        limit = self.compaction_max_bytes
        if limit is not None and self.log.entry_bytes > limit and \
                now_s - self._compaction_asked_s >= COMPACTION_ASK_EVERY_S:
            self._compaction_asked_s = now_s
            self.request_compaction()

    def sync(self) -> bool:
        """Make every buffered change durable; False (and unhealthy) if it cannot. An archive
        that cannot write counts as the log would: the node acknowledges, votes and leads
        again once it can (its snapshots wait for the archive meanwhile)."""
        if self._blocked():
            return False
        if not self.log.dirty and self.log.flight is None and self.write_error is None:
            return True
        started = self.monotonic()
        try:
            self.log.sync()
            took = self.monotonic() - started
            self.sync_latency.observe(took)
            self.slow_syncs.observe(started, took)
            self._compact_if_large(started)
        except StorageError as error:
            return self._sync_failed(error)
        self._recovered()
        return True

    def sync_async(self) -> bool:
        """`sync` for a follower: take a batch written off this thread if it is done, and hand
        the next one over; acks claim what `log.durable_through` says. False (and unhealthy)
        as `sync`."""
        if self._blocked():
            return False
        log_ = self.log
        try:
            flight = log_.flight
            if flight is not None and not flight.done and self.worker is None:
                self._run_held_flight(flight)
            if flight is not None and flight.done:
                log_.finish_sync()
                self.sync_latency.observe(self.monotonic() - self._flight_started)
                self._compact_if_large(self.monotonic())
                self._recovered()
            if log_.flight is None and log_.dirty:
                self._flight_started = self.monotonic()
                flight = log_.begin_sync()
                if flight is None:  # written at once (a new segment)
                    self._recovered()
                elif self.worker is not None:
                    self.worker.submit(flight)
                else:
                    self._flight_ticks_left = self.flight_ticks()
                    self._run_held_flight(flight)
        except StorageError as error:
            return self._sync_failed(error)
        return self.write_error is None

    def _blocked(self) -> bool:
        """An archive that cannot write counts as the log would; a failed fsync is latched:
        never again in this process (a retry could "succeed" over lost pages). Said, and True."""
        archive_problem = self.archive_problem()
        if archive_problem is not None:
            self._log_unhealthy(f"archive: {archive_problem}")
            return True
        if self.log.sync_failed is not None:
            self._log_unhealthy(self.problem or "fsync failed")
            return True
        return False

    def _sync_failed(self, error: StorageError) -> bool:
        """A sync that failed: latched (SyncFailed) or unhealthy until a write succeeds."""
        if isinstance(error, SyncFailed):
            self._log_unhealthy(self.problem or "fsync failed")
        elif isinstance(error, StorageUnavailable):
            self.failed(str(error))
        else:
            raise error
        return False

    def _run_held_flight(self, flight: Flight) -> None:
        """Without a worker (the simulation): a batch is written `flight_ticks()` ticks after
        it was handed over, as a slow disk would (0: at once)."""
        if self._flight_ticks_left > 0:
            self._flight_ticks_left -= 1
            return
        flight.land_here()

    def _recovered(self) -> None:
        if self.write_error is not None:
            log.warning("storage writable again", extra={"action": "storage_recovered"})
            self.write_error = None

    def failed(self, problem: str) -> None:
        self.write_error = problem
        self._log_unhealthy(problem)

    def _log_unhealthy(self, problem: str) -> None:
        now = self.monotonic()
        if now - self._unhealthy_logged_at >= UNHEALTHY_LOG_EVERY_S:
            self._unhealthy_logged_at = now
            if self.log.sync_failed is not None:
                log.critical("%s", problem, extra={"action": "storage_fsync_failed"})
                return
            log.error("storage cannot write: %s; not acknowledging, voting or leading until it "
                      "can", problem, extra={"action": "storage_unavailable"})

    def fatal(self, message: str) -> None:
        log.critical("%s", message, extra={"action": "storage_fatal"})
        self.on_fatal(message)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.snapshots.kill_writer()
        try:
            self.log.close(clean=True)
        except (OSError, StorageError) as error:
            log.error("storage did not close cleanly: %s", error,
                      extra={"action": "storage_close_failed"})
        finally:
            if self.worker is not None:
                self.worker.close()
            self.datadir.release()
