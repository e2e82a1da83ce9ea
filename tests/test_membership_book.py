"""The member book (cluster/membership/book.py): one change at a time, decided by the log.

Tables for the rules, a hypothesis property that two replicas fed the same commands hold the
same book (and that it survives its snapshot), and the wire round trip.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftcron.cluster.config import ConfigError, parse
from raftcron.cluster.membership import book as member_book
from raftcron.cluster.membership import directory
from raftcron.cluster.membership.book import (
    BeginMemberChange,
    CancelMemberChange,
    EndMemberChange,
    Member,
    MemberBook,
)
from raftcron.scheduler import codec
from raftcron.scheduler.commands import Barrier
from raftcron.scheduler.errors import Invalid, Ok, Rejected

N1, N2, N3 = (Member(f"n{i}", f"10.0.0.{i}:7001", f"10.0.0.{i}:8001") for i in (1, 2, 3))
N4 = Member("n4", "10.0.0.4:7001", "10.0.0.4:8001")
START = (N1, N2, N3)


def apply(book: MemberBook, *commands: member_book.MemberCommand) -> tuple[MemberBook, list[
        Ok | Rejected]]:
    results = []
    for command in commands:
        book, result = book.apply(command)
        results.append(result)
    return book, results


def test_the_first_change_adopts_the_members_the_proposer_named() -> None:
    book, [result] = apply(MemberBook(), BeginMemberChange("add", N4, START))
    assert isinstance(result, Ok) and book.members == START and book.change is not None
    assert book.change.member == N4 and book.change.change_id == 1


def test_a_second_change_while_one_is_in_progress_is_refused_and_changes_nothing() -> None:
    book, _ = apply(MemberBook(), BeginMemberChange("add", N4, START))
    after, [result] = apply(book, BeginMemberChange("remove", N2, START))
    assert isinstance(result, Rejected) and result.code == "membership_change_in_progress"
    assert after == book


def test_a_repeated_begin_answers_the_change_it_started() -> None:
    book, [first, again] = apply(MemberBook(), BeginMemberChange("add", N4, START),
                                 BeginMemberChange("add", N4, START))
    assert isinstance(again, Ok) and again.value["repeated"] is True
    assert isinstance(first, Ok) and again.value["change"] == first.value["change"]
    assert book.next_change_id == 2


@pytest.mark.parametrize(("command", "code"), [
    (BeginMemberChange("add", N1, START), "member_exists"),
    (BeginMemberChange("add", Member("n9", N1.raft_address, "10.0.0.9:8001"), START),
     "address_in_use"),
    (BeginMemberChange("add", Member("n9", "10.0.0.9:7001", N2.http_address), START),
     "address_in_use"),
    (BeginMemberChange("remove", N4, START), "not_found"),
    (BeginMemberChange("remove", N1, (N1,)), "last_member"),
    (BeginMemberChange("add", N4, ()), "invalid"),
])
def test_a_change_that_cannot_be_made_is_refused_naming_why(
        command: BeginMemberChange, code: str) -> None:
    book, [result] = apply(MemberBook(), command)
    assert isinstance(result, Rejected) and result.code == code
    assert book == MemberBook()  # nothing half-applied, not even the adopted members


def test_an_added_member_joins_the_book_only_when_its_change_ends_done() -> None:
    book, _ = apply(MemberBook(), BeginMemberChange("add", N4, START))
    assert N4 not in book.members
    done, [result] = apply(book, EndMemberChange(1, "done"))
    assert isinstance(result, Ok) and done.members == (N1, N2, N3, N4) and done.change is None
    aborted, _ = apply(book, EndMemberChange(1, "aborted", "did not catch up"))
    assert aborted.members == START and aborted.ended(1) is not None
    assert aborted.ended(1).reason == "did not catch up"  # type: ignore[union-attr]


def test_a_removal_takes_the_books_own_record_of_the_member() -> None:
    book, _ = apply(MemberBook(), BeginMemberChange(
        "remove", Member("n2", "1.1.1.1:1", "1.1.1.1:2"), START))
    assert book.change is not None and book.change.member == N2
    done, _ = apply(book, EndMemberChange(1, "done"))
    assert done.members == (N1, N3)


def test_ending_or_cancelling_another_change_is_refused() -> None:
    book, _ = apply(MemberBook(), BeginMemberChange("add", N4, START))
    _, [end, cancel] = apply(book, EndMemberChange(7, "done"), CancelMemberChange(7, "x"))
    assert isinstance(end, Rejected) and end.code == "not_found"
    assert isinstance(cancel, Rejected) and cancel.code == "not_found"


def test_a_cancel_marks_the_change_until_it_ends() -> None:
    book, [_, _, again] = apply(MemberBook(), BeginMemberChange("add", N4, START),
                                    CancelMemberChange(1, "cancelled"),
                                    CancelMemberChange(1, "twice"))
    assert book.change is not None and book.change.cancel_reason == "cancelled"
    assert isinstance(again, Ok) and again.value["repeated"] is True


def test_the_history_keeps_the_last_changes_only() -> None:
    book = MemberBook()
    for change_id in range(1, member_book.HISTORY_MAX + 5):
        book, _ = apply(book, BeginMemberChange("add", N4, START),
                        EndMemberChange(change_id, "aborted", "no"))
    assert len(book.history) == member_book.HISTORY_MAX
    assert book.ended(1) is None and book.ended(member_book.HISTORY_MAX + 4) is not None


# -- the wire and the snapshot ---------------------------------------------------------------

members = st.sampled_from([N1, N2, N3, N4, Member("n5", "10.0.0.5:7001", "10.0.0.5:8001")])
commands = st.one_of(
    st.builds(BeginMemberChange, st.sampled_from(["add", "remove"]), members,
              st.just(START)),
    st.builds(EndMemberChange, st.integers(1, 6), st.sampled_from(["done", "aborted"]),
              st.sampled_from(["", "why"])),
    st.builds(CancelMemberChange, st.integers(1, 6), st.just("stop")),
)


@given(st.lists(commands, max_size=30))
def test_replicas_fed_the_same_frames_hold_the_same_book_and_its_snapshot_restores_it(
        sequence: list[member_book.MemberCommand]) -> None:
    one, two = MemberBook(), MemberBook()
    for command in sequence:
        frame = member_book.encode(command)
        decoded = member_book.decode(frame)
        assert decoded == command
        one, first = one.apply(command)
        two, second = two.apply(decoded)
        assert first == second
        # At most one change at a time, and the members are always sorted and unique.
        ids = [m.node_id for m in one.members]
        assert ids == sorted(set(ids))
    assert one == two
    assert MemberBook.from_wire(one.to_wire()) == one


def test_an_older_snapshot_without_a_book_loads_an_empty_one() -> None:
    assert MemberBook.from_wire(None) == MemberBook()


@pytest.mark.parametrize("data", [[1, 2], [[{"node_id": "bad id!"}], None, 1, []], "x"])
def test_a_damaged_book_in_a_snapshot_is_refused_naming_it(data: object) -> None:
    with pytest.raises(ValueError, match="member book"):
        MemberBook.from_wire(data)


def test_frames_of_the_core_or_garbage_are_not_the_books() -> None:
    assert member_book.decode(codec.encode(Barrier("x"))) is None
    assert member_book.decode(b"\xc1garbage") is None


def test_a_book_frame_with_bad_fields_is_invalid_naming_the_field() -> None:
    frame = member_book.encode(BeginMemberChange("add", Member("n4", "nohost", "h:1"), START))
    with pytest.raises(Invalid) as caught:
        member_book.decode(frame)
    assert caught.value.field == "member.raft_address"


# -- the directory and the config ------------------------------------------------------------

def _config(**extra: object) -> object:
    raw = {"node_id": "n4", "raft_address": N4.raft_address, "http_address": "127.0.0.1:8004",
           "cluster_password": "a-long-password",
           "peers": [m.to_wire() for m in START], **extra}
    return parse(raw, base_dir=Path("/tmp"))


def test_a_joining_node_is_not_a_member_until_the_book_says_so() -> None:
    config = _config(join=True)
    assert not directory.is_member(config, MemberBook())  # type: ignore[arg-type]
    assert directory.initial_members(config) == START  # type: ignore[arg-type]
    me = Member("n4", N4.raft_address, "127.0.0.1:8004")
    book, _ = apply(MemberBook(), BeginMemberChange("add", me, START), EndMemberChange(1, "done"))
    assert directory.is_member(config, book)  # type: ignore[arg-type]
    assert not directory.is_member(_config(), MemberBook(members=START))  # type: ignore[arg-type]


def test_a_node_whose_removal_is_in_progress_does_not_lead() -> None:
    config = _config()
    me = Member("n4", N4.raft_address, "127.0.0.1:8004")
    book, _ = apply(MemberBook(), BeginMemberChange("remove", me, (*START, me)))
    assert directory.being_removed(config, book)  # type: ignore[arg-type]
    cancelled, _ = apply(book, CancelMemberChange(1, "no"))
    assert not directory.being_removed(config, cancelled)  # type: ignore[arg-type]


@pytest.mark.parametrize(("extra", "key"), [
    ({"join": "yes"}, "join"),
    ({"join": True, "peers": []}, "join"),
    ({"membership": {"catch_up_timeout_s": 0}}, "membership.catch_up_timeout_s"),
    ({"membership": {"other": 1}}, "membership.other"),
])
def test_a_bad_membership_setting_is_refused_naming_its_key(
        extra: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _config(**extra)
    assert caught.value.key == key
