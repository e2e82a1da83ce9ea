"""`SyncWorker`: the thread that writes and fsyncs a follower's log batches, so that the Raft
thread keeps reading heartbeats and answering while a sync is in flight (DESIGN.md §9.3).

A follower that sat in a 2 s fsync read nothing for 2 s: its election deadline passed and its
connection to the leader timed out, though nothing was wrong with the leader. Now the Raft
thread hands a batch (`raftlog.Flight`, whose only I/O is one append and one fdatasync of the
newest segment) to this thread and goes on; its acks wait until the batch is durable
(`storage.hooks`), and a byte on `read_fd` (a pipe the Raft thread's poller watches) wakes it
to send them as soon as the fsync returns. One batch at a time: the next is everything
buffered meanwhile (group commit, as before).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading

from raftcron.cluster.storage.logparts import Flight

JOIN_S = 5.0


class SyncWorker:
    def __init__(self, name: str = "raft-log-sync") -> None:
        self.read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._flights: queue.SimpleQueue[Flight | None] = queue.SimpleQueue()
        self._done = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, flight: Flight) -> None:
        self._flights.put(flight)

    def wait(self, flight: Flight) -> None:
        """Block until this flight is done (the Raft thread, when it must sync at once)."""
        with self._done:
            self._done.wait_for(lambda: flight.done)

    def drain(self) -> None:
        """Empty the wake-up pipe (its bytes only say "look")."""
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self.read_fd, 4096):
                pass

    def _run(self) -> None:
        while True:
            flight = self._flights.get()
            if flight is None:
                return
            flight.run()
            with self._done:
                flight.done = True
                self._done.notify_all()
            with contextlib.suppress(BlockingIOError, OSError):  # full: a wake-up is pending
                os.write(self._write_fd, b"!")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._flights.put(None)
        self._thread.join(JOIN_S)
        if self._thread.is_alive():
            return  # inside a long fsync: its pipe stays open (a reused number must not see it)
        for fd in (self.read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
