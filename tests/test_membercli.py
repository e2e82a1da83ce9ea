"""`raftcron cluster status`'s line about a membership change in progress
(cluster/commandline/membercli.py `status_lines`), fed the members view a node answers with."""

from __future__ import annotations

from typing import Any

from raftcron.cluster.commandline.membercli import status_lines
from raftcron.cluster.membership.book import (
    BeginMemberChange,
    CancelMemberChange,
    Member,
    MemberBook,
)

START = tuple(Member(f"n{n}", f"10.0.0.{n}:7001", f"10.0.0.{n}:8001") for n in (1, 2, 3))
N4 = Member("n4", "10.0.0.4:7001", "10.0.0.4:8001")


def cluster_view(book: MemberBook, phase: str) -> dict[str, Any]:
    """`GET /v1/cluster` as the leader answers it while the book's change is in progress."""
    assert book.change is not None
    return {"node": "n1", "role": "leader", "leader": "n1",
            "membership_change": {**book.change.to_wire(), "phase": phase, "match_index": 40}}


def test_a_change_in_progress_names_the_change_and_the_node_catching_up() -> None:
    book, _ = MemberBook().apply(BeginMemberChange("add", N4, START))
    line = status_lines(cluster_view(book, "catching_up"))
    assert line == "change 1 in progress: add n4 (10.0.0.4:7001), catching_up\n"


def test_a_cancelled_change_says_why_and_no_change_says_nothing() -> None:
    book, _ = MemberBook().apply(BeginMemberChange("add", N4, START))
    book, _ = book.apply(CancelMemberChange(1, "did not catch up within 600 s"))
    line = status_lines(cluster_view(book, "cancelling"))
    assert line == ("change 1 in progress: add n4 (10.0.0.4:7001), cancelling, cancelled: "
                    "did not catch up within 600 s\n")
    assert status_lines({"node": "n1", "membership_change": None}) == ""
