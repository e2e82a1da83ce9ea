"""Handlers the worker tests run (loaded with `--import sample_tasks`).

Handlers that wait do so on a file the test creates ("release") and on `ctx.cancelled`, each
bounded by a deadline, so no test depends on how long anything takes. Every handler that
starts writes a marker file `<job>.<token>.started` into the payload's `dir`, so a test can
see which attempts ran even when a worker died before reporting.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from raftcron.cluster.worker import JobContext, PermanentError, task

WAIT_S_MAX = 60.0


def _mark(ctx: JobContext, what: str) -> None:
    folder = (ctx.payload or {}).get("dir") if isinstance(ctx.payload, dict) else None
    if folder:
        Path(folder, f"{ctx.job_id}.{ctx.token}.{what}").write_text(ctx.worker)


def _identity(ctx: JobContext) -> dict[str, Any]:
    return {"worker": ctx.worker, "token": ctx.token, "attempt": ctx.attempt, "key": ctx.key}


@task("echo")
def echo(ctx: JobContext) -> dict[str, Any]:
    _mark(ctx, "started")
    return {"echo": ctx.payload, **_identity(ctx)}


def _parents(ctx: JobContext) -> dict[str, Any]:
    found = {name: ctx.upstream[name] for name in ctx.upstream}
    if isinstance(ctx.payload, dict) and ctx.payload.get("lengths"):
        return {name: len(value) for name, value in found.items()}  # results too big to return
    return found


@task("upstream")
def upstream(ctx: JobContext) -> dict[str, Any]:
    """A workflow child: its parents' results, as its handler reads them (`ctx.upstream`)."""
    return _parents(ctx)


@task("upstream-async")
async def upstream_async(ctx: JobContext) -> dict[str, Any]:
    return _parents(ctx)


@task("sized")
def sized(ctx: JobContext) -> str:
    """A result of `payload["bytes"]` characters (past the claim's cap, in numbers)."""
    return "r" * int(ctx.payload["bytes"])


@task("block")
def block(ctx: JobContext) -> dict[str, Any]:
    """Wait (in a thread) until the payload's `release` file exists; stop if cancelled."""
    _mark(ctx, "started")
    release = Path(ctx.payload["release"])
    deadline = time.monotonic() + WAIT_S_MAX
    while not release.exists() and time.monotonic() < deadline:
        if ctx.wait_cancelled(0.02):
            _mark(ctx, "cancelled")
            return {"cancelled": True}
    _mark(ctx, "released")
    return {"released": True, **_identity(ctx)}


@task("block-async")
async def block_async(ctx: JobContext) -> dict[str, Any]:
    """Like `block`, as a coroutine: a lost lease cancels it (the marker says so)."""
    _mark(ctx, "started")
    release = Path(ctx.payload["release"])
    deadline = time.monotonic() + WAIT_S_MAX
    try:
        while not release.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    except asyncio.CancelledError:
        _mark(ctx, "cancelled")
        raise
    return {"released": True, **_identity(ctx)}


@task("boom")
def boom(ctx: JobContext) -> None:
    _mark(ctx, "started")
    raise RuntimeError(f"boom on attempt {ctx.attempt}")


@task("permanent")
def permanent(ctx: JobContext) -> None:
    raise PermanentError("this input can never work")


@task("too-big")
def too_big(ctx: JobContext) -> str:
    return "x" * 100_000


@task("hold")
def hold(ctx: JobContext) -> dict[str, Any]:
    """Run for the payload's `ms`, and write `<job>.<token>.held` into its `dir`: the wall-clock
    start and end (Unix seconds), for tests that measure how many jobs ran at once."""
    started = time.time()
    time.sleep(min(ctx.payload.get("ms", 0), 10_000) / 1000)
    ended = time.time()
    Path(ctx.payload["dir"], f"{ctx.job_id}.{ctx.token}.held").write_text(f"{started} {ended}")
    return {"worker": ctx.worker}


@task("report-progress")
def report_progress(ctx: JobContext) -> dict[str, Any]:
    """Report step 1 of the payload's `total`, wait for its `release` file, then report the
    other steps one after another (far faster than one a second) and return."""
    total = int(ctx.payload["total"])
    ctx.progress({"done": 1, "total": total}, "step 1", {"started": ctx.attempt})
    release = Path(ctx.payload["release"])
    deadline = time.monotonic() + WAIT_S_MAX
    while not release.exists() and time.monotonic() < deadline:
        if ctx.wait_cancelled(0.02):
            return {"cancelled": True}
    for done in range(2, total + 1):
        ctx.progress({"done": done, "total": total}, f"step {done}")
    return {"steps": total}


@task("traced")
def traced(ctx: JobContext) -> dict[str, Any]:
    """A handler with a span of its own (tests/worker/test_traces_cluster.py): the worker runs
    it within the attempt's run span, so this one is that span's child."""
    from opentelemetry import trace

    with trace.get_tracer("sample_tasks").start_as_current_span("handler-work"):
        return _identity(ctx)
