"""The workload: schedules, the sink the jobs write to, the worker processes that run them.

What it owns:
- `SCHEDULES`: every 2 s `fire_once`, every 3 s `fire_all`, every 5 s `skip` (second-level
  cron, misfire grace `GRACE_MS`), each firing one `chaos.effect` job;
- `Sink`: the effect target owned by the test (an SQLite file outside the cluster). Every
  execution is logged (start, failed, applied, duplicate, stale) with job id, key, token,
  worker, attempt and time; an effect is applied at most once per key, and never under a token
  older than one the sink has seen for that job (the fencing a real effect target does);
  and every ack the cluster answered "ok" that ended a job (acked_succeeded, acked_failed):
  the evidence that an evicted job was final (chaos/tier2/checkers/jobs.py);
- `worker_main`: a worker process (`raftcron chaos worker`) whose handler writes to the sink,
  and whose client (`AckRecorder`) logs the acks that ended a job;
- `WorkerPool`: starts those processes (each in its own namespace when there are namespaces)
  and delivers signals to them;
- the client side (`ClientLoad`: the submitter, the workflows, the stale actor and the monitor)
  is clientload.py's; it submits the jobs and workflows these workers run.

It must not judge the results (checkers do) and never sleeps without a bound.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from raftcron.chaos.tier2.history import History, now_ms
from raftcron.chaos.tier2.netns import Namespaces
from raftcron.cluster.clients.asyncclient import AsyncClient
from raftcron.cluster.dev.nodeprocesses import REPO_ROOT

QUEUE = "chaos"
TASK = "chaos.effect"
LEASE_MS = 5_000
GRACE_MS = 8_000
MAX_ATTEMPTS = 10
BACKOFF = {"initial_ms": 100, "factor": 1.5, "max_ms": 500, "jitter": 0}
JOB_DEFAULTS: dict[str, Any] = {"queue": QUEUE, "max_attempts": MAX_ATTEMPTS, "backoff": BACKOFF}

# name -> (period in seconds, misfire policy); cron with a seconds field, in UTC, so the
# nominal fire times are the multiples of the period since the epoch.
SCHEDULES: dict[str, tuple[int, str]] = {
    "every2-once": (2, "fire_once"),
    "every3-all": (3, "fire_all"),
    "every5-skip": (5, "skip"),
}


def schedule_body(period_s: int, policy: str) -> dict[str, Any]:
    return {
        "cron": f"*/{period_s} * * * * *",
        "tz": "UTC",
        "misfire": policy,
        "misfire_grace_ms": GRACE_MS,
        "max_catchup": 100,
        "overlap": "allow",
        "job": {"task": TASK, "payload": {"ms": 150}, **JOB_DEFAULTS},
    }


# -- the sink ------------------------------------------------------------------------------

SINK_SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER, key TEXT, token INTEGER,
    attempt INTEGER, worker TEXT, phase TEXT, t_ms INTEGER);
CREATE TABLE IF NOT EXISTS effects (
    key TEXT PRIMARY KEY, job_id INTEGER, token INTEGER, worker TEXT, t_ms INTEGER);
CREATE TABLE IF NOT EXISTS tokens (job_id INTEGER PRIMARY KEY, max_token INTEGER);
"""


class Sink:
    """One connection to the sink file (one per thread)."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(str(path), timeout=60, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA busy_timeout=60000")
        self.db.executescript(SINK_SCHEMA)

    def log(self, job: dict[str, Any], phase: str) -> None:
        self.db.execute(
            "INSERT INTO executions (job_id, key, token, attempt, worker, phase, t_ms) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (job["job_id"], job["key"], job["token"], job["attempt"], job["worker"], phase,
             now_ms()),
        )

    def apply(self, job: dict[str, Any]) -> str:
        """Apply the job's effect, fenced and idempotent: applied | duplicate | stale."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute(
                "SELECT max_token FROM tokens WHERE job_id = ?", (job["job_id"],)
            ).fetchone()
            if row is not None and job["token"] < row[0]:
                outcome = "stale"
            else:
                db.execute(
                    "INSERT INTO tokens (job_id, max_token) VALUES (?, ?) ON CONFLICT(job_id) "
                    "DO UPDATE SET max_token = excluded.max_token",
                    (job["job_id"], job["token"]),
                )
                seen = db.execute("SELECT 1 FROM effects WHERE key = ?", (job["key"],)).fetchone()
                if seen is not None:
                    outcome = "duplicate"
                else:
                    db.execute(
                        "INSERT INTO effects (key, job_id, token, worker, t_ms) "
                        "VALUES (?, ?, ?, ?, ?)",
                        (job["key"], job["job_id"], job["token"], job["worker"], now_ms()),
                    )
                    outcome = "applied"
            self.log(job, outcome)
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        return outcome

    def close(self) -> None:
        self.db.close()


