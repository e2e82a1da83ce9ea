"""raftcron.testing.Inline: a user's handlers against the real core, in the test's process.

The example of docs/getting-started/handlers.md is run here as it is written, so the documented
test is a real one."""

import asyncio
import re
from pathlib import Path

import pytest

from raftcron import LeaseLost, PermanentError
from raftcron.cluster.worker import TaskRegistry, default_registry
from raftcron.scheduler.commands import Tick
from raftcron.testing import Inline, InlineError

PAGE = Path(__file__).resolve().parent.parent / "docs" / "getting-started" / "handlers.md"


def page_example() -> str:
    text = PAGE.read_text()
    found = re.search(r"<!-- inline-example -->\n```python\n(.*?)```", text, re.S)
    assert found, "the handlers page lost its inline-example block"
    return found.group(1)


def test_the_handlers_page_example_is_a_test_that_passes(monkeypatch):
    # The example registers with the default registry (as a user's module does); keep it
    # from leaking into other tests.
    monkeypatch.setattr(default_registry, "_tasks", dict(default_registry._tasks))
    namespace: dict = {}
    exec(compile(page_example(), "handlers.md inline-example", "exec"), namespace)
    tests = [value for name, value in namespace.items() if name.startswith("test_")]
    assert len(tests) == 3
    for test in tests:
        test()


@pytest.fixture
def tasks() -> TaskRegistry:
    return TaskRegistry()


def test_retries_follow_the_backoff_and_time_moves_only_as_far_as_they_need(tasks):
    @tasks.task("flaky")
    def flaky(ctx):
        if ctx.attempt < 3:
            raise RuntimeError("not yet")
        return {"attempt": ctx.attempt}

    inline = Inline(tasks)
    started = inline.now_ms
    job_id = inline.submit(
        "flaky", max_attempts=5, backoff={"initial_ms": 10_000, "factor": 2, "jitter": 0}
    )
    runs = inline.drain()
    assert [(r.attempt, r.outcome) for r in runs] == [
        (1, "failed"),
        (2, "failed"),
        (3, "succeeded"),
    ]
    assert "RuntimeError: not yet" in runs[0].error
    job = inline.job(job_id)
    assert (job["status"], job["attempts"], job["result"]) == ("succeeded", 3, {"attempt": 3})
    assert inline.now_ms - started == 10_000 + 20_000  # the two backoffs, nothing more


def test_without_retries_drain_leaves_a_backed_off_job_waiting(tasks):
    tasks.add("fails", lambda ctx: 1 / 0)
    inline = Inline(tasks)
    job_id = inline.submit("fails", max_attempts=2)
    assert [r.outcome for r in inline.drain(retries=False)] == ["failed"]
    assert inline.job(job_id)["status"] == "scheduled"  # waiting for its backoff
    assert [r.outcome for r in inline.drain()] == ["failed"]
    assert inline.job(job_id)["status"] == "failed"


def test_permanent_errors_unknown_tasks_and_bad_results_fail_without_retry(tasks):
    @tasks.task("permanent")
    def permanent(ctx):
        raise PermanentError("bad input")

    tasks.add("not-json", lambda ctx: {1, 2})
    inline = Inline(tasks)
    ids = [inline.submit(name, max_attempts=3) for name in ("permanent", "missing", "not-json")]
    runs = inline.drain()
    assert [r.job_id for r in runs] == [*ids, ids[1], ids[1]]  # only the missing one retries
    assert all(r.outcome == "failed" for r in runs)
    assert runs[0].error == "bad input"
    assert "no handler for task 'missing'" in runs[1].error
    assert "result was refused" in runs[2].error
    assert [inline.job(i)["attempts"] for i in ids] == [1, 3, 1]  # a missing handler retries


def test_coroutine_and_thread_handlers_heartbeat_through_the_core(tasks):
    @tasks.task("async")
    async def in_loop(ctx):
        assert await ctx.aheartbeat(60_000)
        return "a"

    @tasks.task("thread")
    def in_thread(ctx):
        assert ctx.heartbeat(60_000)
        return "t"

    inline = Inline(tasks)
    ids = [inline.submit("async"), inline.submit("thread")]
    assert [r.outcome for r in inline.drain()] == ["succeeded", "succeeded"]
    assert [inline.job(i)["result"] for i in ids] == ["a", "t"]


