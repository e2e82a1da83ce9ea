"""Fair turns within a queue (DESIGN.md §9.4, scheduler/fairness.py): a job's
`fairness: {key, weight}`; within a queue and priority, claims go round-robin across keys,
`weight` jobs of a key per turn; jobs without a key form one key together."""

from typing import Any

import pytest

from raftcron.scheduler.commands import CancelJob, ClaimJobs
from raftcron.scheduler.driver import Driver, Refused
from raftcron.scheduler.fairness import FairQueue
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.lines import ReadyQueue
from raftcron.scheduler.snapshot import restore, snapshot


def finalized() -> Driver:
    d = Driver()
    d.finalize()
    d.tick()
    return d


def fair(key: str, weight: int = 1) -> dict[str, Any]:
    return {"fairness": {"key": key, "weight": weight}}


def keys_of(d: Driver, claimed: list[tuple[int, int]]) -> list[str]:
    out = []
    for job_id, _ in claimed:
        spec = d.job(job_id).fairness
        out.append("-" if spec is None else spec.key)
    return out


def test_a_burst_of_one_key_does_not_make_another_key_wait_behind_it() -> None:
    d = finalized()
    for _ in range(10):
        d.submit_many(1_000, **fair("A"))
    d.submit_many(10, **fair("B"))  # submitted after all of A's
    claimed = d.claim(max=20)
    assert keys_of(d, claimed) == ["A", "B"] * 10
    # B's jobs went in their own order, and A's in theirs.
    assert [job_id for job_id, _ in claimed[1::2]] == sorted(j for j, _ in claimed[1::2])
    assert keys_of(d, d.claim(max=3)) == ["A", "A", "A"]  # B has none left
    assert violations(d.state) == []


def test_a_claim_of_n_jobs_takes_n_turns_and_weights_give_more_per_turn() -> None:
    d = finalized()
    d.submit_many(20, **fair("big", weight=3))
    d.submit_many(20, **fair("small"))
    assert keys_of(d, d.claim(max=8)) == ["big"] * 3 + ["small"] + ["big"] * 3 + ["small"]
    # One job per claim: the turns carry over from claim to claim.
    assert [keys_of(d, d.claim(max=1))[0] for _ in range(5)] == ["big"] * 3 + ["small", "big"]


def test_jobs_without_a_key_take_turns_as_one_key() -> None:
    d = finalized()
    d.submit_many(5)  # a plain queue at first
    assert type(d.state.table.ready["default"]) is ReadyQueue
    d.submit_many(5, **fair("A"))
    assert type(d.state.table.ready["default"]) is FairQueue
    assert keys_of(d, d.claim(max=6)) == ["-", "A", "-", "A", "-", "A"]
    d.claim(max=10)
    d.submit_many(2)  # the queue keeps its fair line, empty or not: one object a queue
    assert type(d.state.table.ready["default"]) is FairQueue
    assert keys_of(d, d.claim(max=2)) == ["-", "-"]


def test_priority_goes_first_and_turns_are_kept_per_priority() -> None:
    d = finalized()
    d.submit_many(3, **fair("A"))
    d.submit_many(3, **fair("B"), priority=5)
    d.submit_many(1, **fair("C"), priority=5)
    assert keys_of(d, d.claim(max=7)) == ["B", "C", "B", "B", "A", "A", "A"]


def test_a_key_whose_jobs_left_loses_its_turn_only_when_the_turns_reach_it() -> None:
    d = finalized()
    [a1] = d.submit_many(1, **fair("A"))
    d.submit_many(2, **fair("B"))
    d.submit_many(2, **fair("C"))
    d.ok(CancelJob(d.request_id(), a1))  # A keeps its place in the ring, with no job
    d.submit_many(1, **fair("A"))  # ... and takes its turn first, as it had it
    assert keys_of(d, d.claim(max=5)) == ["A", "B", "C", "B", "C"]
    assert violations(d.state) == []


