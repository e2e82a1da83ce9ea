"""Notifications in the replicated state: who is told about what, and the outbox of events
still to tell them (DESIGN.md §8.5).

A notification (`PUT /v1/notifications/{name}` `{"url", "events", "secret"}`) asks for one
HTTP POST per event of the kinds it names. Only what is in the replicated state can be
delivered from a replicated cursor, so the events are the state's own (scheduler/events.py):
a dead letter, a misfire, a lease that expired, a fire skipped by the overlap policy, a
committed `BeginLeadership` (`leader_changed`: a leader that never committed its first entry
is no event), and `schedule_failed` (a dead letter of a job a schedule fired).

The outbox: when the state emits an event some notification wants, a copy goes to the outbox
with its own sequence number (`seq`, contiguous, never reused) and the fields a receiver needs
(a dead letter's task, queue, key and schedule are read from the job then: later it may be
gone). Each notification has a `cursor`: every outbox entry at or below it was delivered (the
receiver answered 2xx and the leader committed `AckNotification`) or lost. The leader's shell
(cluster/ops/notifier.py) reads what is pending, posts and acks; a new leader resumes at the
cursor, so every event is delivered at least once, twice when a leader posted but its ack did
not commit (same delivery id both times: `<name>/<seq>`).

Bounds: at most `NOTIFICATIONS_MAX` notifications; the outbox holds only entries some
notification still waits for, at most `OUTBOX_KEPT`. A receiver down so long that more pile
up loses the oldest: each is counted in `lost` on every notification that had not got it (its
cursor then lies behind the outbox: the gap is that count), never dropped silently. A new
notification starts at the outbox's end: it is told of events after it was put. A put of an
existing name keeps its cursor and takes a new `revision`: an ack of a delivery made under the
old url or secret is ignored, so that event is posted again, to the new one.

Must not: do I/O, read a clock, iterate a set, or change anything but notifications and the
outbox (events are recorded here only while a notification exists, so the log of a cluster
without notifications replays exactly as before this module).
"""

from __future__ import annotations

import itertools
import json
import re
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from raftcron.scheduler import events, limits, parse
from raftcron.scheduler.errors import Invalid, Ok, Rejected, Result
from raftcron.scheduler.frozen import FrozenJob, readable
from raftcron.scheduler.jobs import Job

DEAD_LETTER = "dead_letter"
SCHEDULE_FAILED = "schedule_failed"
KINDS = (DEAD_LETTER, SCHEDULE_FAILED, "misfire", "leader_changed", "lease_expired",
         "overlap_skipped")
_KINDS_OF_EVENT: dict[str, tuple[str, ...]] = {
    events.DEAD_LETTERED: (DEAD_LETTER, SCHEDULE_FAILED),
    events.MISFIRED: ("misfire",),
    events.LEADER_CHANGED: ("leader_changed",),
    events.LEASE_EXPIRED: ("lease_expired",),
    events.OVERLAP_SKIPPED: ("overlap_skipped",),
}
NOTIFICATIONS_MAX = 64
OUTBOX_KEPT = 10_000  # entries some notification still waits for
URL_CHARS_MAX = 2_048
SECRET_CHARS_MIN, SECRET_CHARS_MAX = 16, 256
EVENT_ERROR_CHARS_MAX = 1_000  # of a dead letter's error, in the outbox (10k entries bound it)
# http(s)://host[:port][/path][?query]: printable ASCII, no credentials ('@' is not a host's
# character), no fragment ('#' is left out of the path's: !-" and $-~).
_URL_RE = re.compile(r'https?://[A-Za-z0-9.\-\[\]:]+(/[!-"$-~]*)?')
_FIELDS = frozenset({"url", "events", "secret"})


