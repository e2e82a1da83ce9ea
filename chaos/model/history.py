"""The rules a whole history keeps, and the events one applied command tells them.

Owns ``HistoryChecker``, fed one event at a time, and ``StepFacts`` / ``events_of``, which
read the events of one applied command from the state before and after it (a repeated request
id answered from the dedupe table tells nothing but the time). No I/O, no clock, no randomness:
tier 0 feeds it every command the model applies, tier 1 the replayed Raft log, and the tests
bad histories, to show that every rule can fail. The rules:

* A nominal fire time (``<schedule>@<fire_time_ms>``) creates at most one job over the whole
  run: retention may delete the job, never the fact.
* A schedule's job that is not a nominal fire (a manual trigger, at once or from the buffer)
  never takes a key an earlier job held; a trigger answers what it did: a job it created, or
  ``buffered`` with a manual fire really waiting behind the active run.
* A backfill reaching back as far as the job retention is refused; one within it is not
  refused for its age. Before the cluster is finalized (scheduler/gate.py) the retention is
  the 7-day constant; from then on fire keys are forgotten at each Tick as far as the longest
  retention setting reaches, never brought back by a longer one: the reach is the highest
  such cutoff (starting at the last 7-day one).
* Before the first Tick only Tick, BeginLeadership and Barrier are applied; everything else
  is refused ``not_ready``, and nothing is refused so after it.
* Fencing tokens handed out strictly increase; an accepted completion, failure or heartbeat
  carried the token the job held at that moment; a job completes successfully at most once;
  a job is claimed only once all its parents have succeeded; the state's clock never goes back.
* With ``ticker_rules`` (tier 1, whose log the product's ticker writes): no lease is granted
  between a new leader's BeginLeadership and its first Tick (cluster/clock/ticker.py proposes them
  as one log entry).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from raftcron.scheduler import jobs as j
from raftcron.scheduler import limits, requests
from raftcron.scheduler.commands import (
    BackfillSchedule,
    Barrier,
    BeginLeadership,
    ClaimJobs,
    Command,
    CompleteJob,
    FailJob,
    Heartbeat,
    Tick,
    TriggerSchedule,
    command_fingerprint,
)
from raftcron.scheduler.errors import Ok, Rejected, Result
from raftcron.scheduler.gate import Finalize, PutSettings
from raftcron.scheduler.state import SchedulerState

RETENTION_MS = limits.RETENTION_MS_DEFAULT
UNTIMED = (Tick, BeginLeadership, Barrier)  # the commands a state that never ticked applies
LEADER_CHANGE_WINDOW_MS = 1_000  # "right after a leader change", for the count of leases

# -- events and the checker -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fired:
    """A schedule's nominal fire time created a job (the first job of a workflow)."""

    schedule: str
    fire_time_ms: int
    job_id: int


@dataclass(frozen=True, slots=True)
class Triggered:
    """A schedule created a job that is not a nominal fire (a manual trigger, now or buffered)."""

    schedule: str
    key: str
    job_id: int


@dataclass(frozen=True, slots=True)
class Keyed:
    """A client's submit created a job holding an idempotency key."""

    key: str
    job_id: int


@dataclass(frozen=True, slots=True)
class TriggerAnswered:
    """A trigger was answered Ok: `created` if job_id is a job it made, `waiting` if a manual
    fire now waits behind the active run (buffer_one)."""

    schedule: str
    job_id: int | None
    buffered: bool
    created: bool
    waiting: bool


@dataclass(frozen=True, slots=True)
class Backfilled:
    """A backfill was applied at `now_ms`; `refused_for_age` if refused on its from_ms."""

    schedule: str
    from_ms: int
    now_ms: int
    accepted: bool
    refused_for_age: bool


@dataclass(frozen=True, slots=True)
class Applied:
    """A command was applied to a state whose clock had (or had not) started."""

    command: str
    clock_started: bool
    code: str | None  # the rejection's code, None when Ok


@dataclass(frozen=True, slots=True)
class Led:
    """A BeginLeadership took effect (not ignored as stale)."""

    node: str
    term: int


