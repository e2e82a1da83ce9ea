"""Whom a node reaches over Raft (cluster/membership/reach.py) and how `/metrics` shows it
(`raftcron_member_reachable`): time goes in as numbers, the transport is a fake."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from metricfakes import ProposerFigures

from raftcron.cluster.membership.book import Member
from raftcron.cluster.membership.reach import ReachBook, ReachWatch
from raftcron.cluster.ops.metrics import NodeStats, render
from raftcron.scheduler.driver import Driver

BOUND_S = 2.0


def book_after(samples: list[tuple[float, dict[str, bool]]]) -> ReachBook:
    book = ReachBook("n1", bound_s=BOUND_S)
    for now_s, connected in samples:
        book.observe(connected, now_s)
    return book


@pytest.mark.parametrize(
    ("samples", "now_s", "expected"),
    [
        # connected now
        ([(10.0, {"n1": True, "n2": True})], 10.0, {"n1": True, "n2": True}),
        # dropped, dialled again within the bound: never unreachable
        ([(10.0, {"n2": True}), (11.0, {"n2": False}), (11.5, {"n2": True})], 13.4,
         {"n2": True}),
        # silent for exactly the bound: still reachable; past it: not
        ([(10.0, {"n2": True}), (11.0, {"n2": False})], 12.0, {"n2": True}),
        ([(10.0, {"n2": True}), (11.0, {"n2": False}), (12.5, {"n2": False})], 12.5,
         {"n2": False}),
        # never connected: counted from when it was first listed
        ([(10.0, {"n3": False})], 11.0, {"n3": True}),
        ([(10.0, {"n3": False}), (12.5, {"n3": False})], 12.5, {"n3": False}),
        # back after a long silence: reachable again at once
        ([(10.0, {"n2": False}), (20.0, {"n2": False}), (21.0, {"n2": True})], 21.0,
         {"n2": True}),
        # this node reaches itself even when the sample says otherwise
        ([(10.0, {"n1": False})], 30.0, {"n1": True}),
    ],
    ids=["connected", "redialled", "at-bound", "past-bound", "new-member", "new-never-seen",
         "back", "itself"],
)
def test_a_member_is_unreachable_only_after_a_silence_longer_than_the_bound(
    samples: list[tuple[float, dict[str, bool]]], now_s: float, expected: dict[str, bool]
) -> None:
    assert book_after(samples).reachable(now_s) == expected


def test_a_member_that_left_the_membership_is_forgotten() -> None:
    book = book_after([(10.0, {"n1": True, "n2": True, "n3": True}),
                       (11.0, {"n1": True, "n2": True})])
    assert book.reachable(11.0) == {"n1": True, "n2": True}


class FakeTransport:
    def __init__(self) -> None:
        self.up: set[str] = set()

    def connected(self, address: str) -> bool:
        return address in self.up


MEMBERS = (Member("n1", "127.0.0.1:7001", "127.0.0.1:8001"),
           Member("n2", "127.0.0.1:7002", "127.0.0.1:8002"),
           Member("n3", "127.0.0.1:7003", "127.0.0.1:8003"))


def test_the_watch_asks_the_transport_by_raft_address_and_never_for_this_node() -> None:
    transport = FakeTransport()
    asked: list[str] = []

    def connected(address: str) -> bool:
        asked.append(address)
        return transport.connected(address)

    transport.up = {"127.0.0.1:7002"}
    watch = ReachWatch(ReachBook("n1", bound_s=BOUND_S), lambda: MEMBERS, connected)
    watch.sample(100.0)
    watch.sample(100.0 + BOUND_S + 0.1)
    assert sorted(set(asked)) == ["127.0.0.1:7002", "127.0.0.1:7003"]
    assert watch.book.reachable(100.0 + BOUND_S + 0.1) == {"n1": True, "n2": True, "n3": False}


def reach_samples(text: str) -> dict[str, float]:
    return {match[1]: float(match[2]) for match in re.finditer(
        r'^raftcron_member_reachable\{node="n1",member="(\w+)"\} (\S+)$', text, re.MULTILINE)}


def render_with(stats: NodeStats) -> str:
    return render(Driver().state, node_id="n1", role=2, term=1, commit_index=1,
                  applied_index=1, stats=stats,
                  proposer=ProposerFigures())  # type: ignore[arg-type]


def test_metrics_show_each_member_reachable_or_not_as_of_the_scrape() -> None:
    book = ReachBook("n1", bound_s=BOUND_S)
    now_s = time.monotonic()
    book.observe({"n1": True, "n2": True, "n3": False}, now_s - BOUND_S - 1)
    book.observe({"n1": True, "n2": True, "n3": False}, now_s)
    text = render_with(NodeStats(reach=book))
    assert "# TYPE raftcron_member_reachable gauge" in text
    assert reach_samples(text) == {"n1": 1.0, "n2": 1.0, "n3": 0.0}


def test_metrics_leave_reachability_out_when_no_watch_runs() -> None:
    assert "raftcron_member_reachable" not in render_with(NodeStats())


def test_the_watch_lists_every_member_at_start_and_stops_when_asked() -> None:
    transport = FakeTransport()
    transport.up = {"127.0.0.1:7002", "127.0.0.1:7003"}
    book = ReachBook("n1", bound_s=BOUND_S)
    watch = ReachWatch(book, lambda: MEMBERS, transport.connected)

    async def run() -> None:
        watch.start()
        assert book.reachable(time.monotonic()) == {"n1": True, "n2": True, "n3": True}
        await watch.stop()
        assert watch._task is not None and watch._task.done()

    asyncio.run(run())
