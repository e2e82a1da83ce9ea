"""`raftcron node --config FILE`: one member of the cluster, serving the HTTP API.

Startup: read and validate the config (every error names its key), build the PySyncObj node
on the main thread (its tick thread stops when the constructing thread dies), then run the
proposer, the leader's ticker and the HTTP server on the asyncio loop. SIGTERM and SIGINT stop
the HTTP server, the ticker and the Raft node in that order, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import faulthandler
import gc
import logging
import signal
import sys
import threading
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from raftcron.cluster import config as configuration
from raftcron.cluster.archive.fill import ArchiveFiller
from raftcron.cluster.clients.peerhttp import PeerDialer, peer_dialer
from raftcron.cluster.clock.clockpoll import ClockPoller
from raftcron.cluster.clock.clocks import ClockBook
from raftcron.cluster.clock.ticker import Ticker
from raftcron.cluster.config import NodeConfig
from raftcron.cluster.consensus.memberdriver import MembershipDriver
from raftcron.cluster.consensus.proposer import Proposer
from raftcron.cluster.consensus.replica import EXIT_STORAGE, RaftNode, sync_conf
from raftcron.cluster.consensus.waiters import ClaimWaiters
from raftcron.cluster.http.app import build_app
from raftcron.cluster.http.common import Services
from raftcron.cluster.http.listener import HttpListener
from raftcron.cluster.http.stamps import LeaderStamps
from raftcron.cluster.http.trail import AuditTrail
from raftcron.cluster.membership import raftconfig, startmode
from raftcron.cluster.membership.reach import ReachBook, ReachWatch
from raftcron.cluster.ops.activity import ActivityRing, ActivitySampler, counter_totals
from raftcron.cluster.ops.metrics import RAFT_ROLES, NodeStats
from raftcron.cluster.ops.notifier import Notifier, NotifierStats
from raftcron.cluster.storage.raftlog import StorageError
from raftcron.cluster.telemetry import logs, tracing
from raftcron.cluster.telemetry.gcpauses import process_pauses

log = logging.getLogger("raftcron.node")
STOP_STACKS_AFTER_S = 5.0
STOP_STEP_SLOW_S = 2.0
GC_THRESHOLDS = (50_000, 20, 100)
# Reads that would block the event loop (the archive's SQLite, backup files, the disk's free
# space) run on these threads, all started with the node: asyncio's default pool grows a thread
# at a time to min(32, CPUs + 4) as bursts come, which an endurance run saw take an hour, and
# a node whose thread count is fixed from its first second shows a thread leak as one.
IO_THREADS = 4


class Node:
    def __init__(
        self,
        config: NodeConfig,
        loop: asyncio.AbstractEventLoop,
        dialer: PeerDialer,
        *,
        rejoin_empty: bool = False,
    ) -> None:
        self.config = config
        self.loop = loop
        self.stats = NodeStats(gc_pauses=process_pauses())
        self.waiters = ClaimWaiters(loop)
        conf = sync_conf(config, on_state_changed=self._on_state_changed)
        self.raft = RaftNode(
            config, conf, on_applied=self.waiters.on_applied, rejoin_empty=rejoin_empty
        )
        self.proposer = Proposer(
            self.raft,
            loop,
            commit_timeout_s=config.raft.commit_timeout_s,
            batch_commands_max=config.raft.batch_commands_max,
        )
        members = [peer.node_id for peer in config.members]
        self.stats.clocks = ClockBook(config.node_id, members,
                                      max_skew_ms=config.clock.max_skew_ms)
        self.clock_poller = ClockPoller(config, self.stats.clocks, dialer,
                                        members=self.raft.members)
        # Whom this node reaches over Raft (raftcron_member_reachable): a member silent for
        # longer than a connection timeout is one PySyncObj has given up on too.
        self.stats.reach = ReachBook(config.node_id, bound_s=config.raft.connection_timeout_s)
        self.reach_watch = ReachWatch(
            self.stats.reach, self.raft.members,
            lambda address: raftconfig.is_connected(self.raft.sync, address))
        self.ticker = Ticker(
            self.raft,
            self.proposer,
            tick_ms=config.raft.tick_ms,
            clocks=self.stats.clocks,
            fire_lateness=self.stats.fire_lateness,
            releases=lambda: dict(self.clock_poller.releases),
        )
        # Notifications are delivered by the node whose leadership of this term committed.
        self.stats.notifier = NotifierStats()
        self.notifier = Notifier(
            self.raft, self.proposer,
            lambda: self.raft.is_leader() and self.ticker.led_term == self.raft.term,
            stats=self.stats.notifier,
        )
        self.membership = MembershipDriver(
            self.raft, self.proposer,
            catch_up_timeout_s=config.membership.catch_up_timeout_s,
            election_timeout_s=config.raft.election_timeout_min_s,
        )
        # A member missing part of the archive fills it from its peers (cluster/archive/fill.py).
        self.archive_filler = None if self.raft.archive is None else ArchiveFiller(
            self.raft.archive.writer, dialer, self.raft.peer_addresses)
        if self.raft.archive is not None:
            self.raft.archive.filler = self.archive_filler
        # The dashboard's charts (cluster/ops/activity.py): this node's samples, not replicated.
        self.activity_sampler = ActivitySampler(
            ActivityRing(),
            totals=lambda: self.raft.machine.read(counter_totals),
            claim_latency=self.stats.claim_latency,
            ready=lambda: self.raft.leader_id() is not None and bool(self.raft.sync.isReady()),
        )
        # A follower's claim on a rate-window queue asks the leader for its time.
        self.leader_stamps = LeaderStamps(dialer, self._leader_address,
                                          outcomes=self.stats.claim_stamps)
        self.services = Services(
            config, self.raft, self.proposer, self.waiters, self.stats,
            trail=AuditTrail(config.data_dir, config.node_id), dialer=dialer,
            activity=self.activity_sampler.ring, stamp=self.ticker.stamp,
            leader_stamp=self.leader_stamps.ask,
        )
        self.runner: web.AppRunner | None = None
        self.listener: HttpListener | None = None

    def _leader_address(self) -> tuple[str, str] | None:
        """The leader's (node id, HTTP address), when another member leads."""
        leader = self.raft.leader_id()
        for node_id, address in self.raft.peer_addresses():
            if node_id == leader:
                return node_id, address
        return None

    def _on_state_changed(self, old: int, new: int) -> None:  # on the Raft thread
        if 2 in (old, new):
            self.stats.leader_changes += 1
        proposer = getattr(self, "proposer", None)
        if old == 2 and proposer is not None:  # what it proposed is answered "leader changed"
            proposer.leadership_lost()
        before, after = RAFT_ROLES.get(old, str(old)), RAFT_ROLES.get(new, str(new))
        # The term, so that a log read afterwards can tell two leaders of one term apart
        # (the chaos suite's membership checker).
        raft = getattr(self, "raft", None)
        term = None if raft is None else raft.term
        log.info(
            "raft role %s -> %s (term %s)",
            before,
            after,
            term,
            extra={"action": "raft_role_changed", "old": before, "new": after, "term": term},
        )
        self.loop.call_soon_threadsafe(self.ticker.wake.set)

    async def start(self) -> None:
        self.clock_poller.start()
        self.reach_watch.start()
        self.activity_sampler.start()
        self.ticker.start()
        self.notifier.start()
        self.membership.start()
        if self.archive_filler is not None:
            self.archive_filler.start()
        # keepalive_timeout: aiohttp closes a connection idle that long, also one that has not
        # sent a whole first request head (the listener's docstring says why that matters).
        self.runner = web.AppRunner(
            build_app(self.services),
            access_log=None,
            handle_signals=False,
            keepalive_timeout=self.config.api.idle_timeout_s,
            # At a stop, writes waiting for a commit and long-polling claims are answered at
            # once (stop() below); this bounds the rest in flight (a body still arriving, an
            # answer still being written), after which it is cancelled.
            shutdown_timeout=self.config.raft.commit_timeout_s + 1.0,
        )
        await self.runner.setup()
        self.listener = HttpListener(self.runner, self.config.http_address, self.config.api)
        await self.listener.start()
        log.info(
            "node %s serving %s://%s (at most %d connections), raft %s",
            self.config.node_id,
            "https" if self.config.api.tls else "http",
            self.config.http_address,
            self.listener.cap,
            self.config.raft_address if self.config.peers else "(no peers: not listening)",
            extra={"action": "node_started"},
        )

    async def stop(self) -> None:
        log.info("stopping", extra={"action": "node_stopping"})
        # A stop slower than this writes every thread's stack to the log (stderr), once: what
        # it waits for is then on record even if a service manager kills the node after.
        faulthandler.dump_traceback_later(STOP_STACKS_AFTER_S, exit=False)
        try:
            await self._stop_steps()
        finally:
            faulthandler.cancel_dump_traceback_later()

    async def _stop_steps(self) -> None:
        # Each step timed, so that a stop that takes long says which step held it, and a step
        # still running after STOP_STEP_SLOW_S says so then (a stop killed for its slowness
        # never reaches the summary line).
        steps: dict[str, float] = {}

        async def step(name: str, work: Awaitable[None]) -> None:
            started = time.monotonic()
            task = asyncio.ensure_future(work)
            finished, _ = await asyncio.wait({task}, timeout=STOP_STEP_SLOW_S)
            if not finished:
                log.warning("stopping: %s not done after %g s", name, STOP_STEP_SLOW_S,
                            extra={"action": "node_stop_slow", "step": name})
            await task
            steps[name] = round(time.monotonic() - started, 3)

        self.services.stopping.set()  # requests that wait (membership changes) answer now
        self.proposer.stop()  # and writes waiting for a commit answer now, unknown
        if self.listener is not None:
            self.listener.close()
        self.waiters.close()  # long-polling claims answer now instead of at their deadline
        await step("http", self._stop_http())
        if self.listener is not None:
            await step("listener", self.listener.wait_closed())
        await step("notifier", self.notifier.stop())
        await step("ticker", self.ticker.stop())
        await step("membership", self.membership.stop())
        await step("clock_poller", self.clock_poller.stop())
        await step("reach_watch", self.reach_watch.stop())
        await step("activity_sampler", self.activity_sampler.stop())
        if self.archive_filler is not None:
            await step("archive_filler", self.archive_filler.stop())
        started = time.monotonic()
        self.raft.destroy()
        steps["raft"] = round(time.monotonic() - started, 3)
        log.info("stopped in %.2f s (%s)", sum(steps.values()),
                 ", ".join(f"{step} {took:g} s" for step, took in steps.items()),
                 extra={"action": "node_stopped", "steps_s": steps})

    async def _stop_http(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        await self.leader_stamps.close()


def io_pool(threads: int = IO_THREADS) -> ThreadPoolExecutor:
    """A pool with all its `threads` started: each of as many first tasks waits for the others,
    so none finds a thread idle and each starts one (the pool starts threads on submit only)."""
    pool = ThreadPoolExecutor(threads, thread_name_prefix="raftcron-io")
    everyone = threading.Barrier(threads, timeout=10)
    for started in [pool.submit(everyone.wait) for _ in range(threads)]:
        started.result()
    return pool


async def _serve(config: NodeConfig, dialer: PeerDialer, rejoin_empty: bool) -> None:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(io_pool())  # asyncio.run shuts it down at the end
    node = Node(config, loop, dialer, rejoin_empty=rejoin_empty)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await node.start()
    listener = node.listener
    if listener is not None:  # SIGHUP: re-read the TLS certificate and key
        loop.add_signal_handler(signal.SIGHUP, listener.reload_tls)
    await stop.wait()
    await node.stop()


def dump_stacks(signum: int, frame: object) -> None:
    """Every thread's stack to stderr, from a Python-level handler: the main thread runs it
    holding the GIL, so no other thread moves its frames meanwhile. faulthandler's own handler
    (`faulthandler.register`) walks the other threads' frames from the C signal handler while
    they run, and a node crashed (SIGSEGV) in the middle of such a dump (a fresh-clone CI,
    2026-12-06, the Raft thread in the log's writes): a request for stacks must never kill the
    node. The cost: a main thread that never gets back to Python writes none (one waiting on
    the event loop, a lock or a join does: the signal interrupts the wait)."""
    faulthandler.dump_traceback(sys.stderr, all_threads=True)


def run(
    config_path: str | None, overrides: dict[str, Any] | None = None, *,
    rejoin_empty: bool = False, ask_peers_s: float | None = None,
) -> int:
    """Run a node configured by the file at `config_path` and the environment (or by the
    environment alone, `config_path` None) until SIGTERM or SIGINT; its exit code.
    `ask_peers_s` (--rejoin-empty=auto): an empty node asks its peers for at most that long
    whether to start new, rejoin or join (cluster/membership/startmode.py)."""
    try:
        config = configuration.load(config_path)
        dialer = peer_dialer(config)  # reads the TLS files (RAFTCRON_CA_FILE too) now
        tracing.start(config.tracing.otlp_endpoint, "raftcron-node", config.node_id,
                      where="tracing.otlp_endpoint")
    except configuration.ConfigError as error:
        print(f"raftcron node: config error: {error}", file=sys.stderr, flush=True)
        return 2
    except tracing.TracingUnavailable as error:
        print(f"raftcron node: cannot start: {error}", file=sys.stderr, flush=True)
        return 2
    logs.setup(config.log_level, config.node_id)
    # The state is a large heap that lives as long as the node: with the default thresholds
    # (700, 10, 10) the cycle collector walks all of it again and again as jobs are created
    # (9 full collections while 200,000 jobs were applied: a quarter of the apply's CPU, and a
    # full one is a pause of hundreds of ms at a million jobs). Young collections every
    # 50,000 allocations instead of 700: 1 full collection for the same work.
    gc.set_threshold(*GC_THRESHOLDS)
    # `kill -USR1 <pid>`: every thread's stack to stderr (the node's log), for a node that hangs.
    signal.signal(signal.SIGUSR1, dump_stacks)
    if config.environment:  # said once, so a value from a pod or a variable is never a surprise
        log.info("config from the environment: %s (node %s, raft %s, http %s)",
                 " ".join(f"{key}={variable}" for key, variable in config.environment),
                 config.node_id, config.raft_address, config.http_address,
                 extra={"action": "config_from_environment"})
    if ask_peers_s is not None:
        try:
            decision = startmode.choose(config, dialer, ask_s=ask_peers_s)
        except OSError as error:  # this node's HTTP address cannot be bound, to answer
            log.critical("cannot ask the peers: %s", error,
                         extra={"action": "node_start_failed"})
            return 1
        if decision.mode == "undecided":
            print(f"raftcron node: not started: {decision.reason}", file=sys.stderr, flush=True)
            return startmode.EXIT_UNDECIDED
        rejoin_empty = decision.mode == "rejoin"
        if decision.mode == "join":
            config = dataclasses.replace(config, join=True)
    try:
        asyncio.run(_serve(config, dialer, rejoin_empty))
    except StorageError as error:
        log.critical("cannot start: data dir %s: %s", config.data_dir, error,
                     extra={"action": "storage_refused"})
        print(f"raftcron node: cannot start: {error}", file=sys.stderr, flush=True)
        return EXIT_STORAGE
    except OSError as error:
        log.critical("cannot start: %s", error, extra={"action": "node_start_failed"})
        return 1
    finally:
        tracing.shutdown()  # the spans still batched go out
    return 0