@dataclass(frozen=True, slots=True)
class Claimed:
    """A job was leased with a new fencing token; `parents` are its depends_on ids."""

    job_id: int
    token: int
    parents: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Accepted:
    """A token-carrying command was accepted; `held_*` is the job as it was just before."""

    job_id: int
    token: int
    held_token: int | None
    held_status: str
    kind: str  # "succeeded" | "failed" | "heartbeat"


@dataclass(frozen=True, slots=True)
class RetentionSet:
    """The retention settings took effect: `finalized_now` by the Finalize that opened the
    gate; `longest_age_ms`, how long fire keys are kept from then on."""

    longest_age_ms: int
    now_ms: int
    finalized_now: bool


@dataclass(frozen=True, slots=True)
class Clock:
    """The state's clock after a command; `ticked` if it was a Tick that took effect."""

    now_ms: int
    ticked: bool = False


Event = (
    Fired | Triggered | Keyed | TriggerAnswered | Backfilled | Applied | Led | Claimed | Accepted
    | RetentionSet | Clock
)


class HistoryChecker:
    """The model-level rules over one run; `problems` lists every broken one, in order."""

    def __init__(self, *, ticker_rules: bool = False) -> None:
        self.ticker_rules = ticker_rules
        self.fires: dict[str, int] = {}  # "<schedule>@<fire_time_ms>" -> job id
        self.job_keys: dict[str, int] = {}  # every key a job was created with -> latest job
        self.last_fire_ms: dict[str, int] = {}  # schedule -> newest nominal time fired
        self.token_max = 0
        self.succeeded: dict[int, int] = {}  # job id -> the token its completion carried
        self.out_of_order: dict[str, None] = {}  # schedules whose nominal times went back
        self.untimed_leader: Led | None = None  # a leader whose first Tick is still to come
        self.led_ms: int | None = None  # the state's time at the last new leader's first Tick
        self.leases_after_leader_change = 0  # granted within a second of it (what tier 1 did)
        self.now_ms = 0
        # Once finalized: how long fire keys are kept, and the highest cutoff used so far.
        self.keys_kept_ms: int | None = None
        self.keys_forgotten_ms = 0
        self.events = 0
        self.problems: list[str] = []

    def feed(self, event: Event) -> None:
        self.events += 1
        match event:
            case Fired():
                self._fired(event)
            case Triggered():
                self._triggered(event)
            case Keyed():
                self.job_keys[event.key] = event.job_id
            case TriggerAnswered():
                self._trigger_answered(event)
            case Backfilled():
                self._backfilled(event)
            case Applied():
                self._applied(event)
            case Led():
                self.untimed_leader = event
            case Claimed():
                self._claimed(event)
            case Accepted():
                self._accepted(event)
            case RetentionSet():
                if event.finalized_now:
                    self.keys_forgotten_ms = max(0, event.now_ms - RETENTION_MS)
                if event.finalized_now or self.keys_kept_ms is not None:
                    self.keys_kept_ms = event.longest_age_ms
            case Clock():
                if event.now_ms < self.now_ms:
                    self._problem(f"time went back from {self.now_ms} to {event.now_ms}")
                self.now_ms = max(self.now_ms, event.now_ms)
                if event.ticked and self.untimed_leader is not None:
                    self.untimed_leader, self.led_ms = None, event.now_ms
                if event.ticked and self.keys_kept_ms is not None:
                    self.keys_forgotten_ms = max(self.keys_forgotten_ms,
                                                 event.now_ms - self.keys_kept_ms)

    def feed_all(self, events: Iterable[Event]) -> HistoryChecker:
        for event in events:
            self.feed(event)
        return self

    def _fired(self, event: Fired) -> None:
        key = f"{event.schedule}@{event.fire_time_ms}"
        first = self.fires.get(key)
        if first is not None:
            self._problem(f"{key} fired twice: job {first}, then job {event.job_id}")
        else:
            self.fires[key] = event.job_id
        self.job_keys[key] = event.job_id
        last = self.last_fire_ms.get(event.schedule)
        if last is not None and event.fire_time_ms <= last:
            # Only a problem where nothing backfills (tier 1): the clock fires oldest first.
            self.out_of_order[event.schedule] = None
        self.last_fire_ms[event.schedule] = max(event.fire_time_ms, last or event.fire_time_ms)

    def _triggered(self, event: Triggered) -> None:
        earlier = self.job_keys.get(event.key)
        if earlier is not None:
            self._problem(f"a trigger of {event.schedule} created job {event.job_id} with key "
                          f"{event.key!r}, which job {earlier} held before")
        self.job_keys[event.key] = event.job_id

    def _trigger_answered(self, event: TriggerAnswered) -> None:
        if event.buffered and (event.job_id is not None or not event.waiting):
            self._problem(f"a trigger of {event.schedule} answered buffered (job "
                          f"{event.job_id}) and no manual fire waits")
        elif not event.buffered and not event.created:
            self._problem(f"a trigger of {event.schedule} answered job {event.job_id}, "
                          "buffered nothing and created no job")

    def backfill_reach_ms(self, now_ms: int) -> int:
        """A backfill must start after this: fire keys created at or before it may be gone."""
        return self.keys_forgotten_ms if self.keys_kept_ms is not None else now_ms - RETENTION_MS

    def _backfilled(self, event: Backfilled) -> None:
        oldest_ms = self.backfill_reach_ms(event.now_ms)
        # A fire key created at or before now - retention is forgotten: only later is safe.
        if event.accepted and event.from_ms <= oldest_ms:
            self._problem(f"a backfill of {event.schedule} from {event.from_ms} was accepted, "
                          f"older than the retention (after {oldest_ms} only)")
        if event.refused_for_age and event.from_ms > oldest_ms:
            self._problem(f"a backfill of {event.schedule} from {event.from_ms} was refused "
                          f"for its age, within the retention (after {oldest_ms})")

    def _applied(self, event: Applied) -> None:
        untimed = event.command in {kind.__name__ for kind in UNTIMED}
        if not event.clock_started and not untimed and event.code != "not_ready":
            self._problem(f"{event.command} was applied before the first Tick ({event.code})")
        if event.clock_started and event.code == "not_ready":
            self._problem(f"{event.command} was refused not_ready after the first Tick")

    def _claimed(self, event: Claimed) -> None:
        if event.token <= self.token_max:
            self._problem(
                f"job {event.job_id} claimed with token {event.token}, "
                f"not above the last token {self.token_max}"
            )
        self.token_max = max(self.token_max, event.token)
        pending = [parent for parent in event.parents if parent not in self.succeeded]
        if pending:
            self._problem(f"job {event.job_id} ran before its parents {pending} succeeded")
        if self.led_ms is not None and self.now_ms - self.led_ms <= LEADER_CHANGE_WINDOW_MS:
            self.leases_after_leader_change += 1
        if self.ticker_rules and self.untimed_leader is not None:
            led = self.untimed_leader
            self._problem(f"job {event.job_id} leased after {led.node} began term {led.term} "
                          "and before its first Tick: the lease counts from an old time")

    def _accepted(self, event: Accepted) -> None:
        if event.held_status != j.RUNNING or event.token != event.held_token:
            self._problem(
                f"job {event.job_id}: {event.kind} with token {event.token} accepted while the "
                f"job was {event.held_status} with token {event.held_token}"
            )
        if event.kind == "succeeded":
            first = self.succeeded.get(event.job_id)
            if first is not None:
                self._problem(
                    f"job {event.job_id} completed twice: tokens {first} and {event.token}"
                )
            self.succeeded[event.job_id] = event.token

    def _problem(self, text: str) -> None:
        self.problems.append(f"event {self.events}: {text}")


