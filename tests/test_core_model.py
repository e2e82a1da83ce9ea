"""A hypothesis state machine over every command of the core.

Each step applies one command (through the codec) to the state under test and to a replica.
After every step: the invariants hold, the replica's snapshot is byte-identical, a rejected
command changed nothing, tokens only grow, and no schedule time has more than one job. Some
steps replace the state under test by `restore(snapshot(state))`: the replica never stops, so
equal snapshots afterwards prove that restoring mid-run equals never stopping. The rules and
checks of flow control (queue limits, concurrency keys, unique, debounce, bulk actions) come
from tests/flow_model.py, those of bounded state (the upgrade gate, retention settings, the
state budget) from tests/bounded_model.py; their checks run after every command.
"""

from bounded_model import BoundedRules, left_by_rejection
from flow_model import FlowRules
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftcron.scheduler import codec, limits
from raftcron.scheduler.commands import (
    Ack,
    BackfillSchedule,
    BeginLeadership,
    CancelJob,
    ClaimJobs,
    CompleteJob,
    DeleteSchedule,
    FailJob,
    Heartbeat,
    PauseSchedule,
    PutSchedule,
    ResumeSchedule,
    RetryJob,
    SubmitJobs,
    SubmitWorkflow,
    Tick,
    TriggerSchedule,
    command_fingerprint,
)
from raftcron.scheduler.errors import Ok
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.requests import remembered
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.snapshot import restore, snapshot
from raftcron.scheduler.specs import JobSpec, WorkflowSpec
from raftcron.scheduler.state import SchedulerState

T0 = 1_800_000_000_000
QUEUES = ("default", "emails")
WORKERS = ("w1", "w2", "w3")
SCHEDULE_NAMES = ("s1", "s2")

job_specs = st.builds(
    lambda priority, queue, key, delay, attempts: JobSpec.parse(
        {
            "task": "t",
            "priority": priority,
            "queue": queue,
            "key": key,
            "delay_ms": delay,
            "max_attempts": attempts,
            "backoff": {"initial_ms": 500, "jitter": 0.5},
        }
    ),
    st.integers(-2, 2),
    st.sampled_from(QUEUES),
    st.one_of(st.none(), st.sampled_from(["k1", "k2", "k3"])),
    st.one_of(st.none(), st.sampled_from([0, 500, 5_000])),
    st.integers(1, 3),
)
schedule_specs = st.builds(
    lambda timing, misfire, overlap, jitter, workflow: ScheduleSpec.parse(
        {
            **timing,
            "misfire": misfire,
            "overlap": overlap,
            "jitter_ms": jitter,
            "max_catchup": 3,
            "misfire_grace_ms": 2_000,
            **(
                {
                    "workflow": {
                        "jobs": [
                            {"name": "a", "task": "t"},
                            {"name": "b", "task": "t", "after": ["a"]},
                        ]
                    }
                }
                if workflow
                else {"job": {"task": "t", "queue": "default"}}
            ),
        }
    ),
    st.sampled_from(
        [{"every": "1s"}, {"every": "3s"}, {"cron": "*/2 * * * * *"}, {"cron": "* * * * *"}]
    ),
    st.sampled_from(["fire_once", "fire_all", "skip"]),
    st.sampled_from(["allow", "forbid", "replace", "buffer_one"]),
    st.sampled_from([0, 700]),
    st.booleans(),
)
# Mostly the current token; sometimes an older one (a stale worker) or a newer one (forged).
tokens_skew = st.sampled_from([0, 0, 0, -1, -2, 1, 5])
advances = st.one_of(st.integers(0, 3_000), st.sampled_from([30_000, 3_600_000, 4 * 3_600_000]))