@dataclass(frozen=True, slots=True)
class NotificationSpec:
    url: str
    events: tuple[str, ...]  # sorted, distinct
    secret: str

    @classmethod
    def parse(cls, data: object) -> NotificationSpec:
        data = parse.as_mapping(data, "notification")
        parse.reject_unknown(data, _FIELDS)
        url = parse.text(data.get("url"), "url", chars_max=URL_CHARS_MAX)
        if not _URL_RE.fullmatch(url):
            raise Invalid("url", f"{url!r} must be an http:// or https:// URL with a host, "
                          "without credentials or a fragment")
        kinds = parse.array(data.get("events"), "events", items_max=len(KINDS))
        if not kinds:
            raise Invalid("events", f"must list at least one of {', '.join(KINDS)}")
        chosen = {parse.choice(kind, f"events[{i}]", KINDS) for i, kind in enumerate(kinds)}
        secret = parse.text(data.get("secret"), "secret", chars_max=SECRET_CHARS_MAX)
        if len(secret) < SECRET_CHARS_MIN or not secret.isprintable():
            raise Invalid("secret", f"must be {SECRET_CHARS_MIN}-{SECRET_CHARS_MAX} printable "
                          "characters (it signs every delivery)")
        return cls(url, tuple(sorted(chosen)), secret)

    def to_wire(self) -> dict[str, Any]:
        return {"url": self.url, "events": list(self.events), "secret": self.secret}


def notification_name(value: object) -> str:
    return parse.name(value, "name", chars_max=limits.NAME_CHARS_MAX)


# -- commands (registered in scheduler/commands.py; tags 40-42) -------------------------------


@dataclass(frozen=True, slots=True)
class PutNotification:
    TAG: ClassVar[int] = 40
    request_id: str | None
    name: str
    spec: NotificationSpec

    def to_wire(self) -> dict[str, Any]:
        wire = {"name": self.name, "spec": self.spec.to_wire()}
        return wire if self.request_id is None else {"request_id": self.request_id, **wire}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PutNotification:
        try:
            spec = NotificationSpec.parse(data.get("spec"))
        except Invalid as error:
            raise error.within("spec") from None
        return cls(_request_id(data), notification_name(data.get("name")), spec)


@dataclass(frozen=True, slots=True)
class DeleteNotification:
    TAG: ClassVar[int] = 41
    request_id: str | None
    name: str

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"name": self.name}
        return wire if self.request_id is None else {"request_id": self.request_id, **wire}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> DeleteNotification:
        return cls(_request_id(data), notification_name(data.get("name")))


@dataclass(frozen=True, slots=True)
class AckNotification:
    """The leader's word that the receiver answered 2xx for every entry up to `seq` it wants.

    No request_id: applying it twice is the same as once (the cursor only moves forward)."""

    TAG: ClassVar[int] = 42
    name: str
    revision: int
    seq: int

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "revision": self.revision, "seq": self.seq}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> AckNotification:
        return cls(
            notification_name(data.get("name")),
            parse.integer(data.get("revision"), "revision", low=1),
            parse.integer(data.get("seq"), "seq", low=0),
        )


def _request_id(data: Mapping[str, Any]) -> str | None:
    return parse.optional_text(data.get("request_id"), "request_id", chars_max=limits.KEY_CHARS_MAX)


NotificationCommand = PutNotification | DeleteNotification | AckNotification

# -- the replicated records --------------------------------------------------------------------


class Notification:
    __slots__ = ("created_ms", "cursor", "delivered", "lost", "name", "pending", "revision",
                 "spec", "updated_ms")

    def __init__(self, name: str, spec: NotificationSpec, revision: int, now_ms: int) -> None:
        self.name = name
        self.spec = spec
        self.revision = revision
        self.created_ms = self.updated_ms = now_ms
        self.cursor = 0  # every outbox entry at or below it was delivered or lost
        self.pending = 0  # wanted entries above the cursor, still in the outbox
        self.delivered = 0
        self.lost = 0

    def wants(self, kind: str) -> bool:
        return kind in self.spec.events

    def to_list(self) -> list[Any]:
        return [self.name, *self.spec.to_wire().values(), self.revision, self.created_ms,
                self.updated_ms, self.cursor, self.pending, self.delivered, self.lost]

    @classmethod
    def from_list(cls, item: list[Any]) -> Notification:
        (name, url, kinds, secret, revision, created_ms, updated_ms, cursor, pending, delivered,
         lost) = item
        notification = cls(name, NotificationSpec(url, tuple(kinds), secret), revision, 0)
        notification.created_ms, notification.updated_ms = created_ms, updated_ms
        notification.cursor, notification.pending = cursor, pending
        notification.delivered, notification.lost = delivered, lost
        return notification


