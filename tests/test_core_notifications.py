"""Notifications in the pure core: what goes into the outbox, how the cursor moves, what is
lost past the retention (and counted), and a hypothesis model of a deliverer whose leaders
crash: every event a notification wants reaches its receiver at least once or is counted lost,
and every repeat carries the same delivery id and the same bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftcron.scheduler import notifications as notes
from raftcron.scheduler.commands import BeginLeadership, ClaimJobs, FailJob, SubmitJobs
from raftcron.scheduler.driver import Driver, Refused
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.notifications import (
    AckNotification,
    DeleteNotification,
    NotificationSpec,
    PutNotification,
    delivery_body,
    delivery_id,
)
from raftcron.scheduler.snapshot import digest, restore, snapshot
from raftcron.scheduler.specs import JobSpec

T0 = 1_800_000_000_000
SECRET = "a-secret-of-16-chars"
URL = "https://hooks.example.com/raftcron?team=ops"


def put(d: Driver, name: str = "ops", events: tuple[str, ...] = ("dead_letter",),
        url: str = URL, secret: str = SECRET) -> dict[str, Any]:
    spec = NotificationSpec.parse({"url": url, "events": list(events), "secret": secret})
    return d.ok(PutNotification(d.request_id(), name, spec))


def dead_letter(d: Driver, **job: Any) -> int:
    job_id = d.submit(max_attempts=1, **job)
    [(claimed, token)] = d.claim(queues=(job.get("queue", "default"),))
    assert claimed == job_id
    d.fail(job_id, token, "boom " * 400)
    return job_id


def pending(d: Driver, name: str = "ops") -> list[list[Any]]:
    return d.state.notifications.pending(name, 0, 1_000)


def ack(d: Driver, name: str, seq: int) -> dict[str, Any]:
    revision = d.state.notifications.by_name[name].revision
    return d.ok(AckNotification(name, revision, seq))


def view(d: Driver, name: str = "ops") -> dict[str, Any]:
    found = notes.view(d.state.notifications, name, d.now_ms)
    assert found is not None
    return found


# -- the spec -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"url": "ftp://x.example.com/", "events": ["misfire"], "secret": SECRET},
         "url: 'ftp://x.example.com/' must be an http:// or https:// URL"),
        ({"url": "https://user:pw@x.example.com/", "events": ["misfire"], "secret": SECRET},
         "without credentials"),
        ({"url": "https://x.example.com/#frag", "events": ["misfire"], "secret": SECRET},
         "or a fragment"),
        ({"url": URL, "events": [], "secret": SECRET}, "events: must list at least one of"),
        ({"url": URL, "events": ["fired"], "secret": SECRET}, "events[0]: must be one of"),
        ({"url": URL, "events": ["misfire"], "secret": "short"}, "secret: must be 16-256"),
        ({"url": URL, "events": ["misfire"]}, "secret: must be a string"),
        ({"url": URL, "events": ["misfire"], "secret": SECRET, "headers": {}},
         "headers: unknown field"),
    ],
)
def test_a_bad_notification_is_refused_naming_the_field(body: Any, message: str) -> None:
    with pytest.raises(Invalid) as raised:
        NotificationSpec.parse(body)
    assert message in str(raised.value)


def test_a_view_never_shows_the_secret() -> None:
    d = Driver(now_ms=T0)
    assert put(d, events=("misfire", "dead_letter", "misfire"))["created"] is True
    shown = view(d)
    assert shown["events"] == ["dead_letter", "misfire"]  # distinct, sorted
    assert SECRET not in json.dumps(shown) and SECRET not in json.dumps(
        notes.view_all(d.state.notifications, d.now_ms))


# -- the outbox -----------------------------------------------------------------------------------


def test_a_dead_letter_is_recorded_with_what_the_job_was() -> None:
    d = Driver(now_ms=T0)
    put(d)
    job_id = dead_letter(d, task="charge", queue="billing", key="order-7")
    [entry] = pending(d)
    seq, event_seq, at_ms, kind, data = entry
    assert (seq, kind, at_ms) == (1, "dead_letter", d.now_ms)
    assert event_seq == d.state.events.last_seq  # the same event as GET /v1/events shows
    assert data["job"] == job_id and data["attempts"] == 1
    assert (data["task"], data["queue"], data["key"], data["schedule"]) == (
        "charge", "billing", "order-7", None)
    assert len(data["error"]) == notes.EVENT_ERROR_CHARS_MAX  # cut: the outbox stays bounded


def test_schedule_failed_is_a_dead_letter_of_a_fired_job_only() -> None:
    d = Driver(now_ms=T0)
    put(d, events=("schedule_failed",))
    dead_letter(d)  # not fired by a schedule: not told
    d.put_schedule("nightly", every="10s", job={"task": "report", "max_attempts": 1})
    d.tick(T0)
    d.tick(T0 + 10_000)
    [(job_id, token)] = d.claim()
    d.fail(job_id, token, "no disk")
    [entry] = pending(d)
    assert entry[3] == "schedule_failed"
    assert (entry[4]["schedule"], entry[4]["fire_time_ms"]) == ("nightly", T0 + 10_000)


def test_a_committed_leadership_and_a_misfire_are_events_too() -> None:
    d = Driver(now_ms=T0)
    put(d, events=("leader_changed", "misfire"))
    d.ok(BeginLeadership(T0 + 5, "n2", 7))
    d.put_schedule("s", every="1s", misfire_grace_ms=1_000)
    d.tick(T0)
    d.tick(T0 + 60_000)  # a minute late: misfired
    kinds = [(entry[3], entry[4]) for entry in pending(d)]
    assert kinds[0] == ("leader_changed", {"node": "n2", "term": 7, "leases_extended": 0})
    assert kinds[1][0] == "misfire" and kinds[1][1]["schedule"] == "s"


def test_a_new_notification_is_told_of_what_happens_after_it_was_put() -> None:
    d = Driver(now_ms=T0)
    put(d, "first")
    dead_letter(d)
    put(d, "second")
    dead_letter(d)
    assert [e[0] for e in pending(d, "first")] == [1, 2]
    assert [e[0] for e in pending(d, "second")] == [2]


def test_without_notifications_nothing_is_recorded_so_an_old_log_replays_the_same() -> None:
    d = Driver(now_ms=T0)
    dead_letter(d)
    d.ok(BeginLeadership(T0 + 5, "n2", 7))
    assert d.state.notifications.to_list() == [0, 0, [], []]


def two_notifications_three_events() -> Driver:
    """'a' wants dead letters (entries 1 and 3), 'b' those and the leader change (2)."""
    d = Driver(now_ms=T0)
    put(d, "a")
    put(d, "b", events=("dead_letter", "leader_changed"))
    dead_letter(d)
    d.ok(BeginLeadership(T0 + 5, "n2", 7))
    dead_letter(d)
    return d


def test_an_ack_moves_the_cursor_counts_and_frees_the_outbox() -> None:
    d = two_notifications_three_events()
    assert [e[0] for e in pending(d, "a")] == [1, 3]
    assert [e[0] for e in pending(d, "b")] == [1, 2, 3]
    assert ack(d, "a", 3) == {"cursor": 3, "delivered": 2}
    assert (view(d, "a")["pending"], view(d, "a")["delivered"]) == (0, 2)
    assert len(d.state.notifications.outbox) == 3  # b still waits for all three
    assert ack(d, "b", 2) == {"cursor": 2, "delivered": 2}
    assert [e[0] for e in d.state.notifications.outbox] == [3]
    assert ack(d, "b", 1) == {"cursor": 2, "delivered": 0}  # a late, smaller ack: no change
    assert ack(d, "b", 99) == {"cursor": 3, "delivered": 1}  # past the end: to the end
    assert not d.state.notifications.outbox


def test_an_ack_of_an_earlier_revision_is_ignored_so_the_new_url_gets_the_event() -> None:
    d = Driver(now_ms=T0)
    put(d)
    dead_letter(d)
    old_revision = d.state.notifications.by_name["ops"].revision
    assert put(d, url="https://other.example.com/")["created"] is False
    answer = d.ok(AckNotification("ops", old_revision, 1))
    assert "ignored" in answer and [e[0] for e in pending(d)] == [1]


def test_a_deleted_notification_frees_what_it_waited_for() -> None:
    d = Driver(now_ms=T0)
    put(d)
    dead_letter(d)
    d.ok(DeleteNotification(d.request_id(), "ops"))
    assert not d.state.notifications.outbox
    with pytest.raises(Refused) as refused:
        d.ok(DeleteNotification(d.request_id(), "ops"))
    assert refused.value.code == "not_found"


def test_past_the_retention_the_oldest_are_dropped_and_counted_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(notes, "OUTBOX_KEPT", 3)
    d = Driver(now_ms=T0)
    put(d, "down")
    put(d, "up")
    for _ in range(5):
        dead_letter(d)
        ack(d, "up", d.state.notifications.last_seq)
    assert [e[0] for e in pending(d, "down")] == [3, 4, 5]
    shown = view(d, "down")
    assert (shown["cursor"], shown["pending"], shown["lost"], shown["delivered"]) == (0, 3, 2, 0)
    assert (view(d, "up")["lost"], view(d, "up")["delivered"]) == (0, 5)
    ack(d, "down", 5)
    shown = view(d, "down")
    assert (shown["pending"], shown["lost"], shown["delivered"]) == (0, 2, 3)


def test_the_count_of_notifications_is_bounded() -> None:
    d = Driver(now_ms=T0)
    for index in range(notes.NOTIFICATIONS_MAX):
        put(d, f"n{index}")
    with pytest.raises(Refused) as refused:
        put(d, "one-more")
    assert refused.value.code == "conflict"
    put(d, "n0", url="https://x.example.com/")  # a replace is not one more


def test_notifications_survive_a_snapshot_byte_for_byte() -> None:
    d = two_notifications_three_events()
    ack(d, "a", 1)
    blob = snapshot(d.state)
    restored = restore(blob)
    assert snapshot(restored) == blob
    assert restored.notifications.by_name["b"].spec.secret == SECRET
    assert pending(Driver(restored), "b") == pending(d, "b")


def test_a_body_is_the_same_bytes_whoever_builds_it() -> None:
    entry = [7, 42, T0, "misfire", {"schedule": "s", "missed": 3}]
    body = delivery_body("ops", entry)
    assert json.loads(body) == {"delivery": "ops/7", "notification": "ops", "event": "misfire",
                                "seq": 7, "event_seq": 42, "time_ms": T0,
                                "data": {"schedule": "s", "missed": 3}}
    assert body == delivery_body("ops", [7, 42, T0, "misfire", {"missed": 3, "schedule": "s"}])
    assert delivery_id("ops", 7) == "ops/7"


# -- a model: a deliverer whose leaders crash ----------------------------------------------------

NAMES = ("a", "b")
KIND_SETS = (("dead_letter",), ("leader_changed",), ("dead_letter", "leader_changed"))


class DeliveryModel(RuleBasedStateMachine):
    """The replicated part under a deliverer as cluster/ops/notifier.py is: it reads what is
    pending after its own progress, posts in order, acks when it likes; a crash loses its
    progress, not the replicated cursor. Invariants after every step; at teardown everything
    is drained, and then each wanted event was received at least once or counted lost."""

    def __init__(self) -> None:
        super().__init__()
        self.kept = notes.OUTBOX_KEPT
        notes.OUTBOX_KEPT = 3  # small: the model reaches the retention
        self.d = Driver(now_ms=T0)
        self.replica = Driver(now_ms=T0)
        self.term = 1
        self.local: dict[str, int] = {}  # the deliverer's progress (not replicated)
        self.received: dict[str, dict[str, bytes]] = {}  # receiver: name -> id -> body
        self.expected: dict[str, list[int]] = {}  # seqs each notification wanted
        self.lost_before: dict[str, int] = {}

    def teardown(self) -> None:
        try:
            for name in list(self.d.state.notifications.by_name):
                self.deliver(name, 1_000, True)
            for name, found in self.d.state.notifications.by_name.items():
                assert found.pending == 0
                expected = self.expected[name]
                got = {int(i.split("/")[1]) for i in self.received.get(name, {})}
                assert found.delivered + found.lost == len(expected)
                assert len(set(expected) - got) <= found.lost
        finally:
            notes.OUTBOX_KEPT = self.kept

    def both(self, command: Any) -> None:
        first, second = self.d.apply(command), self.replica.apply(command)
        assert first == second

    def _record_new(self, before: int, kind: str) -> None:
        """Entries made since `before`, all of `kind` (some may be dropped already)."""
        for seq in range(before + 1, self.d.state.notifications.last_seq + 1):
            for name, found in self.d.state.notifications.by_name.items():
                if found.wants(kind):
                    self.expected[name].append(seq)

    @rule(name=st.sampled_from(NAMES), kinds=st.sampled_from(KIND_SETS))
    def put(self, name: str, kinds: tuple[str, ...]) -> None:
        existing = self.d.state.notifications.by_name.get(name)
        if existing is not None and existing.spec.events != kinds:
            return  # the model keeps a name's kinds; a change of kinds is a unit test's
        spec = NotificationSpec.parse({"url": URL, "events": list(kinds), "secret": SECRET})
        self.both(PutNotification(self.d.request_id(), name, spec))
        if existing is None:
            self.expected[name] = []
            self.received.pop(name, None)
        self.local.pop(name, None)  # a new revision: earlier progress is void

    @rule(name=st.sampled_from(NAMES))
    def delete(self, name: str) -> None:
        self.both(DeleteNotification(self.d.request_id(), name))
        self.expected.pop(name, None)
        self.local.pop(name, None)

    @rule(count=st.integers(1, 4))
    def jobs_fail_for_good(self, count: int) -> None:
        before = self.d.state.notifications.last_seq
        spec = JobSpec.parse({"task": "t", "max_attempts": 1})
        self.both(SubmitJobs(self.d.request_id(), (spec,) * count))
        claim = ClaimJobs(self.d.request_id(), "w1", ("default",), max=count)
        claimed = self.d.ok(claim)["jobs"]
        self.replica.ok(claim)
        for job_id, token in claimed:
            self.both(FailJob(self.d.request_id(), job_id, token, "boom", retryable=False))
        self._record_new(before, "dead_letter")

    @rule()
    def a_leader_begins(self) -> None:
        before = self.d.state.notifications.last_seq
        self.term += 1
        self.both(BeginLeadership(self.d.now_ms, "n1", self.term))
        self._record_new(before, "leader_changed")

    @precondition(lambda self: bool(self.d.state.notifications.by_name))
    @rule(data=st.data(), count=st.integers(1, 4), acked=st.booleans())
    def deliver(self, name: str | None = None, count: int = 1, acked: bool = True,
                data: Any = None) -> None:
        if name is None:
            name = data.draw(st.sampled_from(sorted(self.d.state.notifications.by_name)))
        found = self.d.state.notifications.by_name[name]
        progress = max(self.local.get(name, 0), found.cursor)
        for entry in self.d.state.notifications.pending(name, progress, count):
            body = delivery_body(name, entry)
            seen = self.received.setdefault(name, {})
            identity = delivery_id(name, entry[0])
            assert seen.setdefault(identity, body) == body  # a repeat: same id, same bytes
            self.local[name] = entry[0]
        if acked and name in self.local:
            self.both(AckNotification(name, found.revision, self.local[name]))

    @rule()
    def the_leader_crashes(self) -> None:
        self.local.clear()

    @rule()
    def restore_from_a_snapshot(self) -> None:
        restored = Driver(restore(snapshot(self.d.state)))
        restored._ids = self.d._ids  # request ids go on from where they were
        self.d = restored

    @invariant()
    def the_outbox_is_bounded_contiguous_and_counted(self) -> None:
        state = self.d.state.notifications
        seqs = [entry[0] for entry in state.outbox]
        assert len(seqs) <= notes.OUTBOX_KEPT
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True
        for found in state.by_name.values():
            assert found.pending == len(state.pending(found.name, 0, 10**6)) >= 0

    @invariant()
    def replicas_agree(self) -> None:
        assert digest(self.d.state) == digest(self.replica.state)


DeliveryModel.TestCase.settings = settings(max_examples=60, stateful_step_count=30,
                                           deadline=None)
test_delivery_model = DeliveryModel.TestCase
