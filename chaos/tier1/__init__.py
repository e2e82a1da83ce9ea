"""Tier 1 of the chaos suite: the real replica under simulated faults, one seed at a time.

Real PySyncObj nodes carrying the product's consumer (``cluster.consensus.replica.StateMachine``,
its conf from ``cluster.consensus.replica.sync_conf``) run in ``chaos.sim``'s ``SimCluster``: a fake
clock, an in-memory network, crash = rebuild from journal and dump. A seed decides everything, so a
failing run replays: ``python -m raftcron.chaos.tier1 SEED``. With ``--durability fsync|os`` the
nodes keep their log on raftcron's storage (cluster/storage, on a ``SimDisk`` each) and the faults
include power losses (``tests/chaos/test_tier1_power.py``). The modules, each owning one part:

* ``machine``: the replica as a ``SimMachine``; bugs in ``apply`` fail the seed instead of
  ending the process; ``LogRecorder`` reads every node's applied entries (a fork is a problem).
* ``requests``: requests in batches, their answers, retries with the same bytes (after a
  failure, a commit timeout, or ``not_ready``).
* ``workload``: each node's ticker (cluster/clock/ticker.py's rules: [BeginLeadership, Tick] as one
  entry on a new term, then a Tick every tick_ms or sooner), workers that fail, stall past
  their lease and crash, and clients that put schedules, submit with keys, repeat requests,
  backfill a schedule whose runs `retain` deletes (and from beyond the retention horizon),
  and delete, create again and trigger a manual schedule.
* ``faults``: the seed's ``Profile`` (clock offsets up to 30 s either way, link faults, Raft
  timings) and the ``SimNemesis`` (crashes, whole-cluster downtime, a paused leader, partitions
  both ways and one way, slow and duplicating links, crashed workers; on raftcron's storage,
  power losses of a node, the leader, a majority, every node).
* ``checks``: the committed log replayed under ``chaos.model.HistoryChecker`` must give every
  replica's digest; every answer came from the log; acknowledged submits and acks stand;
  invariants; one job per fire time and every unfired time counted; no stale ack accepted;
  the dead worker's job re-ran within its bound and not before its lease could end.
* ``run``: ``SeedRun``, the two phases (safety under faults; then liveness: healed, a probe job
  whose worker dies holding its lease, schedules paused, the store drained), ``run_seed``
  and the command line.
"""

from raftcron.chaos.tier1.checks import (
    LeaseProbe,
    Replay,
    audit,
    check_answers,
    check_digests,
    check_fencing,
    check_final_state,
    check_fires,
    check_leases_kept,
    check_probe,
    replay,
)
from raftcron.chaos.tier1.faults import Profile, SimNemesis
from raftcron.chaos.tier1.machine import LogRecorder, RecordingCluster, ReplicaBug, ReplicaMachine
from raftcron.chaos.tier1.requests import Outbox, Request
from raftcron.chaos.tier1.run import WALL0_MS, SeedResult, SeedRun, main, run_seed
from raftcron.chaos.tier1.workload import SimClient, SimTicker, SimWorker
from raftcron.cluster.clock.ticker import leadership_entry

__all__ = [
    "WALL0_MS",
    "LeaseProbe",
    "LogRecorder",
    "Outbox",
    "Profile",
    "RecordingCluster",
    "Replay",
    "ReplicaBug",
    "ReplicaMachine",
    "Request",
    "SeedResult",
    "SeedRun",
    "SimClient",
    "SimNemesis",
    "SimTicker",
    "SimWorker",
    "audit",
    "check_answers",
    "check_digests",
    "check_fencing",
    "check_final_state",
    "check_fires",
    "check_leases_kept",
    "check_probe",
    "leadership_entry",
    "main",
    "replay",
    "run_seed",
]