Entry = list[Any]  # [seq, event_seq, at_ms, kind, fields]
JobLookup = Callable[[int], "Job | FrozenJob | None"]


class Notifications:
    def __init__(self) -> None:
        self.by_name: dict[str, Notification] = {}
        self.outbox: deque[Entry] = deque()  # seqs contiguous: popped only from the left
        self.last_seq = 0
        self.last_revision = 0

    # -- recording ------------------------------------------------------------------------

    def on_event(
        self, event_seq: int, at_ms: int, kind: str, fields: dict[str, Any], job_of: JobLookup
    ) -> None:
        """An event the state just emitted: into the outbox for each kind someone wants."""
        for notify_kind in _KINDS_OF_EVENT.get(kind, ()):
            if not any(n.wants(notify_kind) for n in self.by_name.values()):
                continue
            data = _event_data(kind, fields, job_of)
            if notify_kind == SCHEDULE_FAILED and data.get("schedule") is None:
                continue
            self._record([self.last_seq + 1, event_seq, at_ms, notify_kind, data])

    def _record(self, entry: Entry) -> None:
        self.last_seq = entry[0]
        self.outbox.append(entry)
        for notification in self.by_name.values():
            if notification.wants(entry[3]):
                notification.pending += 1
        if len(self.outbox) > OUTBOX_KEPT:
            seq, _, _, kind, _ = self.outbox.popleft()
            for notification in self.by_name.values():
                if notification.cursor < seq and notification.wants(kind):
                    notification.pending -= 1
                    notification.lost += 1

    # -- commands ---------------------------------------------------------------------------

    def apply(self, command: NotificationCommand, now_ms: int) -> Result:
        match command:
            case PutNotification():
                return self._put(command, now_ms)
            case DeleteNotification():
                if self.by_name.pop(command.name, None) is None:
                    return Rejected("not_found", f"no notification {command.name!r}", "name")
                self._prune()
                return Ok({"name": command.name, "deleted": True})
            case AckNotification():
                return self._ack(command)

    def _put(self, command: PutNotification, now_ms: int) -> Result:
        existing = self.by_name.get(command.name)
        if existing is None and len(self.by_name) >= NOTIFICATIONS_MAX:
            return Rejected("conflict", f"at most {NOTIFICATIONS_MAX} notifications exist; "
                            "delete one first", "name")
        self.last_revision += 1
        if existing is None:
            notification = Notification(command.name, command.spec, self.last_revision, now_ms)
            notification.cursor = self.last_seq  # told of what happens from now on
            self.by_name[command.name] = notification
        else:
            notification = existing
            notification.spec, notification.revision = command.spec, self.last_revision
            notification.updated_ms = now_ms
            notification.pending = sum(1 for _ in self._after(notification, notification.cursor))
        self._prune()
        return Ok({"name": command.name, "created": existing is None,
                   "revision": notification.revision})

    def _ack(self, command: AckNotification) -> Result:
        notification = self.by_name.get(command.name)
        if notification is None or notification.revision != command.revision:
            return Ok({"ignored": "the notification was changed or deleted since"})
        seq = min(command.seq, self.last_seq)
        delivered = 0
        for entry in self._after(notification, notification.cursor):
            if entry[0] > seq:
                break
            delivered += 1
        notification.cursor = max(notification.cursor, seq)
        notification.delivered += delivered
        notification.pending -= delivered
        self._prune()
        return Ok({"cursor": notification.cursor, "delivered": delivered})

    def _prune(self) -> None:
        """Drop entries at the head that no notification waits for any more."""
        notifications = list(self.by_name.values())
        while self.outbox:
            seq, _, _, kind, _ = self.outbox[0]
            if any(n.cursor < seq and n.wants(kind) for n in notifications):
                return
            self.outbox.popleft()

    # -- reading ----------------------------------------------------------------------------

    def _after(self, notification: Notification, cursor: int) -> Iterator[Entry]:
        """The entries `notification` wants with seq > cursor, oldest first."""
        if not self.outbox:
            return
        start = max(0, cursor + 1 - self.outbox[0][0])
        # islice, not indexing: a deque's item in the middle costs O(n) to reach.
        for entry in itertools.islice(self.outbox, start, None):
            if notification.wants(entry[3]):
                yield entry

    def pending(self, name: str, after_seq: int, limit: int) -> list[Entry]:
        """What `name` waits for after max(its cursor, after_seq), oldest first, <= limit."""
        notification = self.by_name.get(name)
        if notification is None:
            return []
        found: list[Entry] = []
        for entry in self._after(notification, max(notification.cursor, after_seq)):
            found.append(entry)
            if len(found) >= limit:
                break
        return found

    def oldest_pending_ms(self, notification: Notification) -> int | None:
        return next((entry[2] for entry in self._after(notification, notification.cursor)), None)

    # -- snapshot ---------------------------------------------------------------------------

    @property
    def in_use(self) -> bool:
        """Whether this differs from a state that never had a notification (a snapshot then
        leaves it out, and stays readable by the release before)."""
        return bool(self.by_name or self.outbox or self.last_seq or self.last_revision)

    def to_list(self) -> list[Any]:
        return [self.last_seq, self.last_revision,
                [n.to_list() for n in self.by_name.values()], list(self.outbox)]

    @classmethod
    def from_list(cls, data: list[Any]) -> Notifications:
        notifications = cls()
        notifications.last_seq, notifications.last_revision, items, outbox = data
        for item in items:
            notification = Notification.from_list(item)
            notifications.by_name[notification.name] = notification
        notifications.outbox.extend(outbox)
        return notifications