@pytest.mark.parametrize("limit", ["rate", "concurrency"])
def test_a_head_held_back_at_its_turn_leaves_the_turn_to_its_keys_next_job(limit: str) -> None:
    # B3 and A4 share a limit key whose jobs give different maxes: B3 fits its max of 1 when it
    # lines up, but once A4 runs, B3 is held back at the claim that reaches it. The turn was
    # B's and nothing of B started in it: B's next job takes it, not A's.
    d = finalized()
    if limit == "rate":
        loose, tight = ({"rate": {"key": "r", "max": max_, "per_ms": 60_000}} for max_ in (2, 1))
    else:
        loose, tight = ({"concurrency": {"key": "k", "max": max_}} for max_ in (2, 1))
    d.submit_many(1, **fair("B"))
    [b3] = d.submit_many(1, **fair("B"), **tight)
    [a4] = d.submit_many(1, **fair("A"), **loose)
    [b5] = d.submit_many(1, **fair("B"))
    d.submit_many(1, **fair("A"))
    assert [job_id for job_id, _ in d.claim(max=2)][1] == a4  # B1, A4: B3 no longer fits
    assert [job_id for job_id, _ in d.claim(max=1)] == [b5]  # B's turn: B3 held, B5 in its place
    assert keys_of(d, d.claim(max=1)) == ["A"]
    assert d.job(b3).status == "queued"  # held, not lost
    assert violations(d.state) == []


def test_a_turn_given_back_is_the_first_again_when_a_new_key_lined_up_meanwhile() -> None:
    # A hold may line up a held job of another fairness key (a rate key's looser head) between
    # the pop and the give-back: the key whose job was held goes first again, the new key last.
    d = finalized()
    a, b, c = (d.job(d.submit(**fair(key))) for key in "ABC")
    line = FairQueue()
    line.push(a)
    line.push(b)
    line.peek()
    assert line.pop() == a.id
    line.remove(a)  # held back
    line.push(c)
    line.give_back()
    assert line.turns() == [[0, 0, ["A", "B", "C"]]]
    assert line.peek() == (0, b.run_at_ms, b.id)  # A has no job left: its place goes at the pop


def test_turns_survive_snapshot_and_restore_exactly() -> None:
    d = finalized()
    d.submit_many(6, **fair("A", weight=2))
    d.submit_many(6, **fair("B"))
    d.submit_many(3)
    d.claim(max=4)  # in the middle of a turn
    again = Driver(restore(snapshot(d.state)))
    assert snapshot(again.state) == snapshot(d.state)
    claim = ClaimJobs("after-restore", "w1", ("default",), 7, 30_000, ())
    answers = [replica.ok(claim) for replica in (d, again)]
    assert answers[0] == answers[1]
    assert snapshot(again.state) == snapshot(d.state)
    assert violations(again.state) == []


def test_fairness_is_refused_before_finalize() -> None:
    d = Driver()
    with pytest.raises(Refused) as refused:
        d.submit(**fair("A"))
    assert (refused.value.rejected.code, refused.value.rejected.field) == (
        "not_finalized", "jobs[0].fairness")


def test_a_retried_job_keeps_its_key_and_the_job_view_shows_it() -> None:
    from raftcron.scheduler.views import job_view

    d = finalized()
    [job_id] = d.submit_many(1, max_attempts=2, **fair("A", weight=2))
    [(claimed, token)] = d.claim()
    d.fail(claimed, token, retryable=True)
    assert job_view(d.state.table.jobs[job_id])["fairness"] == {"key": "A", "weight": 2}


@pytest.mark.parametrize("data", [
    {"key": "A"}, {"key": "A", "weight": 1}, {"key": "A", "weight": True},
    {"key": ["A"], "weight": 1}, {"key": "A", "weight": 1.0}, {"key": "", "weight": 2},
    {"key": "A", "weight": 0}, {"key": "A", "weight": 1, "extra": 1},
])
def test_a_spec_met_before_parses_as_the_first_time(data: dict[str, Any]) -> None:
    """The memo's short path answers only what the long one did: the same spec, or the
    same refusal naming the field."""
    from raftcron.scheduler.errors import Invalid
    from raftcron.scheduler.flowspecs import FairnessSpec, RateKeySpec

    FairnessSpec.parse({"key": "A", "weight": 1})  # in the memo
    RateKeySpec.parse({"key": "A", "max": 1, "per_ms": 1})
    rate = {"key": data.get("key"), "max": data.get("weight", 1), "per_ms": 1}
    for spec_type, value in ((FairnessSpec, data), (RateKeySpec, rate)):
        answers = []
        for _ in range(2):
            try:
                answers.append(spec_type.parse(value))
            except Invalid as error:
                answers.append((error.field, str(error)))
        assert answers[0] == answers[1]
        if type(value.get("weight", value.get("max"))) is bool:
            assert isinstance(answers[0], tuple)  # True is no number
