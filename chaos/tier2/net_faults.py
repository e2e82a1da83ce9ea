"""The `sicknet` plan (CHAOS.md "Wave 3", issue 27 Build 3): a sick network, one fault at a time.

What it owns: `plan_sicknet`, which cycles through the network sicknesses of
chaos/tier2/sick_network.py while the workload runs, each held then healed:

- latency 50 +- 25 ms on every link: the regression guard. Its start event carries
  `leader_changes_max: 0`, which `checkers.network` holds the run to;
- latency 150 +- 50 ms on every link;
- a stalled leader -> follower link, a stalled follower -> leader link, and a stalled link
  held longer than the election timeout (both ways between the leader and a follower): each
  held to 0 leader changes too, since the member cut off from the leader asks the other
  before it stands (PreVote, cluster/consensus/prevote.py) and the other still hears the leader;
- one-way loss of 5-20 % on the leader's outgoing links;
- resets of the leader's Raft connections, a few in a row.

Latency, stalls, loss and resets carry `failover_expected: False`: they slow the leader's links but
give no reason to replace it, so the liveness checker's "worst failover" (the time from a fault
on the leader to a leader of a newer term) leaves them out instead of timing the next
unrelated election.

It must not judge: the checkers do. Every wait is bounded, and whatever happens every
sickness is cured before the plan returns.
"""

from __future__ import annotations

from collections.abc import Callable

from raftcron.chaos.tier2.context import Context
from raftcron.chaos.tier2.nemesis import CHAOS_RAFT
from raftcron.chaos.tier2.sick_network import Sickness, cure, cure_all, lose, reset, sicken, stall

GUARD = Sickness(delay_ms=50, jitter_ms=25)
SLOW = Sickness(delay_ms=150, jitter_ms=50)
HOLD_S_MIN = 3.0
HOLD_S_MAX = 15.0
QUIET_S = 1.5
RESETS = 3
# What a stall must not cause: one member cut off from the leader deposes nobody.
NO_LEADER_CHANGE = {"leader_changes_max": 0, "failover_expected": False}
# A stall "longer than the election timeout" is held at least this long.
ELECTION_TIMEOUT_S = float(CHAOS_RAFT["election_timeout_max_s"])  # type: ignore[arg-type]


def _every_link(ctx: Context) -> list[tuple[str, str]]:
    nodes = ctx.node_ids()
    return [(a, b) for a in nodes for b in nodes if a != b]


def _leader_and_follower(ctx: Context) -> tuple[str, str]:
    leader = ctx.leader() or ctx.node_ids()[0]
    follower = ctx.rng.choice([n for n in ctx.node_ids() if n != leader])
    return leader, follower


def _latency(sickness: Sickness, *, guard: bool) -> Callable[[Context, float], None]:
    def step(ctx: Context, hold_s: float) -> None:
        fields = {"leader_changes_max": 0} if guard else {}
        fault = sicken(ctx.nemesis, _every_link(ctx), sickness, fault="latency",
                       failover_expected=False, **fields)
        ctx.hold(hold_s)
        cure(ctx.nemesis, fault)

    return step


def _stall_down(ctx: Context, hold_s: float) -> None:
    leader, follower = _leader_and_follower(ctx)
    fault = stall(ctx.nemesis, [(leader, follower)], direction="leader_to_follower",
                  **NO_LEADER_CHANGE)
    ctx.hold(hold_s)
    cure(ctx.nemesis, fault)


def _stall_up(ctx: Context, hold_s: float) -> None:
    leader, follower = _leader_and_follower(ctx)
    fault = stall(ctx.nemesis, [(follower, leader)], direction="follower_to_leader",
                  **NO_LEADER_CHANGE)
    ctx.hold(hold_s)
    cure(ctx.nemesis, fault)


def _stall_long(ctx: Context, hold_s: float) -> None:
    leader, follower = _leader_and_follower(ctx)
    fault = stall(ctx.nemesis, [(leader, follower), (follower, leader)],
                  direction="both", longer_than_election=True, **NO_LEADER_CHANGE)
    ctx.hold(max(hold_s, 2 * ELECTION_TIMEOUT_S + 1))
    cure(ctx.nemesis, fault)


def _loss(ctx: Context, hold_s: float) -> None:
    leader = ctx.leader() or ctx.node_ids()[0]
    fault = lose(ctx.nemesis, leader, round(ctx.rng.uniform(0.05, 0.20), 3),
                 failover_expected=False)
    ctx.hold(hold_s)
    cure(ctx.nemesis, fault)


def _resets(ctx: Context, hold_s: float) -> None:
    for _ in range(RESETS):
        leader = ctx.leader() or ctx.node_ids()[0]
        reset(ctx.nemesis, leader, failover_expected=False)
        ctx.hold(hold_s / RESETS)


STEPS: list[Callable[[Context, float], None]] = [
    _latency(GUARD, guard=True),
    _latency(SLOW, guard=False),
    _stall_down,
    _stall_up,
    _stall_long,
    _loss,
    _resets,
]


def plan_sicknet(ctx: Context) -> None:
    """The steps in order, again and again until the deadline; see the module docstring."""
    hold_s = min(HOLD_S_MAX, max(HOLD_S_MIN, ctx.duration_s / len(STEPS) - QUIET_S - 1))
    try:
        for _ in range(1_000):
            for step in STEPS:
                if ctx.left_s() <= HOLD_S_MIN:
                    return
                step(ctx, hold_s)
                ctx.wait_ready()
                ctx.hold(QUIET_S)
    finally:
        cure_all(ctx.nemesis)