# -- from an applied command to events ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepFacts:
    """What `events_of` needs from the state *before* a command mutates it."""

    next_job_id: int
    now_ms: int
    held: dict[int, tuple[str, int | None]]  # job id -> (status, token) of the jobs it names
    # The first result's value as the dedupe table keeps it (a success's, or a refusal for
    # space: scheduler/requests.py `answer`), if the command is answered from the table.
    remembered: dict[str, Any] | None

    @staticmethod
    def capture(state: SchedulerState, command: Command) -> StepFacts:
        named: list[int] = []
        match command:
            case CompleteJob() | FailJob() | Heartbeat():
                named = [command.job_id]
            case ClaimJobs():
                named = [ack.job_id for ack in command.acks]
        held = {}
        for job_id in named:
            job = state.table.get(job_id)
            held[job_id] = ("missing", None) if job is None else (job.status, job.token)
        remembered = remembered_result(state, command)
        return StepFacts(state.next_job_id, state.now_ms, held, remembered)


def remembered_result(state: SchedulerState, command: Command) -> dict[str, Any] | None:
    """The stored first result when this command's request id will be answered from memory."""
    request_id = requests.dedupe_id(command, finalized=state.finalized)
    if request_id is None or state.now_ms == 0:
        return None
    seen = state.requests.get(request_id)
    if seen is None or seen[0] != command.TAG or seen[1] != command_fingerprint(command):
        return None
    value: dict[str, Any] = seen[2]
    return value


