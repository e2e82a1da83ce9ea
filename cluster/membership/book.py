"""The member book: who the members are and which change is in progress, replicated.

What it owns: the record every replica keeps of the cluster's members (node id, Raft address,
HTTP address) and of the ONE membership change in progress, changed only by the commands of
this module (`BeginMemberChange`, `CancelMemberChange`, `EndMemberChange`), applied in log
order like the core's commands. It is pure (no I/O, clock,
threads or PySyncObj): the replica applies it, `driver` acts on it, the API reads it.

Why a record of our own beside PySyncObj's configuration: PySyncObj's voters are Raft
addresses only, it does not serialize changes (its guard is dead code) and it has no notion of
a change that is still catching up. The book makes "one change at a time" a decision of the
replicated log: the second `BeginMemberChange` while one is in progress is refused on every
replica alike (`membership_change_in_progress`, HTTP 409), whichever node took the request.
Who votes is still PySyncObj's configuration (a change takes effect when its entry is
appended, as Raft's single-server changes do); `driver` proposes that entry only for the
change this book holds, and ends the change once it is committed.

The book is empty until the first change: the config files' peers are the members then. The
first `BeginMemberChange` carries the members as the proposing node sees them, and the book
adopts them, so from then on it is complete and a restarted node reads its members from its
snapshot and log, never from a stale config file.

Wire: like the core's commands, msgpack ``[1, tag, {field: value}]``, with tags from 1001
(the core's stay below 1000). A release that does not know them answers "unknown tag" and
changes nothing, so they are proposed only when every member runs a release that does (the
upgrade rule of docs/operations/upgrade.md). Snapshot: ``to_wire``/``from_wire``, under the
key ``members`` of the storage's snapshot body; an older snapshot without it loads as an empty book.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import msgpack

from raftcron.cluster.config import ConfigError, address_value, node_id_value
from raftcron.scheduler import parse
from raftcron.scheduler.errors import Invalid, Ok, Rejected, Result

WIRE_VERSION = 1
ACTIONS = ("add", "remove")
OUTCOMES = ("done", "aborted")
HISTORY_MAX = 16  # ended changes kept, newest last: what a waiting request reads its outcome in
REASON_CHARS_MAX = 500
MEMBERS_MAX = 64

# code -> HTTP status, for the API (cluster/http/members.py)
STATUS_BY_CODE = {
    "membership_change_in_progress": 409,
    "member_exists": 409,
    "address_in_use": 409,
    "last_member": 409,
    "not_found": 404,
    "invalid": 400,
}


def _field(parser: Any, value: object, field: str) -> str:
    try:
        parsed: str = parser(value, field)
    except ConfigError as error:
        raise Invalid(field, str(error).removeprefix(f"{field}: ")) from None
    return parsed


@dataclass(frozen=True, slots=True, order=True)
class Member:
    node_id: str
    raft_address: str
    http_address: str

    def to_wire(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "raft_address": self.raft_address,
                "http_address": self.http_address}

    @classmethod
    def from_wire(cls, data: object, field: str = "member") -> Member:
        fields = parse.as_mapping(data, field)
        parse.reject_unknown(fields, frozenset({"node_id", "raft_address", "http_address"}),
                             field)
        return cls(_field(node_id_value, fields.get("node_id"), f"{field}.node_id"),
                   _field(address_value, fields.get("raft_address"), f"{field}.raft_address"),
                   _field(address_value, fields.get("http_address"), f"{field}.http_address"))


@dataclass(frozen=True, slots=True)
class Change:
    change_id: int
    action: str  # "add" or "remove"
    member: Member
    cancel_reason: str = ""  # set by CancelMemberChange: its entry may no longer be appended

    def to_wire(self) -> dict[str, Any]:
        return {"change_id": self.change_id, "action": self.action,
                "member": self.member.to_wire(), "cancel_reason": self.cancel_reason}


@dataclass(frozen=True, slots=True)
class Ended:
    change: Change
    outcome: str  # "done" or "aborted"
    reason: str

    def to_wire(self) -> dict[str, Any]:
        return {**self.change.to_wire(), "outcome": self.outcome, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class BeginMemberChange:
    """Start adding or removing one member; refused while another change is in progress.
    `members`: the members as the proposing node sees them, adopted by an empty book."""

    TAG: ClassVar[int] = 1001
    action: str
    member: Member
    members: tuple[Member, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"action": self.action, "member": self.member.to_wire(),
                "members": [member.to_wire() for member in self.members]}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> BeginMemberChange:
        parse.reject_unknown(data, frozenset({"action", "member", "members"}))
        raw = parse.array(data.get("members"), "members", items_max=MEMBERS_MAX)
        members = tuple(Member.from_wire(item, f"members[{i}]") for i, item in enumerate(raw))
        return cls(parse.choice(data.get("action"), "action", ACTIONS),
                   Member.from_wire(data.get("member")), members)


@dataclass(frozen=True, slots=True)
class EndMemberChange:
    """The change `change_id` is over: `done` (its configuration entry is committed) or
    `aborted` (it never took effect: a joining node that did not catch up, or was cancelled)."""

    TAG: ClassVar[int] = 1002
    change_id: int
    outcome: str
    reason: str = ""

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"change_id": self.change_id, "outcome": self.outcome}
        if self.reason:
            wire["reason"] = self.reason
        return wire

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> EndMemberChange:
        parse.reject_unknown(data, frozenset({"change_id", "outcome", "reason"}))
        reason = parse.optional_text(data.get("reason"), "reason", chars_max=REASON_CHARS_MAX)
        return cls(parse.integer(data.get("change_id"), "change_id", low=1),
                   parse.choice(data.get("outcome"), "outcome", OUTCOMES), reason or "")


@dataclass(frozen=True, slots=True)
class CancelMemberChange:
    """Stop the change `change_id` from taking effect: from this entry on no leader appends its
    configuration entry; the driver then ends it (`aborted`, or `done` if it was in force)."""

    TAG: ClassVar[int] = 1003
    change_id: int
    reason: str

    def to_wire(self) -> dict[str, Any]:
        return {"change_id": self.change_id, "reason": self.reason}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> CancelMemberChange:
        parse.reject_unknown(data, frozenset({"change_id", "reason"}))
        return cls(parse.integer(data.get("change_id"), "change_id", low=1),
                   parse.text(data.get("reason"), "reason", chars_max=REASON_CHARS_MAX))


MemberCommand = BeginMemberChange | EndMemberChange | CancelMemberChange
BY_TAG: dict[int, Any] = {cls.TAG: cls for cls in (
    BeginMemberChange, EndMemberChange, CancelMemberChange)}


def encode(command: MemberCommand) -> bytes:
    frame: bytes = msgpack.packb([WIRE_VERSION, command.TAG, command.to_wire()],
                                 use_bin_type=True)
    return frame


def decode(frame: bytes) -> MemberCommand | None:
    """The command a log frame holds, None if it is not one of ours (the core's, or garbage);
    Invalid if it is ours and its fields are wrong."""
    try:
        data: Any = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception:  # msgpack raises several unrelated types on garbage
        return None
    if not (isinstance(data, list) and len(data) == 3 and data[0] == WIRE_VERSION):
        return None
    tag, fields = data[1], data[2]
    cls = BY_TAG.get(tag) if isinstance(tag, int) and not isinstance(tag, bool) else None
    if cls is None:
        return None
    if not isinstance(fields, Mapping):
        raise Invalid("command", "fields must be a map")
    command: MemberCommand = cls.from_wire(fields)
    return command


@dataclass(frozen=True, slots=True)
class MemberBook:
    """Immutable: `apply` returns the next book with the result, so a reader on another thread
    holds a consistent book for as long as it likes."""

    members: tuple[Member, ...] = ()  # () until the first change: the configs' peers are
    change: Change | None = None
    next_change_id: int = 1
    history: tuple[Ended, ...] = ()

    @property
    def recorded(self) -> bool:
        return bool(self.members)

    def member(self, node_id: str) -> Member | None:
        return next((m for m in self.members if m.node_id == node_id), None)

    def ended(self, change_id: int) -> Ended | None:
        return next((e for e in self.history if e.change.change_id == change_id), None)

    def apply(self, command: MemberCommand) -> tuple[MemberBook, Result]:
        if isinstance(command, BeginMemberChange):
            return self._begin(command)
        if isinstance(command, CancelMemberChange):
            return self._cancel(command)
        return self._end(command)

    def _begin(self, command: BeginMemberChange) -> tuple[MemberBook, Result]:
        members = self.members or tuple(sorted(command.members))
        if not members:
            return self, Rejected("invalid", "the members are not known", "members")
        wanted = command.member
        if self.change is not None:
            same = (self.change.action, self.change.member) == (command.action, wanted)
            if same:  # a repeated request (a client retry): the change it started
                return self, Ok({"change": self.change.to_wire(), "repeated": True})
            return self, Rejected(
                "membership_change_in_progress",
                f"{self.change.action} of {self.change.member.node_id} is in progress "
                f"(change {self.change.change_id}); one change at a time")
        known = {m.node_id: m for m in members}
        if command.action == "add":
            if wanted.node_id in known:
                return self, Rejected("member_exists", f"{wanted.node_id} is a member already",
                                      "node_id")
            for field in ("raft_address", "http_address"):
                address = getattr(wanted, field)
                users = [m.node_id for m in members
                         if address in (m.raft_address, m.http_address)]
                if users:
                    return self, Rejected("address_in_use",
                                          f"{address} is {users[0]}'s already", field)
        else:
            found = known.get(wanted.node_id)
            if found is None:
                return self, Rejected("not_found", f"{wanted.node_id} is not a member",
                                      "node_id")
            if len(members) == 1:
                return self, Rejected("last_member", f"{wanted.node_id} is the last member")
            wanted = found  # the book's own record of it, whatever the request said
        change = Change(self.next_change_id, command.action, wanted)
        book = replace(self, members=members, change=change,
                       next_change_id=self.next_change_id + 1)
        return book, Ok({"change": change.to_wire(), "repeated": False})

    def _cancel(self, command: CancelMemberChange) -> tuple[MemberBook, Result]:
        change = self.change
        if change is None or change.change_id != command.change_id:
            return self, Rejected("not_found", f"change {command.change_id} is not in progress",
                                  "change_id")
        if change.cancel_reason:
            return self, Ok({"change": change.to_wire(), "repeated": True})
        change = replace(change, cancel_reason=command.reason)
        return replace(self, change=change), Ok({"change": change.to_wire(), "repeated": False})

    def _end(self, command: EndMemberChange) -> tuple[MemberBook, Result]:
        change = self.change
        if change is None or change.change_id != command.change_id:
            return self, Rejected("not_found", f"change {command.change_id} is not in progress",
                                  "change_id")
        members = self.members
        if command.outcome == "done":
            if change.action == "add":
                members = tuple(sorted((*members, change.member)))
            else:
                members = tuple(m for m in members if m.node_id != change.member.node_id)
        ended = Ended(change, command.outcome, command.reason)
        history = (*self.history, ended)[-HISTORY_MAX:]
        book = replace(self, members=members, change=None, history=history)
        return book, Ok({"ended": ended.to_wire()})

    # -- snapshot -------------------------------------------------------------------------

    def to_wire(self) -> list[Any]:
        return [
            [m.to_wire() for m in self.members],
            None if self.change is None else self.change.to_wire(),
            self.next_change_id,
            [e.to_wire() for e in self.history],
        ]

    @classmethod
    def from_wire(cls, data: object) -> MemberBook:
        """The book a snapshot holds (None: an older snapshot, an empty book); ValueError
        naming what is wrong."""
        if data is None:
            return cls()
        try:
            fields: Any = data
            members, change, next_change_id, history = fields
            return cls(
                tuple(Member.from_wire(m) for m in members),
                None if change is None else _change(change),
                parse.integer(next_change_id, "next_change_id", low=1),
                tuple(Ended(_change(e), parse.choice(e.get("outcome"), "outcome", OUTCOMES),
                            str(e.get("reason", ""))) for e in history),
            )
        except (Invalid, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"the member book does not decode: {error}") from None


def _change(data: Any) -> Change:
    return Change(parse.integer(data.get("change_id"), "change_id", low=1),
                  parse.choice(data.get("action"), "action", ACTIONS),
                  Member.from_wire(data.get("member")), str(data.get("cancel_reason", "")))