def _event_data(kind: str, fields: dict[str, Any], job_of: JobLookup) -> dict[str, Any]:
    """What a receiver is told: the event's fields, and for a job's event what the job was."""
    data = dict(fields)
    if kind in (events.DEAD_LETTERED, events.LEASE_EXPIRED) and isinstance(data.get("job"), int):
        found = job_of(data["job"])
        if found is not None:
            job = readable(found)
            data.update(task=job.task, queue=job.queue, key=job.key, schedule=job.schedule,
                        fire_time_ms=job.fire_time_ms)
    if isinstance(data.get("error"), str):
        data["error"] = data["error"][:EVENT_ERROR_CHARS_MAX]
    return data


# -- views (pure queries the shell runs through StateMachine.read) ------------------------------


def view(notifications: Notifications, name: str, now_ms: int) -> dict[str, Any] | None:
    """One notification as the API shows it: never its secret."""
    found = notifications.by_name.get(name)
    if found is None:
        return None
    oldest_ms = notifications.oldest_pending_ms(found)
    return {
        "name": found.name,
        "url": found.spec.url,
        "events": list(found.spec.events),
        "revision": found.revision,
        "created_ms": found.created_ms,
        "updated_ms": found.updated_ms,
        "cursor": found.cursor,
        "pending": found.pending,
        "oldest_pending_ms": oldest_ms,
        "lag_ms": 0 if oldest_ms is None else max(0, now_ms - oldest_ms),
        "delivered": found.delivered,
        "lost": found.lost,
    }


def view_all(notifications: Notifications, now_ms: int) -> list[dict[str, Any]]:
    found = (view(notifications, name, now_ms) for name in sorted(notifications.by_name))
    return [item for item in found if item is not None]


@dataclass(frozen=True, slots=True)
class Target:
    """What the deliverer needs of one notification (the secret included: shell only)."""

    name: str
    revision: int
    url: str
    secret: str
    cursor: int


def targets(notifications: Notifications) -> tuple[int, list[Target]]:
    """The outbox's last seq and every notification to deliver to, by name."""
    return notifications.last_seq, [
        Target(n.name, n.revision, n.spec.url, n.spec.secret, n.cursor)
        for _, n in sorted(notifications.by_name.items())
    ]


def delivery_body(name: str, entry: Entry) -> bytes:
    """The POST body of one entry to one notification: the same bytes whichever leader posts
    it (keys sorted, no spaces), so its signature is the same too."""
    seq, event_seq, at_ms, kind, data = entry
    body = {"delivery": delivery_id(name, seq), "notification": name, "event": kind,
            "seq": seq, "event_seq": event_seq, "time_ms": at_ms, "data": data}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def delivery_id(name: str, seq: int) -> str:
    """The id a receiver deduplicates by: the same for every post of one entry to one
    notification, whichever leader posts it ('/' is never in a name)."""
    return f"{name}/{seq}"
