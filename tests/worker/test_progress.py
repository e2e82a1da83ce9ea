"""`ctx.progress` on the worker's side: reports checked where they are made, coalesced into at
most one heartbeat a second per job (the newest winning, the last never dropped), and carried
to the cluster before the job's outcome. The pacing runs on a fake clock: nothing here waits
for a second to pass."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from raftcron.cluster.worker import JobContext, TaskRegistry, Worker
from raftcron.cluster.worker.progress import ProgressReporter, checked_report
from raftcron.testing import Inline

from .fakeapi import FakeApi
from .test_runtime_fake import run_scenario


class FakeTime:
    """A clock the reporter's pauses move forward at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def pause(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


class FakeHeartbeats:
    """What the reporter sends through: each heartbeat's time and report, held in flight
    while `open` is clear; `lease_lost` answers as a 409 would."""

    def __init__(self, time: FakeTime) -> None:
        self.time = time
        self.sent: list[tuple[float, Any]] = []
        self.open = asyncio.Event()
        self.open.set()
        self.lease_lost = False

    async def send(self, report: dict[str, Any]) -> bool:
        self.sent.append((self.time.now, report["value"]))
        await self.open.wait()
        return not self.lease_lost


async def settle(condition: Any = None) -> None:
    """Let the loop run what is ready (no time passes: every wait here is a fake one)."""
    for _ in range(50):
        if condition is not None and condition():
            return
        await asyncio.sleep(0)
    assert condition is None or condition()


def reporter_and_heartbeats() -> tuple[ProgressReporter, FakeHeartbeats, FakeTime]:
    time = FakeTime()
    heartbeats = FakeHeartbeats(time)
    reporter = ProgressReporter(heartbeats.send, asyncio.get_running_loop(),
                                clock=time.clock, pause=time.pause)
    return reporter, heartbeats, time


def test_reports_are_coalesced_to_one_heartbeat_a_second_the_newest_winning() -> None:
    async def main() -> None:
        reporter, heartbeats, time = reporter_and_heartbeats()
        heartbeats.open.clear()
        reporter.report({"value": 0.1})  # the first goes at once
        await settle(lambda: heartbeats.sent)
        reporter.report({"value": 0.2})  # made while it is in flight: 0.3 replaces it
        reporter.report({"value": 0.3})
        time.now = 0.4
        heartbeats.open.set()
        await settle(lambda: len(heartbeats.sent) == 2)
        time.now = 1.5
        reporter.report({"value": 0.4})  # within the second after the last: waits for it
        await settle(lambda: len(heartbeats.sent) == 3)
        assert heartbeats.sent == [(0.0, 0.1), (1.0, 0.3), (2.0, 0.4)]
        for reports in range(10):  # a loop reporting every row, within one second
            time.now = 2.0 + reports / 20
            reporter.report({"value": 0.5 + reports / 100})
        await settle(lambda: len(heartbeats.sent) == 4)
        await settle()
        assert heartbeats.sent[3] == (3.0, 0.59) and len(heartbeats.sent) == 4
        gaps = [b[0] - a[0] for a, b in zip(heartbeats.sent, heartbeats.sent[1:], strict=False)]
        assert min(gaps) >= reporter.interval_s

    asyncio.run(main())


def test_the_last_report_is_sent_when_the_handler_returns_even_within_the_second() -> None:
    async def main() -> None:
        reporter, heartbeats, time = reporter_and_heartbeats()
        reporter.report({"value": 0.5})
        await settle(lambda: heartbeats.sent)
        time.now = 0.2
        reporter.report({"value": 0.9})
        reporter.report({"value": 1})
        await reporter.finish()
        assert heartbeats.sent == [(0.0, 0.5), (0.2, 1)]
        assert reporter.report({"value": 1}) is False  # nothing after the outcome

    asyncio.run(main())


def test_the_last_report_waits_for_the_one_in_flight_so_it_lands_last() -> None:
    async def main() -> None:
        reporter, heartbeats, _ = reporter_and_heartbeats()
        heartbeats.open.clear()
        reporter.report({"value": 0.5})
        await settle(lambda: heartbeats.sent)
        reporter.report({"value": 1})
        finishing = asyncio.ensure_future(reporter.finish())
        await settle()
        assert heartbeats.sent == [(0.0, 0.5)] and not finishing.done()
        heartbeats.open.set()
        await finishing
        assert [value for _, value in heartbeats.sent] == [0.5, 1]

    asyncio.run(main())


def test_a_lost_lease_stops_the_reports() -> None:
    async def main() -> None:
        reporter, heartbeats, _ = reporter_and_heartbeats()
        heartbeats.lease_lost = True
        reporter.report({"value": 0.5})
        await settle(lambda: heartbeats.sent)
        await settle()
        assert reporter.report({"value": 0.6}) is False
        await reporter.finish()
        assert len(heartbeats.sent) == 1

    asyncio.run(main())


