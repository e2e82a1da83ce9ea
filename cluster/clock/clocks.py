"""What this node may believe about the time: the peers' clocks, its own skew, a Tick's bound.

Owns two pieces of arithmetic the ticker applies (DESIGN.md §8.2); no I/O, no clock of its own:
every time comes in as an argument, so the simulation (chaos/tier1) runs the very same rules.

* ``ClockBook``: samples of the other members' wall clocks (taken by cluster/clock/clockpoll.py over
  HTTP, NTP-style: the peer's reading is placed at the midpoint of the round trip). A sample is
  aged by this node's *monotonic* clock, so a leap of this node's own wall clock does not move
  what it believes of the others. From them: each member's offset from this node, the
  ``quorum_clock_ms`` (the highest time a majority of the members' clocks have reached: the
  k-th largest clock, k a majority of the members; unknown while fewer than k are known), and
  this node's skew from the majority (from the median of the largest group of at least k
  clocks that agree within ``max_skew_ms``; while none agrees, from the lower median of the
  known clocks; unknown while fewer than k are known).
* ``TickBound``: the time a Tick from this node carries. With a quorum clock: that clock (the
  same for every leader that is not skewed, so a change of leader does not move a lease's end;
  after whole-cluster downtime this is how the jump to the present is taken: once a majority's
  clocks are known it is there). Without one: the last trusted reference (the quorum clock when
  last known, else, after a wait, the first state time this process saw committed) plus the
  monotonic time elapsed since, plus ``slack_ms`` (commit latency, monotonic drift), and never
  more than this node's own wall clock. A node that has neither proposes no Tick. A one-member
  cluster is its own majority: it takes its own clock once per process start, then keeps to
  the monotonic rule.

Why the reference does not follow every committed Tick: a bound re-anchored on each of its own
Ticks would let a fast wall clock gain ``slack_ms`` per Tick (several times real speed).
"""

from __future__ import annotations

from dataclasses import dataclass

SAMPLE_FRESH_S = 5.0  # a sample older than this (by the monotonic clock) is forgotten
SAMPLE_RTT_MAX_S = 1.0  # a slower round trip says too little about the peer's clock
REFERENCE_WAIT_S = SAMPLE_FRESH_S  # see TickBound.observe_state
TICK_SLACK_MS_DEFAULT = 250  # what a Tick may run ahead of the evidence (commit latency, drift)


@dataclass(frozen=True)
class ClockView:
    """What the book says at one instant (this node's wall and monotonic clocks)."""

    offsets_ms: dict[str, int]  # member -> its clock minus ours (ours: 0), fresh samples only
    quorum_clock_ms: int | None  # a majority of the members' clocks are at or past it
    skew_ms: int | None  # our clock minus the agreeing majority's median; None: unknown
    max_skew_ms: int

    def agreeing(self) -> list[str]:
        """The members whose clocks agree with the majority's: where a skewed leader hands
        over (to one chosen by PySyncObj, it could hand to another skewed node, and back)."""
        if self.skew_ms is None:
            return []
        majority_ms = -self.skew_ms  # the majority's offset from us
        return sorted(member for member, offset_ms in self.offsets_ms.items()
                      if abs(offset_ms - majority_ms) <= self.max_skew_ms)

    @property
    def skewed(self) -> bool:
        """Off from an agreeing majority by more than max_skew_ms: never Tick this node's clock."""
        return self.skew_ms is not None and abs(self.skew_ms) > self.max_skew_ms


class ClockBook:
    def __init__(self, node_id: str, members: list[str], *, max_skew_ms: int) -> None:
        if node_id not in members:
            raise ValueError(f"{node_id!r} is not among the members {members}")
        self.node_id = node_id
        self.members = list(members)
        self.max_skew_ms = max_skew_ms
        # member -> (its wall clock in ms at our monotonic instant, that instant in s)
        self.samples: dict[str, tuple[float, float]] = {}

    @property
    def majority(self) -> int:
        return len(self.members) // 2 + 1

    def observe(self, member: str, *, peer_wall_ms: int, sent_mono_s: float,
                received_mono_s: float) -> bool:
        """One answer of `member` (its wall clock, read while our request was out). A round
        trip too slow to be informative, or a backwards one, is dropped: returns False."""
        rtt_s = received_mono_s - sent_mono_s
        if member == self.node_id or member not in self.members:
            return False
        if rtt_s < 0 or rtt_s > SAMPLE_RTT_MAX_S:
            return False
        self.samples[member] = (float(peer_wall_ms), (sent_mono_s + received_mono_s) / 2)
        return True

    def set_members(self, members: list[str]) -> None:
        """The members changed (cluster/membership): the majority follows; this node always
        counts its own clock."""
        wanted = sorted({*members, self.node_id})
        if wanted != sorted(self.members):
            self.members = wanted
            for member in [m for m in self.samples if m not in wanted]:
                del self.samples[member]

    def forget(self, member: str) -> None:
        self.samples.pop(member, None)

    def view(self, *, wall_ms: int, mono_s: float) -> ClockView:
        offsets = {self.node_id: 0}
        for member, (peer_ms, at_s) in self.samples.items():
            age_s = mono_s - at_s
            if 0 <= age_s <= SAMPLE_FRESH_S:
                offsets[member] = round(peer_ms + age_s * 1000) - wall_ms
        ordered = sorted(offsets.values())
        k = self.majority
        quorum = None if len(ordered) < k else wall_ms + ordered[len(ordered) - k]
        return ClockView(offsets, quorum, _skew_from_majority(ordered, k, self.max_skew_ms),
                         self.max_skew_ms)