def events_of(
    facts: StepFacts, command: Command, result: Result, state: SchedulerState
) -> list[Event]:
    """The events one applied command produced, read from its result and the state after."""
    code = result.code if isinstance(result, Rejected) else None
    events: list[Event] = [Applied(type(command).__name__, facts.now_ms != 0, code)]
    if facts.remembered is None:
        events += _answer_events(facts, command, result, state)
        events += _created_events(facts, state)
    ticked = isinstance(command, Tick) and isinstance(result, Ok) and "ignored" not in result.value
    events.append(Clock(state.now_ms, ticked))
    return events


def _created_events(facts: StepFacts, state: SchedulerState) -> list[Event]:
    events: list[Event] = []
    for job_id in range(facts.next_job_id, state.next_job_id):
        job = state.table.get(job_id)
        if job is None or job.key is None:
            continue  # (a workflow's key is on its first job only)
        if job.schedule is None:
            events.append(Keyed(job.key, job.id))
        elif job.key == f"{job.schedule}@{job.fire_time_ms}":
            assert job.fire_time_ms is not None
            events.append(Fired(job.schedule, job.fire_time_ms, job.id))
        else:
            events.append(Triggered(job.schedule, job.key, job.id))
    return events


def _answer_events(
    facts: StepFacts, command: Command, result: Result, state: SchedulerState
) -> list[Event]:
    def accepted(job_id: int, token: int, kind: str) -> Accepted:
        status, held_token = facts.held.get(job_id, ("unknown", None))
        return Accepted(job_id, token, held_token, status, kind)

    if isinstance(command, BackfillSchedule):
        refused = isinstance(result, Rejected) and result.field == "from_ms"
        accepted_now = isinstance(result, Ok)
        return [Backfilled(command.name, command.from_ms, facts.now_ms, accepted_now, refused)]
    if not isinstance(result, Ok):
        return []
    events: list[Event] = []
    match command:
        case BeginLeadership() if "ignored" not in result.value:
            events.append(Led(command.node, command.term))
        case Finalize() if result.value["finalized_now"]:
            longest = command.settings.retention.longest_age_ms()
            events.append(RetentionSet(longest, state.now_ms, finalized_now=True))
        case PutSettings() if command.section == "retention":
            longest = state.settings.retention.longest_age_ms()
            events.append(RetentionSet(longest, state.now_ms, finalized_now=False))
        case TriggerSchedule():
            job_id, schedule = result.value["job_id"], state.schedules.get(command.name)
            created = job_id is not None and facts.next_job_id <= job_id < state.next_job_id
            waiting = schedule is not None and schedule.buffered == (state.now_ms, 1)
            buffered = bool(result.value["buffered"])
            events.append(TriggerAnswered(command.name, job_id, buffered, created, waiting))
        case CompleteJob():
            events.append(accepted(command.job_id, command.token, "succeeded"))
        case FailJob():
            events.append(accepted(command.job_id, command.token, "failed"))
        case Heartbeat():
            events.append(accepted(command.job_id, command.token, "heartbeat"))
        case ClaimJobs():
            outcomes = dict((job_id, code) for job_id, code in result.value["acks"])
            for ack in command.acks:
                if outcomes.get(ack.job_id) == "ok":
                    events.append(accepted(ack.job_id, ack.token, ack.outcome))
            for job_id, token in result.value["jobs"]:
                job = state.table.get(job_id)
                parents = () if job is None else job.depends_on
                events.append(Claimed(job_id, token, parents))
    return events