def read_sink(path: Path) -> list[dict[str, Any]]:
    """Every execution row, in the order written."""
    if not path.exists():
        return []
    db = sqlite3.connect(str(path), timeout=60)
    try:
        rows = db.execute(
            "SELECT seq, job_id, key, token, attempt, worker, phase, t_ms FROM executions "
            "ORDER BY seq"
        ).fetchall()
    finally:
        db.close()
    names = ("seq", "job_id", "key", "token", "attempt", "worker", "phase", "t_ms")
    return [dict(zip(names, row, strict=True)) for row in rows]


# -- the worker process --------------------------------------------------------------------

# (job id, token) -> (key, attempt) of the attempts this worker process ran, for AckRecorder.
_ATTEMPTS: dict[tuple[int, int], tuple[str, int]] = {}


class AckRecorder(AsyncClient):
    """The worker's client: every ack the cluster answers "ok" that ends its job (a success, or
    a failure not to be retried) is logged in the sink as `acked_succeeded`/`acked_failed`,
    whichever way the worker sends it (with a claim, or alone through complete/fail). A job
    evicted for space soon after it ended may never be seen by the observer: this is the
    evidence that it ended. An ack whose answer never came is not logged (nothing is known)."""

    sink_path: Path | None = None  # set by worker_main before the worker starts
    worker_name = ""
    _local = threading.local()

    async def claim(self, worker: str, queues: Any, **fields: Any) -> dict[str, Any]:
        answer = await super().claim(worker, queues, **fields)
        sent = list(fields.get("acks") or ())
        outcomes = answer.get("acks") or []
        for ack, outcome in zip(sent, outcomes, strict=False):
            if outcome.get("id") == ack.get("id") and outcome.get("outcome") == "ok":
                self._record(ack["id"], ack["token"], ack.get("outcome"),
                             bool(ack.get("retryable", True)))
        return answer

    async def complete(self, job_id: int, token: int, result: Any = None) -> dict[str, Any]:
        answer = await super().complete(job_id, token, result)
        self._record(job_id, token, "succeeded", True)
        return answer

    async def fail(self, job_id: int, token: int, error: str, *,
                   retryable: bool = True) -> dict[str, Any]:
        answer = await super().fail(job_id, token, error, retryable=retryable)
        self._record(job_id, token, "failed", retryable)
        return answer

    def _record(self, job_id: int, token: int, outcome: Any, retryable: bool) -> None:
        if outcome == "succeeded":
            phase = "acked_succeeded"
        elif outcome == "failed" and not retryable:
            phase = "acked_failed"
        else:
            return  # a retryable failure: the job goes on, unless it ran out of attempts
        if self.sink_path is None:
            return
        sink = getattr(self._local, "sink", None)
        if sink is None:
            sink = self._local.sink = Sink(self.sink_path)
        key, attempt = _ATTEMPTS.get((int(job_id), int(token)), (f"job-{job_id}", 0))
        sink.log({"job_id": int(job_id), "key": key, "token": int(token), "attempt": attempt,
                  "worker": self.worker_name}, phase)


