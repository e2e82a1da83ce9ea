"""A snapshot install replaces the replica's state without holding two whole states.

It built the new state while the replaced one was still referenced: the install's peak was two
states, and glibc kept that high-water mark (a follower's memory beyond its state rose in steps
at its installs, in the 120-minute endurance run). Now the old state is let go of first, and
in between there is nothing to read: readers are told `StateUnavailable` (the API answers 503
unavailable, retry), never an empty or a half-built state. An install that fails leaves it so.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import threading
import tracemalloc
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from raftcron.cluster.consensus import replica
from raftcron.cluster.consensus.replica import StateMachine, StateUnavailable, encode_batch
from raftcron.cluster.http.app import api_middleware
from raftcron.cluster.http.common import SERVICES
from raftcron.scheduler import codec, views
from raftcron.scheduler.commands import Ack, ClaimJobs, SubmitJobs, Tick
from raftcron.scheduler.errors import Ok
from raftcron.scheduler.snapshot import restore, snapshot
from raftcron.scheduler.specs import JobSpec
from raftcron.scheduler.state import SchedulerState

T0 = 1_800_000_000_000


def state_of(jobs: int, tag: str) -> SchedulerState:
    """`jobs` succeeded jobs, each with a payload and a result of its own."""
    state = SchedulerState()
    state.apply(Tick(T0))
    for batch in range(jobs // 500):
        specs = tuple(JobSpec(task="t", payload={"n": batch, "pad": f"{tag}-{batch}-{n}" * 8})
                      for n in range(500))
        state.apply(SubmitJobs(None, specs))
        claimed = state.apply(ClaimJobs(None, "w1", ("default",), 500, 30_000))
        assert isinstance(claimed, Ok)
        state.apply(ClaimJobs(None, "w1", ("default",), 0, 30_000, tuple(
            Ack(job_id, token, "succeeded", result={"ok": batch})
            for job_id, token in claimed.value["jobs"])))
    return state


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    """An install freezes what is alive out of the GC's reach: let the test's garbage go."""
    yield
    gc.unfreeze()
    gc.collect()


def test_an_install_lets_go_of_the_replaced_state_before_it_builds_the_new_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    machine = StateMachine()
    machine.load_snapshot(snapshot(state_of(1_000, "old")))
    replaced = weakref.ref(machine.state)
    seen: list[bool] = []

    def watched_restore(blob: bytes) -> SchedulerState:
        seen.append(replaced() is None)
        return restore(blob)

    monkeypatch.setattr(replica, "restore", watched_restore)
    machine.load_snapshot(snapshot(state_of(1_500, "new")))
    assert seen == [True]  # gone before the new state's first object was made
    assert machine.read(views.summary)["jobs"] == 1_500


def test_an_install_peaks_at_one_state_and_the_snapshot_not_at_two_states() -> None:
    """Measured as the replica allocates (tracemalloc): each state about 9 MiB here. The peak
    above what was allocated before the install was the new state whole and then some (old +
    new: 1.2 states); now it is the restore's working set, about 2 MiB whatever the state's
    size (the new state takes the memory the old one gave back)."""
    blob = snapshot(state_of(20_000, "a"))
    gc.collect()
    tracemalloc.start()
    try:
        machine = StateMachine()
        machine.load_snapshot(blob)
        one_state = tracemalloc.get_traced_memory()[0]
        peaks = []
        for _ in range(2):
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            machine.load_snapshot(blob)
            peaks.append(tracemalloc.get_traced_memory()[1] - before)
    finally:
        tracemalloc.stop()
    assert one_state > 8 << 20, one_state  # the state is big enough to tell
    assert max(peaks) < one_state // 2, (peaks, one_state)
    print(f"a state of {one_state} bytes: installs peaked {peaks} bytes above it")


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_garbage_frozen_at_one_install_is_collected_at_the_next() -> None:
    """An install freezes what is alive (gc.freeze) to keep the new state out of every GC
    pass. A cycle alive then (a request in flight) that died later was never collected: the
    next install unfreezes and collects before it freezes again."""
    machine = StateMachine()
    in_flight = _Cycle()
    machine.load_snapshot(snapshot(state_of(500, "a")))  # freezes `in_flight` too
    gone = weakref.ref(in_flight)
    del in_flight
    gc.collect()
    assert gone() is not None  # frozen: out of the collector's reach
    machine.load_snapshot(snapshot(state_of(500, "b")))
    assert gone() is None


def installing(machine: StateMachine, blob: bytes,
               monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Thread, threading.Event]:
    """An install started on another thread and held inside the restore until released."""
    inside, release = threading.Event(), threading.Event()

    def held_restore(data: bytes) -> SchedulerState:
        inside.set()
        assert release.wait(10)
        return restore(data)

    monkeypatch.setattr(replica, "restore", held_restore)
    thread = threading.Thread(target=machine.load_snapshot, args=(blob,))
    thread.start()
    assert inside.wait(10)
    return thread, release


def test_a_reader_during_an_install_is_told_unavailable_then_sees_the_new_state_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    machine = StateMachine()
    old = state_of(500, "old")
    old.apply(Tick(T0 + 1))
    machine.load_snapshot(snapshot(old))
    machine.state.archive_ledger.tombstones[7] = 1  # purged in the state being replaced
    purged = machine._purged
    assert machine.clock_started and purged(7)
    thread, release = installing(machine, snapshot(state_of(1_000, "new")), monkeypatch)
    try:
        with pytest.raises(StateUnavailable):
            machine.read(views.summary)
        assert not machine.clock_started  # /readyz: not ready while there is no state
        assert purged(7)  # the archive still skips a row the replaced state purged
    finally:
        release.set()
        thread.join(10)
    assert machine.read(views.summary)["jobs"] == 1_000
    assert machine.clock_started and not purged(7)


def test_concurrent_readers_see_the_old_state_unavailable_or_the_new_state_never_a_part() -> None:
    machine = StateMachine()
    blobs = [snapshot(state_of(2_000, "a")), snapshot(state_of(3_000, "b"))]
    machine.load_snapshot(blobs[0])
    answers: set[object] = set()
    done, saw_new = threading.Event(), threading.Event()

    def reader() -> None:
        while not done.is_set():
            try:
                answer = machine.read(lambda state: len(state.table))
            except StateUnavailable:
                answers.add("unavailable")
                continue
            answers.add(answer)
            if answer == 3_000:
                saw_new.set()

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for thread in readers:
        thread.start()
    try:
        for blob in blobs + blobs:
            machine.load_snapshot(blob)
        # The last install is of the new state, and it stays: a reader sees it, however the
        # threads were scheduled during the installs (a loaded machine ran them all before
        # either reader got the new state once, and the test stopped the readers right away).
        assert saw_new.wait(10), f"no reader saw the new state: {answers}"
    finally:
        done.set()
        for thread in readers:
            thread.join(10)
    assert answers <= {2_000, 3_000, "unavailable"}, answers


def test_an_install_that_fails_leaves_nothing_to_read_and_applies_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The storage stops the node when a snapshot does not load (cluster/storage/hooks.py);
    until it has, no reader is answered from an empty state, and an entry is not applied to
    one: the node exits as for a bug rather than diverge."""
    machine = StateMachine()
    machine.load_snapshot(snapshot(state_of(500, "old")))
    blob = snapshot(state_of(500, "new"))
    with pytest.raises(ValueError):
        machine.load_snapshot(blob[: len(blob) // 2])
    with pytest.raises(StateUnavailable):
        machine.read(views.summary)
    assert not machine.clock_started

    class Exited(Exception):
        pass

    def exit_(code: int) -> None:
        raise Exited(code)

    monkeypatch.setattr(os, "_exit", exit_)
    monkeypatch.setattr(logging, "shutdown", lambda: None)
    entry = encode_batch([codec.encode(Tick(T0 + 5))])
    with pytest.raises(Exited) as exited:
        machine.apply(entry, _doApply=True)  # as PySyncObj applies a committed entry
    assert exited.value.args == (replica.EXIT_BUG,)
    machine.load_snapshot(blob)  # a good one after all: the state is back
    assert machine.read(views.summary)["jobs"] == 500


def test_the_api_answers_503_unavailable_while_the_state_is_replaced() -> None:
    machine = StateMachine()
    machine._state = None  # as between letting go of the old state and the new one's end
    svc = SimpleNamespace(
        config=SimpleNamespace(node_id="n2", api=SimpleNamespace(tls=False), members=[]),
        trail=None, stats=SimpleNamespace(http_requests={}),
        node=SimpleNamespace(machine=machine, applied_index=41, leader_id=lambda: None),
    )
    app = web.Application()
    app[SERVICES] = svc

    async def handler(request: web.Request) -> web.Response:
        return web.json_response(machine.read(views.summary))

    request = make_mocked_request("GET", "/healthz", app=app)
    response = asyncio.run(api_middleware(request, handler))
    assert isinstance(response, web.Response) and response.text is not None
    assert response.status == 503 and response.headers["Retry-After"] == "1"
    error: dict[str, Any] = json.loads(response.text)["error"]
    assert error["code"] == "unavailable" and "installing a snapshot" in error["message"]