@pytest.mark.parametrize(
    ("arguments", "error", "names"),
    [
        (("half",), TypeError, "value"),
        ((True,), TypeError, "value"),
        ((None,), TypeError, "value"),
        ((1.5,), ValueError, "value"),
        ((float("nan"),), ValueError, "value"),
        (({"done": 3},), TypeError, "value['total']"),
        (({"done": 4, "total": 3},), ValueError, "value['done']"),
        (({"done": 0, "total": 0},), ValueError, "value['total']"),
        (({"done": 1, "total": 2, "left": 1},), ValueError, "value"),
        ((0.5, 7), TypeError, "message"),
        ((0.5, "m" * 201), ValueError, "message"),
        ((0.5, None, "d" * 2_000), ValueError, "data"),
        ((0.5, None, {1: "a"}), TypeError, "data"),
        ((0.5, None, {"when": object()}), TypeError, "data"),
        ((0.5, None, [float("inf")]), ValueError, "data"),
    ],
)
def test_a_report_the_cluster_would_refuse_raises_naming_the_argument(
    arguments: tuple[Any, ...], error: type[Exception], names: str
) -> None:
    with pytest.raises(error) as raised:
        checked_report(*arguments)
    assert str(raised.value).startswith(names)


def test_a_report_is_sent_as_the_api_takes_it() -> None:
    assert checked_report(0.25) == {"value": 0.25}
    assert checked_report(1, "done", {"rows": 9}) == {
        "value": 1, "message": "done", "data": {"rows": 9}}
    assert checked_report({"total": 10, "done": 3}) == {"value": {"done": 3, "total": 10}}


# -- through a worker --------------------------------------------------------------------------


def progress_beats(fake: FakeApi, job_id: int) -> list[Any]:
    return [r.body["progress"] for r in fake.calls(f"/v1/jobs/{job_id}/heartbeat")
            if "progress" in r.body]


def test_a_handlers_last_report_reaches_the_cluster_before_its_outcome() -> None:
    tasks = TaskRegistry()

    @tasks.task("export")
    def export(ctx: JobContext) -> str:
        for done in range(1, 101):
            assert ctx.progress({"done": done, "total": 100}, f"row {done}")
        return "exported"

    @tasks.task("export-async")
    async def export_async(ctx: JobContext) -> str:
        for done in range(1, 101):
            assert await ctx.aprogress(done / 100, data={"row": done})
        return "exported"

    async def scenario(fake: FakeApi, worker: Worker) -> None:
        jobs = [fake.add_job("export"), fake.add_job("export-async")]
        await fake.wait_until(lambda: all(job.status == "succeeded" for job in jobs))

    fake = run_scenario(scenario, tasks, concurrency=2)
    threaded, coroutine = progress_beats(fake, 1), progress_beats(fake, 2)
    # 100 reports in far less than a second: the first at most, and the last.
    assert 1 <= len(threaded) <= 2 and 1 <= len(coroutine) <= 2
    assert threaded[-1] == {"value": {"done": 100, "total": 100}, "message": "row 100"}
    assert coroutine[-1] == {"value": 1.0, "data": {"row": 100}}
    for job_id in (1, 2):
        beat = max(i for i, r in enumerate(fake.requests) if r.path.endswith(f"{job_id}/heartbeat"))
        ack = min(i for i, r in enumerate(fake.requests)
                  if any(a["id"] == job_id for a in (r.body or {}).get("acks") or []))
        assert beat < ack


def test_a_node_that_does_not_know_progress_leaves_the_job_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A member of the previous release refuses the field (400 naming it) during a rolling
    upgrade: the worker stops sending this job's reports, and the job goes on."""
    tasks = TaskRegistry()
    answers: list[bool] = []

    @tasks.task("export")
    def export(ctx: JobContext) -> str:
        answers.append(ctx.progress(0.5))
        return "exported"

    async def scenario(fake: FakeApi, worker: Worker) -> None:
        fake.refuse_progress = True
        job = fake.add_job("export")
        await fake.wait_until(lambda: job.status == "succeeded")

    with caplog.at_level(logging.WARNING, logger="raftcron.worker"):
        fake = run_scenario(scenario, tasks)
    assert answers == [True] and len(progress_beats(fake, 1)) == 1
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions.count("progress_refused") == 1 and "heartbeat_error" not in actions


def test_inline_records_every_report_and_the_job_shows_the_last() -> None:
    tasks = TaskRegistry()

    @tasks.task("export")
    def export(ctx: JobContext) -> None:
        ctx.progress(0.5, "half")
        ctx.progress({"done": 4, "total": 4}, "all rows", {"rows": 4})

    inline = Inline(tasks)
    job_id = inline.submit("export")
    [run] = inline.drain()
    assert run.progress == (
        {"value": 0.5, "message": "half"},
        {"value": {"done": 4, "total": 4}, "message": "all rows", "data": {"rows": 4}},
    )
    shown = inline.job(job_id)["progress"]
    assert shown == {"value": {"done": 4, "total": 4}, "message": "all rows",
                     "data": {"rows": 4}, "at_ms": inline.now_ms, "attempt": 1}
