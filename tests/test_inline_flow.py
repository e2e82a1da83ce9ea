"""raftcron.testing.Inline runs jobs with flow control as a cluster would (DESIGN.md §9.4): a
job's rate key spreads its starts over the window (the inline time moves to each opening), and
fairness keys take turns."""

from raftcron.cluster.worker import TaskRegistry
from raftcron.testing import Inline


def recording() -> tuple[Inline, list[int]]:
    """An Inline whose `call-api` task notes the cluster's time it starts at."""
    tasks = TaskRegistry()
    started: list[int] = []

    @tasks.task("call-api")
    def call_api(ctx):
        started.append(inline.now_ms)

    inline = Inline(tasks)
    return inline, started


def test_a_rate_key_spreads_the_starts_and_the_time_moves_to_each_window() -> None:
    inline, started = recording()
    begin = inline.now_ms
    rate = {"key": "cust-42", "max": 2, "per_ms": 1_000}
    for _ in range(5):
        inline.submit("call-api", rate=rate)
    runs = inline.drain()
    assert [r.outcome for r in runs] == ["succeeded"] * 5
    assert len(started) == 5
    for first, at in enumerate(started):  # never 3 in a second of the cluster's clock
        assert len([t for t in started[first:] if t - at < 1_000]) <= 2, started
    assert 2_000 <= started[-1] - begin < 2_100, started  # 2, 2, 1: two windows waited


def test_a_queue_rate_limit_is_an_exact_window_inline() -> None:
    inline, started = recording()
    view = inline.put_queue("metered", rate_limit={"max": 5, "per_ms": 1_000})
    assert view["rate_rule"] == "window"
    for _ in range(15):
        inline.submit("call-api", queue="metered")
    inline.drain()
    assert len(started) == 15
    for first, at in enumerate(started):  # 5, 5 a second later, 5 a second after that
        assert len([t for t in started[first:] if t - at < 1_000]) <= 5, started
    assert started[-1] - started[0] >= 2_000


def test_fairness_keys_take_turns() -> None:
    tasks = TaskRegistry()
    order: list[str] = []

    @tasks.task("export")
    def export(ctx):
        order.append(ctx.payload["customer"])

    inline = Inline(tasks)
    for _ in range(4):
        inline.submit("export", {"customer": "A"}, fairness={"key": "A"})
    for _ in range(2):
        inline.submit("export", {"customer": "B"}, fairness={"key": "B"})
    inline.drain()
    assert order == ["A", "B", "A", "B", "A", "A"]