def _skew_from_majority(ordered: list[int], k: int, max_skew_ms: int) -> int | None:
    """Our offset (0) minus the median of the largest run of >= k offsets spanning at most
    max_skew_ms."""
    best: list[int] | None = None
    start = 0
    for end in range(len(ordered)):
        while ordered[end] - ordered[start] > max_skew_ms:
            start += 1
        run = ordered[start:end + 1]
        if len(run) < k:
            continue
        # The largest run; of equal ones, the first that holds our clock (a majority that
        # agrees with us), else the lowest (time running late is the safe side).
        if best is None or len(run) > len(best) or (
                len(run) == len(best) and 0 in run and 0 not in best):
            best = run
    if best is None:
        # No majority agrees: judge by the (lower) median of what is known, once a majority
        # is known. Of two clocks 60 s apart the later one steps aside: time running late is
        # the safe side (no early fire, no early lease end), and a third clock settles it.
        return None if len(ordered) < k else -ordered[(len(ordered) - 1) // 2]
    return -best[(len(best) - 1) // 2]


class TickBound:
    """The highest `now_ms` this node may propose (see the module docstring)."""

    def __init__(self, slack_ms: int = TICK_SLACK_MS_DEFAULT) -> None:
        self.slack_ms = slack_ms
        self.reference: tuple[int, float] | None = None  # (time in ms, our monotonic s)
        self.took_own_clock = False
        self.first_seen: tuple[int, float] | None = None

    def observe_state(self, state_now_ms: int, mono_s: float) -> None:
        """A committed state time this process applied. Only the first is kept (a state that
        never ticked, 0, is none; later ones are mostly our own Ticks), and it becomes the
        reference only if no majority's clock is known within REFERENCE_WAIT_S: just after a
        start it is the time the cluster stopped, and a leader ticking from it would lease at
        a stale time and then jump when the peers' clocks arrive (leases ending early)."""
        if self.first_seen is None and state_now_ms > 0:
            self.first_seen = (state_now_ms, mono_s)
        if self.reference is None and self.first_seen is not None and \
                mono_s - self.first_seen[1] >= REFERENCE_WAIT_S:
            self.reference = self.first_seen

    def limit_ms(self, view: ClockView, *, wall_ms: int, mono_s: float) -> int | None:
        """The bound on a Tick now, or None: no evidence of the time, propose nothing."""
        alone = len(view.offsets_ms) == 1  # a one-member cluster: its own clock is the majority
        if view.quorum_clock_ms is not None and not (alone and self.took_own_clock):
            # Alone, a node takes its own clock once per process (its restart is the whole
            # cluster's downtime), then keeps to its monotonic clock like everyone else.
            self.took_own_clock = self.took_own_clock or alone
            self.reference = (view.quorum_clock_ms, mono_s)
            # The majority's time itself, not this node's clock: every leader that is not
            # skewed then ticks the same time, and a change of leader moves no lease's end.
            return view.quorum_clock_ms
        if self.reference is None:
            return None
        reference_ms, reference_s = self.reference
        elapsed_ms = max(0, round((mono_s - reference_s) * 1000))
        return min(wall_ms, reference_ms + elapsed_ms + self.slack_ms)


@dataclass(frozen=True)
class TickDecision:
    """What a leader's ticker does now: propose a Tick at `now_ms`, or nothing, and why."""

    now_ms: int | None
    view: ClockView
    reason: str  # "ok", "skewed" (the majority's time only) or "no_evidence" (no Tick)


def decide_tick(book: ClockBook, bound: TickBound, *, wall_ms: int, mono_s: float,
                state_now_ms: int) -> TickDecision:
    """The ticker's one question, asked by cluster/clock/ticker.py and by chaos/tier1 alike."""
    bound.observe_state(state_now_ms, mono_s)
    view = book.view(wall_ms=wall_ms, mono_s=mono_s)
    if view.skewed:
        # Its own clock is not trusted at all: at most the majority's time, when known.
        return TickDecision(view.quorum_clock_ms, view, "skewed")
    limit = bound.limit_ms(view, wall_ms=wall_ms, mono_s=mono_s)
    return TickDecision(limit, view, "ok" if limit is not None else "no_evidence")