def worker_main(argv: list[str]) -> int:
    from raftcron.cluster.worker import JobError, PermanentError, Worker
    from raftcron.cluster.worker import runtime as worker_runtime

    parser = argparse.ArgumentParser(prog="python -m raftcron.chaos worker")
    parser.add_argument("--name", required=True)
    parser.add_argument("--urls", required=True)
    parser.add_argument("--sink", required=True, type=Path)
    parser.add_argument("--token", required=True)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    Sink(args.sink).close()  # the schema exists before the first job
    AckRecorder.sink_path, AckRecorder.worker_name = args.sink, args.name
    worker_runtime.AsyncClient = AckRecorder  # type: ignore[attr-defined]  # its client
    local = threading.local()
    worker = Worker(
        args.urls.split(","),
        queues=[QUEUE],
        concurrency=args.concurrency,
        name=args.name,
        lease_ms=LEASE_MS,
        wait_ms=1_000,
        drain_timeout_ms=2_000,
        token=args.token,
    )

    @worker.task(TASK)
    def effect(ctx: Any) -> dict[str, Any]:
        sink = getattr(local, "sink", None)
        if sink is None:
            sink = local.sink = Sink(args.sink)
        job = {
            "job_id": ctx.job_id,
            "key": ctx.key or f"job-{ctx.job_id}",
            "token": ctx.token,
            "attempt": ctx.attempt,
            "worker": args.name,
        }
        payload = ctx.payload if isinstance(ctx.payload, dict) else {}
        _ATTEMPTS[(job["job_id"], job["token"])] = (job["key"], job["attempt"])
        sink.log(job, "start")
        if payload.get("fail") == "permanent":
            sink.log(job, "failed")
            raise PermanentError("fails on purpose (chaos workload)")
        if ctx.attempt <= int(payload.get("fail_attempts", 0)):
            sink.log(job, "failed")
            raise JobError("fails on purpose, retryable (chaos workload)")
        # Like a real zombie, apply the effect even when the lease was lost meanwhile: the
        # sink's fencing must refuse what must be refused.
        ctx.wait_cancelled(int(payload.get("ms", 100)) / 1000)
        return {"effect": sink.apply(job)}

    return worker.run()


class WorkerPool:
    """Worker processes (`raftcron chaos worker`), each in its own process group."""

    def __init__(
        self, names: list[str], urls: list[str], folder: Path, sink: Path,
        net: Any, history: History,
    ) -> None:
        self.names = names
        self.urls = urls
        self.folder = folder
        self.sink = sink
        self.net = net
        self.history = history
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.paused: set[str] = set()
        self._logs: dict[str, Any] = {}

    def start(self, name: str) -> None:
        if self.running(name):
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        log = self._logs.get(name)
        if log is None:
            log = self._logs[name] = (self.folder / f"{name}.log").open("ab")
        prefix = self.net.exec_prefix(name) if isinstance(self.net, Namespaces) else []
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        from raftcron.chaos.tier2.nemesis import WORKER

        self.processes[name] = subprocess.Popen(
            [*prefix, sys.executable, "-m", "raftcron.chaos", "worker", "--name", name,
             "--urls", ",".join(self.urls), "--sink", str(self.sink), "--token", WORKER],
            cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.paused.discard(name)
        self.history.record("worker", op="start", name=name, pid=self.processes[name].pid)

    def running(self, name: str) -> bool:
        process = self.processes.get(name)
        return process is not None and process.poll() is None

    def _signal(self, name: str, sig: int) -> None:
        process = self.processes.get(name)
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)

    def kill(self, name: str) -> None:
        self._signal(name, signal.SIGCONT)
        self._signal(name, signal.SIGKILL)
        process = self.processes.get(name)
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        self.paused.discard(name)

    def pause(self, name: str) -> None:
        self._signal(name, signal.SIGSTOP)
        self.paused.add(name)

    def resume(self, name: str) -> None:
        if name in self.paused:
            self._signal(name, signal.SIGCONT)
            self.paused.discard(name)

    def busy_worker(self, rng: random.Random) -> str | None:
        """A running worker that has a job in hand now (per the sink), if any."""
        rows = read_sink(self.sink)[-400:]
        open_jobs: dict[tuple[int, int], str] = {}
        for row in rows:
            ident = (row["job_id"], row["token"])
            if row["phase"] == "start":
                open_jobs[ident] = row["worker"]
            else:
                open_jobs.pop(ident, None)
        busy = sorted({w for w in open_jobs.values() if self.running(w) and w not in self.paused})
        return rng.choice(busy) if busy else None

    def close(self) -> None:
        for name in list(self.processes):
            self.kill(name)
        for log in self._logs.values():
            log.close()
        self._logs.clear()