class CoreModel(BoundedRules, FlowRules, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = SchedulerState()
        self.replica = SchedulerState()
        self.requests = 0
        self.sent: list[tuple[object, object]] = []  # (command, result) with a request id
        self.apply(Tick(T0))

    # -- plumbing ---------------------------------------------------------------------------

    def rid(self) -> str:
        self.requests += 1
        return f"r{self.requests}"

    def apply(self, command):
        data, own_fingerprint = codec.encode_request(command)
        before = snapshot(self.state)
        fence = self.state.fence
        finals = {job.id: job.final for job in self.state.table}
        # One replica as a node that decodes the entry applies it (fingerprint from the
        # decoded fields), the other as the node that proposed it (cluster/consensus/replica.py
        # `expect`): the command as built and the fingerprint from its encoding. The same
        # either way, and both equal to the fingerprint built again from the command.
        decoded, fingerprint = codec.decode_request(data)
        assert decoded == command, f"{command} decodes as {decoded}"
        assert fingerprint == own_fingerprint
        if fingerprint is not None:
            assert fingerprint == command_fingerprint(command)
        result = self.state.apply(decoded, fingerprint)
        replica_result = self.replica.apply(command, own_fingerprint)
        assert result == replica_result
        if not isinstance(result, Ok):
            assert snapshot(self.state) == left_by_rejection(
                self.state, before, command, result), f"rejected {command} changed the state"
        assert self.state.fence >= fence
        if getattr(command, "request_id", None) is not None:
            self.sent.append((command, result, self.state.now_ms))
        self.check_flow(command, result, fence)
        self.check_bounded(command, result, finals)
        return result

    def jobs_in(self, *statuses):
        return sorted(job.id for job in self.state.table if job.status in statuses)

    # -- rules ------------------------------------------------------------------------------

    @rule(specs=st.lists(job_specs, min_size=1, max_size=4))
    def submit(self, specs):
        self.apply(SubmitJobs(self.rid(), tuple(specs)))

    @rule(parent_index=st.integers(0, 50))
    def submit_dependent(self, parent_index):
        ids = sorted(job.id for job in self.state.table)
        if ids:
            parent = ids[parent_index % len(ids)]
            self.apply(SubmitJobs(self.rid(), (JobSpec(task="child", depends_on=(parent,)),)))

    @rule(chain=st.booleans())
    def submit_workflow(self, chain):
        jobs = [{"name": "a", "task": "t"}, {"name": "b", "task": "t", "after": ["a"]}]
        jobs.append({"name": "c", "task": "t", "after": ["b"] if chain else ["a"]})
        jobs.append({"name": "d", "task": "t", "after": ["b", "c"]})
        self.apply(SubmitWorkflow(self.rid(), WorkflowSpec.parse({"jobs": jobs})))

    @rule(
        worker=st.sampled_from(WORKERS),
        count=st.integers(0, 3),
        lease=st.sampled_from([1_000, 5_000]),
        queues=st.sampled_from([("default",), ("emails", "default")]),
        ack=st.booleans(),
    )
    def claim(self, worker, count, lease, queues, ack):
        acks = ()
        running = self.jobs_in("running")
        if ack and running:
            job = self.state.table.jobs[running[0]]
            acks = (Ack(job.id, job.token, "succeeded"),)
        self.apply(ClaimJobs(self.rid(), worker, queues, count, lease, acks))

    def fenced(self, command, job, token):
        """Apply a token-carrying command; only the current token of a running job may pass."""
        holds = job.status == "running" and token == job.token
        result = self.apply(command)
        assert isinstance(result, Ok) == holds, f"{command} with job token {job.token}: {result}"

    @rule(index=st.integers(0, 50), skew=tokens_skew)
    def heartbeat(self, index, skew):
        ids = self.jobs_in("running", "cancelled", "queued")
        if ids:
            job = self.state.table.jobs[ids[index % len(ids)]]
            token = max(1, (job.token or 1) + skew)
            self.fenced(Heartbeat(self.rid(), job.id, token, None), job, token)

    @rule(
        index=st.integers(0, 50), skew=tokens_skew, outcome=st.sampled_from(["ok", "retry", "dead"])
    )
    def finish(self, index, skew, outcome):
        ids = self.jobs_in("running", "cancelled", "succeeded", "scheduled")
        if not ids:
            return
        job = self.state.table.jobs[ids[index % len(ids)]]
        token = max(1, (job.token or 1) + skew)
        if outcome == "ok":
            self.fenced(CompleteJob(self.rid(), job.id, token, {"by": "model"}), job, token)
        else:
            self.fenced(FailJob(self.rid(), job.id, token, "boom", outcome == "retry"), job, token)

    @rule(index=st.integers(0, 50))
    def cancel(self, index):
        ids = sorted(job.id for job in self.state.table)
        if ids:
            self.apply(CancelJob(self.rid(), ids[index % len(ids)], None))

    @rule(index=st.integers(0, 50))
    def retry(self, index):
        ids = sorted(job.id for job in self.state.table)
        if ids:
            self.apply(RetryJob(self.rid(), ids[index % len(ids)]))

    @rule(advance=advances, leader=st.sampled_from([None, None, "n0", "n1", "n2"]))
    def tick(self, advance, leader):
        self.apply(Tick(self.state.now_ms + advance, leader))

    @rule(back=st.integers(1, 60_000))
    def tick_backwards(self, back):
        self.apply(Tick(self.state.now_ms - back))

    @rule(skew=st.integers(-30_000, 30_000), term=st.integers(1, 100))
    def leader_change(self, skew, term):
        self.apply(BeginLeadership(self.state.now_ms + skew, f"n{term % 3}", term))

    @rule(name=st.sampled_from(SCHEDULE_NAMES), spec=schedule_specs)
    def put_schedule(self, name, spec):
        self.apply(PutSchedule(self.rid(), name, spec))

    @rule(
        name=st.sampled_from(SCHEDULE_NAMES), action=st.sampled_from(["pause", "resume", "delete"])
    )
    def control_schedule(self, name, action):
        command = {"pause": PauseSchedule, "resume": ResumeSchedule, "delete": DeleteSchedule}[
            action
        ]
        self.apply(command(self.rid(), name))

    @rule(name=st.sampled_from(SCHEDULE_NAMES), force=st.booleans())
    def trigger(self, name, force):
        self.apply(TriggerSchedule(self.rid(), name, force))

    @rule(name=st.sampled_from(SCHEDULE_NAMES), back_ms=st.integers(1_000, 20_000))
    def backfill(self, name, back_ms):
        now = self.state.now_ms
        self.apply(BackfillSchedule(self.rid(), name, now - back_ms, now))

    @precondition(lambda self: self.sent)
    @rule(index=st.integers(0, 1_000))
    def repeat_a_request(self, index):
        command, first, sent_ms = self.sent[index % len(self.sent)]
        again = self.apply(command)
        if not remembered(first) or \
                self.state.now_ms - sent_ms >= limits.REQUEST_WINDOW_MS:
            return
        if isinstance(first, Ok):
            assert again == first, "a repeated request id must get its first result"
        else:  # refused for space: the table keeps the answer's code and message
            assert (again.code, again.message) == (first.code, first.message), (
                f"a request refused for space was answered {again} when it came again")

    @rule()
    def snapshot_and_restore(self):
        self.state = restore(snapshot(self.state))

    # -- checks after every step ------------------------------------------------------------

    @invariant()
    def invariants_hold(self):
        assert violations(self.state) == []

    @invariant()
    def the_replica_is_identical(self):
        assert snapshot(self.state) == snapshot(self.replica)

    @invariant()
    def no_schedule_time_has_two_jobs(self):
        seen = set()
        for job in self.state.table:
            if job.schedule is not None and job.workflow_node in (None, "a"):
                fire = (job.key,)
                assert fire not in seen, f"{job.key} fired twice"
                seen.add(fire)


# At least 300 examples of up to 80 steps (about 55 applied commands each on average).
CoreModel.TestCase.settings = settings(
    max_examples=max(300, settings.default.max_examples), stateful_step_count=80, deadline=None
)
test_core_model = CoreModel.TestCase
