"""Flow control in the core model: hypothesis rules and the checks they must pass.

`FlowRules` is a mixin for tests/test_core_model.py's `CoreModel` (and so for tier 0's
`ChaosCoreModel`, which adds leader changes, clock jumps and duplicates): rules that set queue
limits, pause and resume queues, submit jobs with concurrency keys, `unique` and `debounce`,
and run bulk actions. `check_flow` runs after EVERY command any rule applies (claims, acks,
lease expiries, leader changes, snapshot/restores included), from the job records, not the
store's counters:

* a key never has more running jobs than its max (each key has one max here), nor more
  running and in line (the rest are held out of every queue: a claim never walks past them);
* a queue's running jobs never rise while at or above its concurrency cap (a cap lowered
  below what runs lets the excess finish);
* no job of a paused queue is handed out;
* a queue's claims since its rate was set, over any window [s, t], are at most
  `max + (t - s) * max // per_ms` (the bucket plus what the window refills).

Each unique or debounced submit, and each bulk action, is checked against an oracle written
from the rules in scheduler/uniqueness.py and scheduler/bulk.py, evaluated on the state
before the command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import rule

from raftcron.scheduler import jobs as j
from raftcron.scheduler.bulk import APPLIES_TO
from raftcron.scheduler.commands import ClaimJobs, SubmitJobs
from raftcron.scheduler.errors import Ok
from raftcron.scheduler.flowcommands import BulkJobs, PauseQueue, PutQueue, ResumeQueue
from raftcron.scheduler.flowspecs import BulkFilter, QueueSpec
from raftcron.scheduler.frozen import readable
from raftcron.scheduler.specs import JobSpec

FLOW_QUEUES = ("default", "emails")
KEY_MAX = {"a": 1, "b": 2}  # one max per concurrency key
RATE_KEYS = {"r1": (1, 1_000), "r2": (2, 300)}  # one (max, per_ms) per rate key
UNIQUE_KEYS = ("k1", "k2", "u1")
caps = st.sampled_from([None, 1, 2, 3])
rates = st.sampled_from([None, (1, 1_000, None), (3, 2_000, None), (2, 500, None),
                         (2, 500, 3), (3, 2_000, 1)])  # (max, per_ms, burst)
concurrency = st.one_of(st.none(), st.sampled_from(sorted(KEY_MAX)))
states = st.lists(st.sampled_from(j.STATUSES), min_size=1, max_size=4, unique=True)


def concurrency_field(key: str | None) -> dict[str, Any]:
    return {} if key is None else {"concurrency": {"key": key, "max": KEY_MAX[key]}}


class FlowRules:
    """Mix into a machine with `state`, `apply(command)` and `rid()`."""

    state: Any

    def __init__(self) -> None:
        super().__init__()
        # queue -> ((its rate, its rule), the times of its claims since that rate was set)
        self.rates_seen: dict[str, tuple[Any, list[int]]] = {}
        self.caps_seen: dict[str, tuple[int | None, int]] = {}  # queue -> (cap, allowance)

    # -- rules ----------------------------------------------------------------------------

    @rule(queue=st.sampled_from(FLOW_QUEUES), paused=st.sampled_from([False, False, True]),
          cap=caps, rate=rates)
    def put_queue(self, queue: str, paused: bool, cap: int | None, rate: Any) -> None:
        limit = None if rate is None else {"max": rate[0], "per_ms": rate[1]}
        if rate is not None and rate[2] is not None:
            limit = {**limit, "burst": rate[2]}
        spec = QueueSpec(paused, cap, None if limit is None else QueueSpec.parse(
            {"rate_limit": limit}).rate_limit)
        finalized = self.state.finalized
        result = self.apply(PutQueue(self.rid(), queue, spec))  # type: ignore[attr-defined]
        control = self.state.queues.get(queue)
        if limit is not None and "burst" in limit and not finalized:
            assert not isinstance(result, Ok) and result.code == "not_finalized", result
        elif limit is not None and isinstance(result, Ok):
            # A limit put once the cluster is finalized is an exact window (DESIGN.md §9.4)
            # unless it asks for a bucket; before, it is the previous release's bucket.
            window = finalized and "burst" not in limit
            assert control is not None and control.rule == ("window" if window else "bucket")

    @rule(queue=st.sampled_from(FLOW_QUEUES), pause=st.booleans())
    def pause_or_resume_queue(self, queue: str, pause: bool) -> None:
        command = PauseQueue if pause else ResumeQueue
        self.apply(command(self.rid(), queue))  # type: ignore[attr-defined]

    @rule(key=concurrency, queue=st.sampled_from(FLOW_QUEUES), count=st.integers(1, 4),
          priority=st.integers(-1, 1), delay=st.sampled_from([None, 500]))
    def submit_with_a_concurrency_key(
        self, key: str | None, queue: str, count: int, priority: int, delay: int | None
    ) -> None:
        spec = JobSpec.parse({"task": "t", "queue": queue, "priority": priority,
                              "delay_ms": delay, "max_attempts": 2, **concurrency_field(key)})
        self.apply(SubmitJobs(self.rid(), (spec,) * count))  # type: ignore[attr-defined]

    @rule(key=st.sampled_from(sorted(RATE_KEYS)), ckey=concurrency,
          queue=st.sampled_from(FLOW_QUEUES), count=st.integers(1, 4))
    def submit_with_a_rate_key(self, key: str, ckey: str | None, queue: str, count: int) -> None:
        limit, per_ms = RATE_KEYS[key]
        spec = JobSpec.parse({"task": "t", "queue": queue, "max_attempts": 2,
                              "rate": {"key": key, "max": limit, "per_ms": per_ms},
                              **concurrency_field(ckey)})
        finalized = self.state.finalized
        result = self.apply(SubmitJobs(self.rid(), (spec,) * count))  # type: ignore[attr-defined]
        if not finalized:  # the previous release knows no rate: refused until finalize
            assert not isinstance(result, Ok) and result.code == "not_finalized", result

    @rule(key=st.sampled_from(["f1", "f2", "f3"]), weight=st.integers(1, 3),
          queue=st.sampled_from(FLOW_QUEUES), count=st.integers(1, 4),
          priority=st.integers(-1, 1), rate=st.sampled_from([None, "r1", "r2"]))
    def submit_with_a_fairness_key(self, key: str, weight: int, queue: str, count: int,
                                   priority: int, rate: str | None) -> None:
        """Fair turns (scheduler/fairness.py), beside the queue's plain jobs, rate keys and
        concurrency keys: the invariants and the replica's digest judge the lines."""
        fields: dict[str, Any] = {"task": "t", "queue": queue, "priority": priority,
                                  "fairness": {"key": key, "weight": weight}}
        if rate is not None:
            fields["rate"] = {"key": rate, "max": RATE_KEYS[rate][0],
                              "per_ms": RATE_KEYS[rate][1]}
        finalized = self.state.finalized
        spec = JobSpec.parse(fields)
        result = self.apply(SubmitJobs(self.rid(), (spec,) * count))  # type: ignore[attr-defined]
        if not finalized:
            assert not isinstance(result, Ok) and result.code == "not_finalized", result

    @rule(worker=st.sampled_from(["w1", "w2"]), count=st.integers(1, 5),
          lease=st.sampled_from([1_000, 5_000]))
    def claim_many(self, worker: str, count: int, lease: int) -> None:
        """Workers asking for more than the limits allow, from every flow queue."""
        command = ClaimJobs(self.rid(), worker, FLOW_QUEUES, count, lease)  # type: ignore[attr-defined]
        self.apply(command)  # type: ignore[attr-defined]

    @rule(key=st.sampled_from(UNIQUE_KEYS), unique=st.one_of(st.none(), states),
          period=st.sampled_from([1_000, 60_000, 86_400_000]),
          on_conflict=st.sampled_from(["ignore", "replace"]),
          debounce=st.sampled_from([None, None, 500, 2_000]),
          debounce_max=st.sampled_from([None, 3_000]), concurrency_key=concurrency)
    def submit_unique_or_debounced(
        self, key: str, unique: list[str] | None, period: int, on_conflict: str,
        debounce: int | None, debounce_max: int | None, concurrency_key: str | None,
    ) -> None:
        if unique is None and debounce is None:
            debounce = 500
        fields: dict[str, Any] = {"task": "t", "key": key, "payload": self.rid(),
                                  **concurrency_field(concurrency_key)}
        if unique is not None:
            fields["unique"] = {"states": unique, "period_ms": period, "on_conflict": on_conflict}
        if debounce is not None:
            fields["debounce_ms"] = debounce
            if debounce_max is not None:
                fields["debounce_max_ms"] = max(debounce, debounce_max)
        spec = JobSpec.parse(fields)
        expected = self.expected_submit(spec)
        evicted = evictions(self.state)
        result = self.apply(SubmitJobs(self.rid(), (spec,)))  # type: ignore[attr-defined]
        if not isinstance(result, Ok) and result.code == "state_full":
            assert self.state.finalized, result  # refused for space only past the gate
            return
        assert isinstance(result, Ok), result
        assert result.value == expected.answer, (spec, result.value, expected.answer)
        expected.check(self.state, evicted_now=evictions(self.state) > evicted)

    @rule(action=st.sampled_from(sorted(APPLIES_TO)),
          status=st.one_of(st.none(), st.sampled_from(j.STATUSES)),
          queue=st.one_of(st.none(), st.sampled_from(FLOW_QUEUES)),
          task=st.sampled_from([None, None, "t", "child"]),
          max_jobs=st.sampled_from([1, 2, 1_000]), cursor=st.integers(0, 12))
    def bulk_action(self, action: str, status: str | None, queue: str | None,
                    task: str | None, max_jobs: int, cursor: int) -> None:
        where = BulkFilter(status=status, queue=queue, task=task)
        before = {job.id: _Seen.of(job) for job in self.state.table}
        statuses = APPLIES_TO[action] & ({status} if status else set(j.STATUSES))
        eligible = [
            job_id for job_id, job in before.items()
            if job_id > cursor and job.status in statuses
            and (queue is None or job.queue == queue) and (task is None or job.task == task)
        ]
        next_job_id = self.state.next_job_id
        evicted = evictions(self.state)
        command = BulkJobs(self.rid(), action, where, max_jobs, cursor)  # type: ignore[attr-defined]
        result = self.apply(command)  # type: ignore[attr-defined]
        assert isinstance(result, Ok), result
        answer = result.value
        matched = eligible[:max_jobs]
        assert answer["matched"] == len(matched), (answer, matched)
        if not answer["more"]:
            assert matched == eligible, "a bulk said it was done with matches left"
        after = {job.id: _Seen.of(job) for job in self.state.table}
        changed = [job_id for job_id in matched if _changed(before[job_id], after.get(job_id))]
        assert answer["changed"] == len(changed), (answer, changed)
        for job_id in set(matched) - set(changed):
            # A retry may be refused (a parent still failed); a delete keeps a job that did not
            # succeed while a dependent of it remains.
            kept = action == "retry" or (
                action == "delete" and after[job_id].status != j.SUCCEEDED
                and any(child in after for child in after[job_id].children)
            )
            assert kept, f"bulk {action} matched job {job_id} and left it as it was"
        if action == "delete":
            for job_id in changed:
                assert job_id not in after
        collateral = _descendants(before, matched) | _same_schedule(before, matched)
        # Past the budget the command's own settling evicts finished jobs, matched or not.
        evicted_now = evictions(self.state) - evicted
        for job_id, job in before.items():
            if job_id not in matched and job_id not in collateral:
                if job_id not in after and job.status in j.FINAL and evicted_now:
                    evicted_now -= 1
                    continue
                assert job_id in after and after[job_id].status == job.status, (
                    f"bulk {action} {where} changed job {job_id}, which it did not match"
                )
        assert all(job_id >= next_job_id for job_id in set(after) - set(before))

    # -- oracle of a unique submit ----------------------------------------------------------

    def expected_submit(self, spec: JobSpec) -> Any:
        return ExpectedSubmit(self.state, spec)

    # -- checks after every command ---------------------------------------------------------

    def check_flow(self, command: Any, result: Any, fence_before: int) -> None:
        state = self.state
        running_by_queue: dict[str, int] = {}
        running_by_key: dict[str, int] = {}
        for job_id in state.table.by_status[j.RUNNING]:
            job = readable(state.table.jobs[job_id])
            running_by_queue[job.queue] = running_by_queue.get(job.queue, 0) + 1
            if job.concurrency_key is not None:
                key = job.concurrency_key
                running_by_key[key] = running_by_key.get(key, 0) + 1
                assert running_by_key[key] <= KEY_MAX[key], f"key {key}: {running_by_key[key]} run"
        for key, in_line in state.table.key_ready.items():
            # A key's jobs in line and running stay within its max: the rest are held out of
            # every queue, so a claim never walks past them (bounded claim cost).
            taken = in_line + running_by_key.get(key, 0)
            assert taken <= KEY_MAX[key], f"key {key}: {taken} running or in line"
        for queue in FLOW_QUEUES:
            control = state.queues.get(queue)
            cap = None if control is None else control.spec.concurrency_max
            now_running = running_by_queue.get(queue, 0)
            seen_cap, allowance = self.caps_seen.get(queue, (None, 0))
            if cap != seen_cap:
                allowance = now_running  # a new cap: what already runs may finish
            if cap is not None and now_running > cap:
                assert now_running <= allowance, (
                    f"queue {queue}: {now_running} running, over its cap {cap}"
                )
            self.caps_seen[queue] = (cap, min(allowance, now_running))
            rate = None if control is None or control.spec.rate_limit is None else (
                control.spec.rate_limit, control.rule)
            if rate != self.rates_seen.get(queue, (None, []))[0]:
                self.rates_seen[queue] = (rate, [])
        if isinstance(command, ClaimJobs) and isinstance(result, Ok):
            for job_id, token in result.value["jobs"]:
                if token <= fence_before:
                    continue  # a repeated claim, answered from memory
                queue = readable(state.table.jobs[job_id]).queue
                control = state.queues.get(queue)
                assert control is None or not control.spec.paused, f"paused {queue} handed out"
                rate, times = self.rates_seen.get(queue, (None, []))
                if rate is not None:
                    times.append(state.now_ms)
                    _check_rate(queue, rate, times)
            _check_rate_keys(state)