def test_a_handler_that_loses_its_lease_reports_nothing(tasks):
    inline = Inline(tasks)

    @tasks.task("cancelled-meanwhile")
    async def cancelled_meanwhile(ctx):
        inline.cancel(ctx.job_id, "operator")  # as an operator would, while it runs
        if not await ctx.aheartbeat():
            raise LeaseLost()
        return "unreachable"

    job_id = inline.submit("cancelled-meanwhile")
    assert [r.outcome for r in inline.drain()] == ["abandoned"]
    assert inline.job(job_id)["status"] == "cancelled"


def test_advance_fires_a_schedule_once_per_time_as_a_running_cluster_does(tasks):
    tasks.add("tick", lambda ctx: ctx.fire_time_ms)
    inline = Inline(tasks)
    inline.put_schedule("every-minute", every="1m", job={"task": "tick"})
    start = inline.now_ms
    inline.advance(180_000)
    assert len(inline.jobs(task="tick")) == 3
    runs = inline.drain()
    assert len(runs) == 3
    results = sorted(inline.job(r.job_id)["result"] for r in runs)
    assert all(start < t <= start + 180_000 and t % 60_000 == 0 for t in results)
    inline.advance(0)
    assert len(inline.jobs(task="tick")) == 3  # no time passed: nothing more


def test_bad_input_is_refused_naming_the_field(tasks):
    inline = Inline(tasks)
    with pytest.raises(InlineError) as refused:
        inline.submit("x", max_attempts=0)
    assert (refused.value.code, refused.value.field) == ("invalid", "max_attempts")
    with pytest.raises(InlineError) as missing:
        inline.job(99)
    assert missing.value.code == "not_found"
    with pytest.raises(ValueError, match="forward"):
        inline.advance(to_ms=inline.now_ms - 1)


def test_a_handler_that_always_fails_into_retries_stops_the_drain(tasks):
    tasks.add("always", lambda ctx: 1 / 0)
    inline = Inline(tasks)
    inline.submit("always", max_attempts=50)
    with pytest.raises(InlineError, match="ran 5 attempts"):
        inline.drain(max_runs=5)
    assert len(inline.runs) == 5


def test_adrain_runs_from_inside_an_event_loop(tasks):
    tasks.add("one", lambda ctx: 1)
    inline = Inline(tasks)
    job_id = inline.submit("one")
    runs = asyncio.run(inline.adrain())
    assert [r.outcome for r in runs] == ["succeeded"] and inline.job(job_id)["result"] == 1


def test_queues_limit_what_drain_runs(tasks):
    tasks.add("one", lambda ctx: 1)
    inline = Inline(tasks)
    mine = inline.submit("one", queue="mine")
    other = inline.submit("one", queue="other")
    assert [r.job_id for r in inline.drain(queues=["mine"])] == [mine]
    assert inline.job(other)["status"] == "queued"


def count_ticks(inline, monkeypatch) -> list[int]:
    ticks: list[int] = []
    apply = inline._apply

    def counted(command):
        if isinstance(command, Tick):
            ticks.append(command.now_ms)
        return apply(command)

    monkeypatch.setattr(inline, "_apply", counted)
    return ticks


def test_advance_steps_over_what_is_no_longer_due(tasks, monkeypatch):
    """The state's heaps keep entries for what changed since (a delayed job cancelled, a lease
    of a job that finished): advancing past them takes a Tick each at most, never a loop."""
    tasks.add("quick", lambda ctx: "done")
    inline = Inline(tasks)
    finished = inline.submit("quick")
    assert [r.outcome for r in inline.drain()] == ["succeeded"]  # its lease entry stays
    delayed = inline.submit("quick", delay_ms=60_000)
    inline.cancel(delayed)
    assert inline.state.table.leases and inline.state.table.delayed  # the stale entries
    assert inline.state.next_due_ms() is not None
    ticks = count_ticks(inline, monkeypatch)
    inline.advance(3_600_000)
    assert len(ticks) <= 3, ticks
    assert inline.state.next_due_ms() is None
    assert inline.job(delayed)["status"] == "cancelled"
    assert inline.job(finished)["status"] == "succeeded"
