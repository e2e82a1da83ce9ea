"""A submit that says `unique` or `debounce_ms`: what happens to the job holding its key.

The plain `key` (no `unique`, no `debounce_ms`) stays first-wins: while the key is remembered
(a day), a submit with it answers the first job and creates nothing. A submit that says more
decides against the job holding the key now, E (None if the key is forgotten or E is gone):

1. `debounce_ms` and E is `scheduled` and never started (it is waiting out its quiet period):
   E moves to now + debounce_ms (never past E's creation + `debounce_max_ms`) and takes this
   submit's payload (the latest one wins). Answer: E, not created, `debounced`.
2. `unique` and E is in one of its `states` and was created less than `period_ms` ago:
   `on_conflict: ignore` answers E, not created; `replace` cancels E if it is not final
   (reason `replaced`; a running E's worker hears so at its next heartbeat), then creates a
   new job that takes the key. Answer: the new job, created, `replaced` E.
3. Otherwise a new job is created and takes the key (the earlier one keeps running, or stays
   as it ended). A submit with `debounce_ms` alone is unique with no state: once E is due, or
   ran, the next submit starts a new quiet period with a new job.

The key of a job with `unique` is remembered at least for its period (the job retention when
that is longer than the key window), so a conflict within the period is always found.
"""

from __future__ import annotations

from typing import Any

from raftcron.scheduler import jobs as j
from raftcron.scheduler import limits
from raftcron.scheduler.errors import Invalid, Rejected
from raftcron.scheduler.flowstate import FlowState
from raftcron.scheduler.frozen import FrozenJob
from raftcron.scheduler.jobs import Job
from raftcron.scheduler.specs import JobSpec


def submit(
    state: FlowState, spec: JobSpec, index: int, notes: dict[str, list[Any]]
) -> list[Any]:
    """Apply one submit (the `index`th of its command) whose spec has `unique` or
    `debounce_ms`, and so a key: [job id, created], as a plain submit answers. What it did to
    the job holding the key is added to `notes`: `debounced` [index], `replaced`
    [[index, replaced job id]]."""
    key = spec.key
    assert key is not None and (spec.unique is not None or spec.debounce_ms is not None)
    existing = state.table.job_for_key(key)
    if existing is not None and spec.debounce_ms is not None and _waiting(existing):
        assert isinstance(existing, Job)  # scheduled: never frozen
        _debounce(state, existing, spec)
        notes.setdefault("debounced", []).append(index)
        return [existing.id, False]
    unique = spec.unique
    if (
        existing is not None
        and unique is not None
        and existing.status in unique.states
        and state.now_ms - existing.created_ms < unique.period_ms
    ):
        if unique.on_conflict == "ignore":
            return [existing.id, False]
        if not existing.final:
            live = state.table.live(existing.id)
            assert live is not None
            state.cancel_job(live, j.REPLACED)
        notes.setdefault("replaced", []).append([index, existing.id])
    return [state.create_job(spec, key=key).id, True]


def _waiting(job: Job | FrozenJob) -> bool:
    """Not yet due and never started: a debounce moves it rather than start another."""
    return job.status == j.SCHEDULED and job.attempts == 0


def _debounce(state: FlowState, job: Job, spec: JobSpec) -> None:
    assert spec.debounce_ms is not None
    run_at_ms = state.now_ms + spec.debounce_ms
    if spec.debounce_max_ms is not None:
        run_at_ms = min(run_at_ms, job.created_ms + spec.debounce_max_ms)
    job.run_at_ms = max(run_at_ms, state.now_ms)
    job.payload = j.pack(spec.payload)
    # Re-filed under its new due time (due at once if the cap has passed); the old heap entry
    # is skipped when it surfaces.
    state.table.set_status(job, j.QUEUED if job.run_at_ms <= state.now_ms else j.SCHEDULED)


def check_periods(state: FlowState, specs: tuple[JobSpec, ...]) -> Rejected | None:
    """A `unique` period reaches back at most as far as the keys are kept. Before the gate
    (scheduler/gate.py): the 7-day constant, which the previous release's parser enforced;
    after: the longest retention setting, so a conflict within the period is always found."""
    longest_ms = (state.settings.retention.longest_age_ms() if state.finalized
                  else limits.UNIQUE_PERIOD_MS_MAX)
    for index, spec in enumerate(specs):
        if spec.unique is None or spec.unique.period_ms <= longest_ms:
            continue
        why = ("the longest retention of finished jobs: keys are remembered that long"
               if state.finalized else "the retention of finished jobs")
        return Rejected.from_invalid(Invalid(
            f"jobs[{index}].unique.period_ms",
            f"must be at most {longest_ms} ({why}), not {spec.unique.period_ms}"))
    return None