@dataclass(frozen=True)
class _Seen:
    """What a bulk check compares of a job, copied (a live record changes under the command)."""

    status: str
    queue: str
    task: str
    schedule: str | None
    children: tuple[int, ...]

    @staticmethod
    def of(record: Any) -> _Seen:
        job = readable(record)
        return _Seen(job.status, job.queue, job.task, job.schedule, tuple(job.children or ()))


def _check_rate(queue: str, rate_and_rule: Any, times: list[int]) -> None:
    """Claims in every window [times[i], now]: at most max when shorter than per_ms (the
    exact window), within the bucket's bound (its burst plus the refill) for a bucket."""
    rate, rule = rate_and_rule
    now_ms = times[-1]
    for index, start_ms in enumerate(times):
        count = len(times) - index
        if rule == "window":
            if now_ms - start_ms < rate.per_ms:
                assert count <= rate.max, (
                    f"queue {queue}: {count} starts within {now_ms - start_ms} ms "
                    f"({rate.max} per {rate.per_ms} ms)")
            continue
        burst = rate.max if rate.burst is None else rate.burst
        bound = burst + (now_ms - start_ms) * rate.max // rate.per_ms
        assert count <= bound, f"queue {queue}: {count} claims in [{start_ms}, {now_ms}]"


def _check_rate_keys(state: Any) -> None:
    """From the records: a rate key's attempts never start more than its max in any window
    of its per_ms (every attempt of every job of the key, finished ones included)."""
    starts: dict[str, list[int]] = {}
    for record in state.table:
        job = readable(record)
        if job.rate is not None:
            starts.setdefault(job.rate.key, []).extend(a.start_ms for a in job.history)
    for key, times in starts.items():
        limit, per_ms = RATE_KEYS[key]
        times.sort()
        for first, start_ms in enumerate(times):
            if first + limit < len(times):
                assert times[first + limit] - start_ms >= per_ms, (
                    f"rate key {key}: {limit + 1} starts within {per_ms} ms: {times}")


