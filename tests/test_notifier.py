"""The deliverer (cluster/ops/notifier.py) in one process: the real core behind a fake replica
(reads and proposals go straight to it) and receivers on loopback. A receiver that never
answers holds up only its own notification and never the event loop; a failing one is
retried until it answers 2xx, after waits that double up to a cap; only the leader posts; acks
move the replicated cursor."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from raftcron.cluster.ops.notifier import (
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    Notifier,
    retry_delay_s,
    signature,
)
from raftcron.scheduler.commands import ClaimJobs, FailJob, SubmitJobs
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.errors import Result
from raftcron.scheduler.notifications import NotificationSpec, PutNotification
from raftcron.scheduler.specs import JobSpec

T0 = 1_800_000_000_000
SECRET = "unit-secret-0123456789"


class FakeReplica:
    """What the notifier uses of a RaftNode and a Proposer, over one in-memory core."""

    def __init__(self) -> None:
        self.driver = Driver(now_ms=T0)
        self.machine = self

    def read(self, query: Callable[[Any], Any]) -> Any:
        return query(self.driver.state)

    async def propose(self, command: Any) -> Result:
        return self.driver.apply(command)


def put(replica: FakeReplica, name: str, url: str) -> None:
    spec = NotificationSpec.parse({"url": url, "events": ["dead_letter"], "secret": SECRET})
    replica.driver.ok(PutNotification(replica.driver.request_id(), name, spec))


def dead_letters(replica: FakeReplica, count: int) -> None:
    d = replica.driver
    d.ok(SubmitJobs(d.request_id(), (JobSpec.parse({"task": "t", "max_attempts": 1}),) * count))
    for job_id, token in d.ok(ClaimJobs(d.request_id(), "w", ("default",), max=count))["jobs"]:
        d.ok(FailJob(d.request_id(), job_id, token, "x", retryable=False))


Handler = Callable[[web.Request], Awaitable[web.Response]]


async def serve(handlers: dict[str, Handler]) -> tuple[web.AppRunner, str]:
    app = web.Application()
    for path, handler in handlers.items():
        app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 10) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(poll(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None


def notifier(replica: FakeReplica, leading: Callable[[], bool] = lambda: True,
             timeout_s: float = 0.3) -> Notifier:
    return Notifier(replica, replica, leading, timeout_s=timeout_s,  # type: ignore[arg-type]
                    backoff_first_s=0.02, backoff_max_s=0.1, poll_s=0.02)


def test_a_receiver_that_never_answers_holds_up_only_its_own_notification() -> None:
    async def main() -> None:
        got: list[bytes] = []
        stuck = asyncio.Event()

        async def fast(request: web.Request) -> web.Response:
            got.append(await request.read())
            return web.Response()

        async def hang(request: web.Request) -> web.Response:
            await stuck.wait()  # never set: the notifier's own timeout must end the POST
            return web.Response()

        runner, base = await serve({"/fast": fast, "/hang": hang})
        replica = FakeReplica()
        put(replica, "slow", f"{base}/hang")
        put(replica, "quick", f"{base}/fast")
        dead_letters(replica, 20)
        # A POST that waited on the loop for its answer would stall it 1.5 s per attempt.
        deliverer = notifier(replica, timeout_s=1.5)
        deliverer.start()
        # The loop's own latency while a receiver hangs: a 10 ms sleep must not take long.
        worst_s, loop = 0.0, asyncio.get_running_loop()

        async def probe() -> None:
            nonlocal worst_s
            while True:
                started = loop.time()
                await asyncio.sleep(0.01)
                worst_s = max(worst_s, loop.time() - started - 0.01)

        prober = asyncio.create_task(probe())
        try:
            await until(lambda: len(got) == 20, "every event at the quick receiver")
            await until(lambda: deliverer.stats.of("slow").failed >= 2, "the slow one retried")
            view = replica.read(lambda s: s.notifications.by_name)
            assert view["quick"].pending == 0 and view["quick"].delivered == 20
            assert view["slow"].pending == 20 and view["slow"].delivered == 0
            assert "no answer within 1.5 s" in str(deliverer.stats.of("slow").last_error)
            assert worst_s < 1.0, f"the event loop stalled {worst_s:.3f} s"
        finally:
            prober.cancel()
            await deliverer.stop()
            stuck.set()
            await runner.cleanup()

    asyncio.run(main())


def test_a_failing_receiver_is_retried_until_it_answers_and_in_order() -> None:
    async def main() -> None:
        answers = [500, 503, 404, 200]  # then 200 for ever
        posts: list[tuple[dict[str, str], bytes]] = []

        async def flaky(request: web.Request) -> web.Response:
            posts.append((dict(request.headers), await request.read()))
            return web.Response(status=answers.pop(0) if answers else 200)

        runner, base = await serve({"/hook": flaky})
        replica = FakeReplica()
        put(replica, "ops", f"{base}/hook")
        dead_letters(replica, 3)
        deliverer = notifier(replica)
        deliverer.start()
        try:
            await until(lambda: replica.read(
                lambda s: s.notifications.by_name["ops"].pending) == 0, "all acknowledged")
        finally:
            await deliverer.stop()
            await runner.cleanup()
        ids = [headers["X-Raftcron-Delivery"] for headers, _ in posts]
        assert ids == ["ops/1"] * 4 + ["ops/2", "ops/3"]  # in order: a retry holds the rest
        for headers, body in posts:
            expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
            assert headers["X-Raftcron-Signature"] == expected == signature(SECRET, body)
            assert headers["Content-Type"] == "application/json"
            assert json.loads(body)["notification"] == "ops"
        assert deliverer.stats.of("ops").failed == 3 and deliverer.stats.of("ops").posted == 3
        assert replica.read(lambda s: s.notifications.by_name["ops"].delivered) == 3

    asyncio.run(main())


def test_only_the_leader_posts_and_a_new_one_resumes_at_the_replicated_cursor() -> None:
    async def main() -> None:
        posts: list[str] = []

        async def hook(request: web.Request) -> web.Response:
            posts.append(request.headers["X-Raftcron-Delivery"])
            return web.Response()

        runner, base = await serve({"/hook": hook})
        replica = FakeReplica()
        put(replica, "ops", f"{base}/hook")
        leading = False
        deliverer = notifier(replica, lambda: leading)
        deliverer.start()
        try:
            dead_letters(replica, 2)
            await until(lambda: deliverer.workers == {} and replica.read(
                lambda s: s.notifications.last_seq) == 2, "a follower that stays idle")
            assert posts == []
            leading = True
            await until(lambda: len(posts) == 2, "the leader's posts")
            await until(lambda: replica.read(lambda s: s.notifications.by_name["ops"].cursor) == 2,
                        "the cursor acknowledged")
            leading = False
            await until(lambda: deliverer.workers == {}, "the deposed leader's workers stopped")
            dead_letters(replica, 1)
            leading = True  # a new term: it starts from the replicated cursor, not from 0
            await until(lambda: len(posts) == 3, "the new event only")
            assert posts == ["ops/1", "ops/2", "ops/3"]
        finally:
            await deliverer.stop()
            await runner.cleanup()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("failures", "first_s", "max_s", "delay_s"),
    [
        (1, 1.0, 60.0, 1.0),
        (2, 1.0, 60.0, 2.0),
        (3, 1.0, 60.0, 4.0),
        (6, 1.0, 60.0, 32.0),
        (7, 1.0, 60.0, 60.0),  # 64 s would pass the cap
        (8, 1.0, 60.0, 60.0),
        (100_000, 1.0, 60.0, 60.0),  # days of failures: still the cap, no overflow
        (1, 0.02, 0.1, 0.02),
        (3, 0.02, 0.1, 0.08),
        (4, 0.02, 0.1, 0.1),
    ],
)
def test_the_wait_after_each_failure_doubles_up_to_the_cap(
    failures: int, first_s: float, max_s: float, delay_s: float
) -> None:
    assert retry_delay_s(failures, first_s=first_s, max_s=max_s) == delay_s


def test_a_failing_receiver_is_retried_after_waits_that_double_up_to_the_cap() -> None:
    """The deliverer's own schedule, with its default backoff: its waits are recorded, not
    slept (each within the +-20 % jitter of 1, 2, 4 ... 60 s)."""

    async def main() -> None:
        answers = [503] * 9  # then 200
        waits: list[float] = []

        async def flaky(request: web.Request) -> web.Response:
            return web.Response(status=answers.pop(0) if answers else 200)

        async def record(delay_s: float) -> None:
            waits.append(delay_s)
            await asyncio.sleep(0)

        runner, base = await serve({"/hook": flaky})
        replica = FakeReplica()
        put(replica, "ops", f"{base}/hook")
        dead_letters(replica, 1)
        deliverer = Notifier(replica, replica, lambda: True,  # type: ignore[arg-type]
                             timeout_s=5, poll_s=0.02, sleep=record)
        deliverer.start()
        try:
            await until(lambda: replica.read(
                lambda s: s.notifications.by_name["ops"].pending) == 0, "acknowledged")
        finally:
            await deliverer.stop()
            await runner.cleanup()
        nominal = [min(BACKOFF_FIRST_S * 2**n, BACKOFF_MAX_S) for n in range(9)]
        assert nominal == [1, 2, 4, 8, 16, 32, 60, 60, 60]
        assert len(waits) == 9, waits
        for wait_s, nominal_s in zip(waits, nominal, strict=True):
            assert 0.8 * nominal_s <= wait_s <= 1.2 * nominal_s, (waits, nominal)
        assert deliverer.stats.of("ops").failed == 9

    asyncio.run(main())
