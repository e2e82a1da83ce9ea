"""Determinism of the core, stated plainly (the model test checks the same after every step).

Two states fed the same commands give byte-identical snapshots; a state restored from a
snapshot mid-run and fed the rest of the commands ends byte-identical to one that never stopped.
"""

import gc
import random
import weakref

import msgpack
import pytest

from raftcron.scheduler import codec
from raftcron.scheduler.commands import (
    Ack,
    ClaimJobs,
    PutSchedule,
    SubmitJobs,
    SubmitWorkflow,
    Tick,
)
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.snapshot import restore, snapshot
from raftcron.scheduler.specs import JobSpec, WorkflowSpec
from raftcron.scheduler.state import SchedulerState

T0 = 1_800_000_000_000


def workload(seed: int, steps: int) -> list[bytes]:
    """A replayable log: submits, workflows, schedules, claims with acks, ticks."""
    rng = random.Random(seed)
    scratch = SchedulerState()
    log: list[bytes] = []

    def emit(command):
        data = codec.encode(command)
        log.append(data)
        return scratch.apply(codec.decode(data))

    emit(Tick(T0))
    emit(
        PutSchedule(
            None,
            "p1",
            ScheduleSpec.parse({"every": "2s", "job": {"task": "s"}, "overlap": "forbid"}),
        )
    )
    emit(
        PutSchedule(
            None,
            "p2",
            ScheduleSpec.parse(
                {
                    "cron": "*/3 * * * * *",
                    "tz": "Europe/Paris",
                    "job": {"task": "c"},
                    "jitter_ms": 500,
                }
            ),
        )
    )
    running: list[tuple[int, int]] = []
    for step in range(steps):
        roll = rng.random()
        if roll < 0.3:
            specs = tuple(
                JobSpec(task="t", priority=rng.randint(0, 3), delay_ms=rng.choice([0, 700]))
                for _ in range(rng.randint(1, 5))
            )
            emit(SubmitJobs(f"s{step}", specs))
        elif roll < 0.35:
            emit(
                SubmitWorkflow(
                    f"w{step}",
                    WorkflowSpec.parse(
                        {
                            "jobs": [
                                {"name": "a", "task": "t"},
                                {"name": "b", "task": "t", "after": ["a"]},
                            ]
                        }
                    ),
                )
            )
        elif roll < 0.7:
            acks = tuple(
                Ack(job_id, token, rng.choice(["succeeded", "failed"]))
                for job_id, token in running[: rng.randint(0, len(running))]
            )
            running = running[len(acks) :]
            result = emit(
                ClaimJobs(
                    f"c{step}",
                    rng.choice(["w1", "w2"]),
                    ("default",),
                    rng.randint(0, 4),
                    rng.choice([1_000, 4_000]),
                    acks,
                )
            )
            running += [(job_id, token) for job_id, token in result.value["jobs"]]
        else:
            emit(Tick(scratch.now_ms + rng.choice([10, 300, 1_000, 5_000])))
    return log


def replay(log: list[bytes], state: SchedulerState | None = None) -> SchedulerState:
    state = state or SchedulerState()
    for data in log:
        state.apply(codec.decode(data))
    return state


def test_two_replicas_fed_the_same_log_have_identical_snapshots():
    log = workload(seed=7, steps=1_500)
    first, second = replay(log), replay(log)
    assert len(first.table) > 100 and first.fence > 100
    assert snapshot(first) == snapshot(second)
    assert violations(first) == []


def test_restore_mid_run_then_continue_equals_never_stopping():
    log = workload(seed=11, steps=1_500)
    never_stopped = replay(log)
    for cut in (1, 400, 999, 1_400):
        restored = restore(snapshot(replay(log[:cut])))
        assert snapshot(replay(log[cut:], restored)) == snapshot(never_stopped), f"cut at {cut}"


def test_a_snapshot_survives_a_round_trip_unchanged():
    state = replay(workload(seed=3, steps=800))
    blob = snapshot(state)
    assert snapshot(restore(blob)) == blob


def test_a_snapshot_larger_than_the_restore_chunks_survives_a_round_trip():
    # restore() streams the blob in 1 MiB chunks: jobs straddle the chunks' edges.
    state = replay(workload(seed=5, steps=200))
    state.apply(SubmitJobs("big", (JobSpec.parse({"task": "t", "payload": "x" * 60_000}),) * 40))
    blob = snapshot(state)
    assert len(blob) > 2 * (1 << 20)
    assert snapshot(restore(blob)) == blob


@pytest.mark.parametrize("damage", ["trailing", "truncated", "version"])
def test_a_damaged_snapshot_is_refused(damage):
    blob = snapshot(replay(workload(seed=3, steps=200)))
    bad = {
        "trailing": blob + b"\x00",
        "truncated": blob[:-1],
        "version": blob[:1] + b"\x09" + blob[2:],  # the first field after the array header
    }[damage]
    with pytest.raises(ValueError):
        restore(bad)


def test_schedules_put_from_one_spec_share_it_after_a_restore_and_snapshot_the_same() -> None:
    state = SchedulerState()
    state.apply(Tick(T0))
    for name, minute in (("a", 5), ("b", 5), ("c", 7)):
        spec = ScheduleSpec.parse({"cron": f"{minute} * * * *", "job": {"task": "t"}})
        state.apply(PutSchedule(None, name, spec))
    blob = snapshot(state)

    restored = restore(blob)

    a, b, c = (restored.schedules[name].spec for name in "abc")
    assert a is b and a is not c and a == state.schedules["a"].spec
    assert snapshot(restored) == blob


@pytest.mark.parametrize("jobs", [0, 1, 15, 16, 10_001])
def test_a_snapshot_in_pieces_is_the_canonical_msgpack_of_its_fields(jobs: int) -> None:
    """The pieces a writer compresses one by one join to the msgpack of the snapshot's list
    of fields, byte for byte as msgpack writes it whole (array headers of every size)."""
    from raftcron.scheduler.snapshot import snapshot_pieces

    state = SchedulerState()
    state.apply(Tick(1_000))
    if jobs:
        state.apply(SubmitJobs(None, (JobSpec(task="t", payload={"n": 1}),) * jobs))
    joined = b"".join(snapshot_pieces(state))
    assert joined == msgpack.packb(msgpack.unpackb(joined, raw=False, strict_map_key=False),
                                   use_bin_type=True)
    assert joined == snapshot(state) and restore(joined).next_job_id == jobs + 1


def test_a_state_applied_or_restored_is_freed_by_reference_counting_alone():
    """No reference cycle in the state: a node freezes a restored state out of the cyclic
    GC's reach (gc.freeze, cluster/consensus/replica.py), so a cycle in the state that the next
    snapshot install replaces would never be freed. The job table and its retention order were one
    (a bound method held back): a follower leaked its whole job table at every install."""
    state = replay(workload(seed=5, steps=800))
    restored = restore(snapshot(state))
    assert len(state.table) > 50 and state.schedules and state.workflows
    gc.collect()
    gc.disable()
    try:
        tables = [weakref.ref(state.table), weakref.ref(restored.table)]
        del state, restored
        assert [table() for table in tables] == [None, None]
        assert gc.collect() == 0
    finally:
        gc.enable()
