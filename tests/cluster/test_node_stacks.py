"""A node's SIGUSR1 dump (cluster/node.py, `dump_stacks`) writes every thread's stack from a
Python-level handler, with the GIL held (faulthandler's C-level handler read the frames of
running threads, and a node crashed in the middle of one of its dumps)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from raftcron.cluster import node


def _busy(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(100))


def test_sigusr1_dumps_every_thread_from_the_main_threads_handler(
        capfd: pytest.CaptureFixture[str]) -> None:
    stop = threading.Event()
    worker = threading.Thread(target=_busy, args=(stop,), name="busy")
    previous = signal.signal(signal.SIGUSR1, node.dump_stacks)
    worker.start()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # handled before the next bytecode of this thread
        err = capfd.readouterr().err
    finally:
        stop.set()
        worker.join(timeout=10)
        signal.signal(signal.SIGUSR1, previous)
    assert "Current thread 0x" in err and "in dump_stacks" in err, err
    assert "in _busy" in err, err  # the other thread's stack too