def _changed(before: Any, after: Any) -> bool:
    return after is None or after.status != before.status


def _descendants(jobs: dict[int, Any], roots: list[int]) -> set[int]:
    found: set[int] = set()
    stack = list(roots)
    while stack:
        job = jobs.get(stack.pop())
        for child in job.children if job is not None else ():
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _same_schedule(jobs: dict[int, Any], chosen: list[int]) -> set[int]:
    """A schedule's finished jobs may be dropped by its `retain` when one of its jobs ends."""
    schedules = {jobs[job_id].schedule for job_id in chosen} - {None}
    return {job_id for job_id, job in jobs.items() if job.schedule in schedules}


def evictions(state: Any) -> int:
    """Finished jobs evicted so far, by any reason (scheduler/retention.py)."""
    return sum(state.counters.get("evicted", {}).values())


class ExpectedSubmit:
    """What a submit with `unique`/`debounce_ms` must do, from the rules and the state before."""

    def __init__(self, state: Any, spec: JobSpec) -> None:
        self.spec = spec
        self.now_ms = state.now_ms
        entry = state.table.keys.get(spec.key)
        holder = None if entry is None else state.table.get(entry[0])
        self.holder = None if holder is None else readable(holder)
        new_id = state.next_job_id
        self.replaced = self.moved = False
        h = self.holder
        if (h is not None and spec.debounce_ms is not None and h.status == j.SCHEDULED
                and h.attempts == 0):
            self.moved = True
            self.answer: dict[str, Any] = {"jobs": [[h.id, False]], "debounced": [0]}
            return
        unique = spec.unique
        if (h is not None and unique is not None and h.status in unique.states
                and self.now_ms - h.created_ms < unique.period_ms):
            if unique.on_conflict == "ignore":
                self.answer = {"jobs": [[h.id, False]]}
                return
            self.replaced = True
            self.answer = {"jobs": [[new_id, True]], "replaced": [[0, h.id]]}
            return
        self.answer = {"jobs": [[new_id, True]]}

    def check(self, state: Any, *, evicted_now: bool = False) -> None:
        job_id = self.answer["jobs"][0][0]
        if evicted_now and (state.table.get(job_id) is None or (
                self.replaced and state.table.get(self.holder.id) is None)):
            return  # a finished job the command's settling evicted past the budget
        job = readable(state.table.get(job_id))
        assert state.table.keys[self.spec.key][0] == job_id, "the key holds another job"
        if self.moved:
            assert self.holder is not None and self.spec.debounce_ms is not None
            want_ms = self.now_ms + self.spec.debounce_ms
            if self.spec.debounce_max_ms is not None:
                want_ms = min(want_ms, self.holder.created_ms + self.spec.debounce_max_ms)
            assert job.run_at_ms == max(want_ms, self.now_ms)
            assert j.unpack(job.payload) == self.spec.payload
        if self.replaced:
            assert self.holder is not None
            old = state.table.get(self.holder.id)
            assert old.status == (self.holder.status if self.holder.final else j.CANCELLED)
