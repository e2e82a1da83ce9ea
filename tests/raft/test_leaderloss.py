"""cluster/consensus/leaderloss.py's order: after the leader's connection drops, the remaining
members stand one after the other by id, so two of them rarely split the vote."""

from __future__ import annotations

import pytest

from raftcron.cluster.consensus.leaderloss import FIRST_S, JITTER_S, STEP_S, election_delay_s


def test_the_remaining_members_stand_one_after_the_other_by_id() -> None:
    members = ["127.0.0.1:9003", "127.0.0.1:9001"]
    first = election_delay_s("127.0.0.1:9001", members, "127.0.0.1:9002", draw=0.0)
    second = election_delay_s("127.0.0.1:9003", ["127.0.0.1:9001"], "127.0.0.1:9002", draw=0.99)
    assert first == FIRST_S
    assert second == pytest.approx(FIRST_S + STEP_S + 0.99 * JITTER_S)
    assert first + JITTER_S < second  # the next one only if the first did not win


def test_the_link_keeper_sends_every_other_member_a_keepalive_each_period(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    import pysyncobj.syncobj as syncobj_module

    from raftcron.cluster.consensus.leaderloss import KEEPALIVE, LinkKeeper

    now = [100.0]
    monkeypatch.setattr(syncobj_module, "monotonicTime", lambda: now[0])
    sent: list[tuple[str, object]] = []
    transport = SimpleNamespace(send=lambda node, message: sent.append((node, message)))
    sync = SimpleNamespace(_SyncObj__transport=transport, _SyncObj__otherNodes={"b", "c"})
    keeper = LinkKeeper(every_s=0.5)
    keeper.tick(sync)
    assert sorted(sent) == [("b", KEEPALIVE), ("c", KEEPALIVE)]
    now[0] += 0.4
    keeper.tick(sync)
    assert len(sent) == 2  # not before the period is over
    now[0] += 0.1
    keeper.tick(sync)
    assert len(sent) == 4
