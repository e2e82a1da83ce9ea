"""Tier 0 of the chaos suite: checks over a whole history, and model rules for leaders and clocks.

Owns the list of open product bugs, and re-exports its two modules, neither of which does I/O:

* ``chaos.model.history``: ``HistoryChecker``, the rules a run keeps across every command it
  applied (one job per nominal fire time over the whole run, manual triggers never reuse a key,
  backfills older than the retention refused, nothing applied before the first Tick, tokens,
  fencing, DAG order, time), and ``StepFacts`` / ``events_of``, the events of one command.
  Tier 1 feeds it the replayed Raft log.
* ``chaos.model.rules``: ``LeadersClocksDuplicates``, hypothesis rules to extend a core model
  (tests/test_core_model.py's ``CoreModel``) with new clusters, leaders, clocks, duplicates,
  re-created schedules, triggers and backfills.

``OPEN_PRODUCT_BUGS``: product bugs the chaos suite found and reproduces, which the model and
tier 1 steer around until they are fixed. Each has a strict-xfail reproduction in
tests/chaos/test_tier0_model.py; delete the entry once the product is fixed, turn the xfail
into a plain test, and the model covers that ground again. Bugs found and fixed so far (each
now guarded by a plain test, the first four by tier-1 regression seeds too):
backfill-refires-forgotten, trigger-key-reused-after-recreate, requests-before-first-tick,
lease-from-stale-time, backfill-at-the-retention-edge, trigger-key-taken-by-a-buffered-fire,
client-key-shadows-fire-key, backfill-of-a-time-still-to-come, backfill-of-a-buffered-time.
"""

from __future__ import annotations

from raftcron.chaos.model.history import (
    RETENTION_MS,
    Accepted,
    Applied,
    Backfilled,
    Claimed,
    Clock,
    Event,
    Fired,
    HistoryChecker,
    Keyed,
    Led,
    RetentionSet,
    StepFacts,
    TriggerAnswered,
    Triggered,
    events_of,
    remembered_result,
)
from raftcron.chaos.model.rules import START_MS, LeadersClocksDuplicates

# Empty while every bug found is fixed; an entry names one still open, with how it goes wrong.
OPEN_PRODUCT_BUGS: dict[str, str] = {}

__all__ = [
    "OPEN_PRODUCT_BUGS", "RETENTION_MS", "START_MS", "Accepted", "Applied", "Backfilled",
    "Claimed", "Clock", "Event", "Fired", "HistoryChecker", "Keyed", "LeadersClocksDuplicates",
    "Led", "RetentionSet", "StepFacts", "TriggerAnswered", "Triggered", "events_of",
    "remembered_result",
]
