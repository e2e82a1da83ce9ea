"""Fair turns within a queue (DESIGN.md §9.4): a job's `fairness: {key, weight}` puts it in its
key's line, and within a queue and priority claims go round-robin across keys, `weight` jobs of
a key per turn, so one customer's 100,000-job burst does not make another's 10 jobs wait
behind it: with K keys in line a job waits at most the others' turns, not their backlogs.

`FairQueue` is the ready line of a queue that has ever had a job with a fairness key in it
(scheduler/store.py turns the queue's plain line into one with its first keyed job); jobs
without a key form one key together (""). It answers what a plain `ReadyQueue` does (`push`,
`peek`, `pop`, `remove`, `members`), so a claim and the views read both alike:

- each priority is a `Level`: a line per key (a heap of (run_at_ms, id, weight)), the keys in
  turn order (`ring`, the one whose turn it is first) and how many jobs the first took this
  turn (`credit`);
- `peek` answers the head of the best level's first key with jobs, changing nothing;
- `pop` takes it, and the key's turn ends after `weight` jobs (the weight of the job taken):
  it goes to the back of the ring. A claim of N jobs takes N turns. A job taken and then held
  back (its concurrency or rate key has no room, scheduler/claiming.py) did not start: the
  claim `give_back`s what the pop did to the turns, so its key's next job takes the turn.
- A key whose jobs all left keeps its place in the ring until the turns reach it (then it is
  dropped, or takes its turn if a job of it came back meanwhile): every change of the turns
  happens in a command's apply (`push`, `pop`, `remove`), never in a read, so replicas agree.

Snapshots carry each fair queue's levels (ring and credit); restore pushes the jobs back and
then puts the turns back as they were (`restore_turns`).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

from raftcron.scheduler.jobs import Job

NO_KEY = ""  # the key of a fair queue's jobs that give none


class Level:
    __slots__ = ("counts", "credit", "lines", "ring", "ringed")

    def __init__(self) -> None:
        self.lines: dict[str, list[tuple[int, int, int]]] = {}  # key -> (run_at_ms, id, weight)
        self.counts: dict[str, int] = {}  # key -> its jobs in line at this level
        self.ring: deque[str] = deque()  # keys in turn order; may hold keys with no jobs
        self.ringed: set[str] = set()  # the keys in `ring`
        self.credit = 0  # jobs the first key of the ring took in this turn


class FairQueue:
    __slots__ = ("levels", "members", "next", "spare", "taken")

    def __init__(self) -> None:
        self.members: dict[int, tuple[int, int, int]] = {}  # id -> (-priority, run_at_ms, id)
        self.levels: dict[int, Level] = {}  # -priority -> its level
        # A level emptied last, cleared, for the next new one (a queue that empties at every
        # claim would otherwise build a level per job): the same as a new one, cheaper.
        self.spare: Level | None = None
        # What `peek` found (the level, the key, the entry), for the `pop` a claim makes next;
        # checked again there (a change between them drops it). Not state: an answer cached.
        self.next: tuple[Level, str, tuple[int, int, int]] | None = None
        # What the last `pop` did to the turns (-priority, level, key, credit before it, whether
        # the ring turned), for a `give_back` in the same claim. Not state: read only right after.
        self.taken: tuple[int, Level, str, int, bool] | None = None

    def __len__(self) -> int:
        return len(self.members)

    def push(self, job: Job) -> None:
        entry = (-job.priority, job.run_at_ms, job.id)
        self.members[job.id] = entry
        level = self.levels.get(entry[0])
        if level is None:
            level = self.spare or Level()
            self.spare = None
            self.levels[entry[0]] = level
        fair = job.fairness
        key, weight = (NO_KEY, 1) if fair is None else (fair.key, fair.weight)
        line = level.lines.get(key)
        if line is None:
            line = level.lines[key] = []
        heapq.heappush(line, (job.run_at_ms, job.id, weight))
        count = level.counts.get(key, 0)
        level.counts[key] = count + 1
        if count == 0 and key not in level.ringed:
            level.ring.append(key)
            level.ringed.add(key)  # a new key (or one whose place was dropped): last turn

    def remove(self, job: Job) -> tuple[int, int, int] | None:
        """Take a job out of the line (it left `queued`, or is held); its heap entry goes stale."""
        entry = self.members.pop(job.id, None)
        if entry is None:
            return None
        level = self.levels[entry[0]]
        fair = job.fairness
        key = NO_KEY if fair is None else fair.key
        left = level.counts[key] - 1
        if left:
            level.counts[key] = left
        else:
            del level.counts[key]
            del level.lines[key]  # its stale entries with it; the ring keeps the key's place
        if not level.counts:  # no job left at this priority: its turns start afresh
            del self.levels[entry[0]]
            level.ring.clear()
            level.ringed.clear()
            level.credit = 0
            self.spare = level
        return entry

    def _head(self, level: Level, key: str) -> tuple[int, int, int] | None:
        """The key's first valid entry at `level` (stale ones dropped: the same jobs either
        way, so this changes no answer)."""
        line = level.lines.get(key)
        if line is None:
            return None
        members = self.members
        while line:
            run_at_ms, job_id, _ = line[0]
            member = members.get(job_id)
            if member is not None and member[1] == run_at_ms:
                return line[0]
            heapq.heappop(line)
        return None

    def peek(self) -> tuple[int, int, int] | None:
        if not self.levels:
            return None
        neg_priority = min(self.levels)
        level = self.levels[neg_priority]
        for key in level.ring:
            head = self._head(level, key)
            if head is not None:
                self.next = (level, key, head)
                return (neg_priority, head[0], head[1])
        return None  # unreachable: a level is dropped when its last job leaves

    def pop(self) -> int:
        """Take the head `peek` answered: the turn of its key advances (the caller's
        `set_status` or hold then `remove`s the job)."""
        level = self.levels[min(self.levels)]
        ring = level.ring
        found, self.next = self.next, None
        if found is not None and found[0] is level and found[1] == ring[0] \
                and (line := level.lines.get(found[1])) and line[0] is found[2]:
            key, head = found[1], found[2]  # what peek answered, still the first key's head
        else:
            while True:
                key = ring[0]
                first = self._head(level, key)
                if first is not None:
                    head = first
                    break
                level.ringed.discard(ring.popleft())  # no job of it left here: its place goes
                level.credit = 0
        heapq.heappop(level.lines[key])
        credit = level.credit
        level.credit += 1
        rotated = level.credit >= head[2]
        if rotated:  # its weight of jobs taken: the next key's turn
            ring.rotate(-1)
            level.credit = 0
        self.taken = (min(self.levels), level, key, credit, rotated)
        return head[1]

    def give_back(self) -> None:
        """The job the last `pop` took was held back, not started: its key's turn is as it was
        before the pop (a turn counts jobs started). Nothing to give when the hold emptied the
        level (its turns start afresh anyway)."""
        taken, self.taken = self.taken, None
        if taken is None:
            return
        neg_priority, level, key, credit, rotated = taken
        if self.levels.get(neg_priority) is not level:
            return
        ring = level.ring
        if rotated and ring[-1] == key:
            ring.rotate(1)
        elif rotated and key in level.ringed:  # the hold lined up a new key behind it
            ring.remove(key)
            ring.appendleft(key)
        level.credit = credit

    # -- snapshots ------------------------------------------------------------------------

    def turns(self) -> list[Any]:
        """[-priority, credit, [keys in turn order]] of each level, by priority."""
        return [[p, level.credit, list(level.ring)] for p, level in sorted(self.levels.items())]

    def restore_turns(self, turns: list[Any]) -> None:
        for neg_priority, credit, ring in turns:
            level = self.levels[neg_priority]
            level.ring, level.ringed = deque(ring), set(ring)
            level.credit = credit
