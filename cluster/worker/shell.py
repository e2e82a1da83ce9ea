"""The built-in `shell` task: run a command, capture its output, exit code 0 = success.

Payload: `{"argv": ["cmd", "arg", ...], "env": {"NAME": "value"}, "timeout_ms": 60000,
"cwd": "/some/dir"}` (only `argv` is required; other fields are left for the command, which
gets the whole payload as JSON on its stdin).

Whoever may submit a job to a queue this task is served on runs commands on the worker, so a
worker serves it only when asked (`raftcron worker --allow-shell`). The command's environment
is NOT the worker's: it holds only `SHELL_ENV_ALLOWED` (`PATH`, `HOME`, `LANG`) and the names
the worker was given (`--shell-env`; never a `RAFTCRON_*` name, which are the worker's own
settings, its API token among them), then the payload's `env`, then `RAFTCRON_JOB_ID`,
`RAFTCRON_JOB_KEY`, `RAFTCRON_ATTEMPT`, `RAFTCRON_TOKEN` (the job's fencing token),
`RAFTCRON_SCHEDULE` and `RAFTCRON_FIRE_TIME_MS` (empty when the job has none). Nor can it read
the worker's environment from /proc/$PPID/environ: a worker serving it makes its /proc files
root's (`hide_from_commands`).

The result is `{"exit_code", "stdout", "stderr", "stdout_bytes", "stderr_bytes", "truncated",
"duration_ms"}`: each stream keeps its LAST bytes (at most `STREAM_BYTES_MAX` as UTF-8), so
the result always fits the cluster's 64 KiB limit; `*_bytes` count everything written. A
non-zero exit fails the attempt (retryable) with the exit code and the end of stderr. A bad
payload or a command that cannot be started fails it for good (`PermanentError`).

The command runs in its own session (process group): a timeout, a lost lease or a cancelled
job kills the whole group, SIGTERM first and SIGKILL `KILL_GRACE_S` later. The command must
not outlive its job: a background child that keeps the output pipes open is killed too.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from raftcron.cluster.worker.context import JobContext
from raftcron.cluster.worker.tasks import JobError, PermanentError

SHELL_TASK = "shell"
STREAM_BYTES_MAX = 24 * 1024  # per stream, as UTF-8: two streams stay under 64 KiB
READ_CHUNK_BYTES = 64 * 1024
KILL_GRACE_S = 2.0
PIPES_GRACE_S = 1.0  # after the command exits, how long its pipes may stay open
EXIT_POLL_S = 0.1  # while the pipes are open, how often to look for the command's exit
ARGV_ITEMS_MAX = 10_000
SHELL_ENV_ALLOWED = ("PATH", "HOME", "LANG")
PR_SET_DUMPABLE = 4  # <linux/prctl.h>
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ShellFailed(JobError):
    """The command ran and failed (non-zero exit, killed, timed out): retryable."""


@dataclass(frozen=True)
class ShellSpec:
    argv: tuple[str, ...]
    env: dict[str, str]
    timeout_ms: int | None
    cwd: str | None

    @classmethod
    def parse(cls, payload: Any) -> ShellSpec:
        if not isinstance(payload, dict):
            raise PermanentError('shell: the payload must be an object with "argv"')
        argv = payload.get("argv")
        if (
            not isinstance(argv, list)
            or not argv
            or len(argv) > ARGV_ITEMS_MAX
            or not all(isinstance(item, str) for item in argv)
        ):
            raise PermanentError('shell: "argv" must be a non-empty array of strings')
        env = payload.get("env") or {}
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k for k, v in env.items()
        ):
            raise PermanentError('shell: "env" must map variable names to strings')
        timeout_ms = payload.get("timeout_ms")
        if timeout_ms is not None and (
            isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 1
        ):
            raise PermanentError('shell: "timeout_ms" must be a positive integer')
        cwd = payload.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise PermanentError('shell: "cwd" must be a string')
        return cls(tuple(argv), dict(env), timeout_ms, cwd)


def shell_env_names(names: Sequence[str]) -> tuple[str, ...]:
    """The names a worker passes on to shell commands, validated (ValueError names the bad one)."""
    for name in names:
        if not _ENV_NAME_RE.match(name):
            raise ValueError(f"--shell-env: {name!r} is not an environment variable name")
        if name.upper().startswith("RAFTCRON_"):
            raise ValueError(f"--shell-env: {name!r} is a raftcron setting; it is never passed on")
    return tuple(dict.fromkeys((*SHELL_ENV_ALLOWED, *names)))


def job_environment(
    ctx: JobContext, extra: dict[str, str], passed: Sequence[str] = SHELL_ENV_ALLOWED
) -> dict[str, str]:
    env = {name: os.environ[name] for name in passed if name in os.environ}
    env.update(extra)
    env.update(
        {
            "RAFTCRON_JOB_ID": str(ctx.job_id),
            "RAFTCRON_JOB_KEY": ctx.key or "",
            "RAFTCRON_ATTEMPT": str(ctx.attempt),
            "RAFTCRON_TOKEN": str(ctx.token),
            "RAFTCRON_SCHEDULE": ctx.schedule or "",
            "RAFTCRON_FIRE_TIME_MS": "" if ctx.fire_time_ms is None else str(ctx.fire_time_ms),
        }
    )
    return env


class Tail:
    """The last `bytes_max` bytes written to a stream, and how many were written in all."""

    def __init__(self, bytes_max: int = STREAM_BYTES_MAX) -> None:
        self.bytes_max = bytes_max
        self.data = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.data += chunk
        if len(self.data) > self.bytes_max:
            del self.data[: len(self.data) - self.bytes_max]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)

    def text(self) -> str:
        """Decoded text of at most `bytes_max` bytes as UTF-8 (bad bytes become U+FFFD)."""
        text = bytes(self.data).decode("utf-8", errors="replace")
        encoded = text.encode("utf-8")
        if len(encoded) > self.bytes_max:
            text = encoded[-self.bytes_max :].decode("utf-8", errors="ignore")
        return text


def hide_from_commands() -> bool:
    """Make this process's /proc files readable by root only (PR_SET_DUMPABLE 0), so a command
    it starts cannot read the worker's token from `/proc/$PPID/environ` (a clean environment
    for the child is not enough: the parent's own environment stays readable by its user).
    Its command line stays readable by everyone, as any process's is: pass the token in the
    environment or a file, never as `--api-token`. Root is not held back by it: a worker
    running as root cannot hide anything from its commands. True when it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def shell_task(passed_env: Sequence[str] = ()) -> Callable[[JobContext], Awaitable[Any]]:
    """The `shell` handler of a worker that passes on `passed_env` besides the allowed names.
    The process serving it is hidden from its commands (`hide_from_commands`)."""
    passed = shell_env_names(passed_env)
    hide_from_commands()

    async def shell(ctx: JobContext) -> dict[str, Any]:
        return await run_shell(ctx, passed)

    return shell


async def run_shell(ctx: JobContext, passed: Sequence[str] = SHELL_ENV_ALLOWED) -> dict[str, Any]:
    """Run one shell job; `passed`: the worker's variables its command sees."""
    spec = ShellSpec.parse(ctx.payload)
    started = time.monotonic()
    try:
        process = await asyncio.create_subprocess_exec(
            *spec.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=job_environment(ctx, spec.env, passed),
            cwd=spec.cwd,
            start_new_session=True,
        )
    except OSError as error:
        raise PermanentError(f"shell: cannot start {spec.argv[0]!r}: {error}") from None
    out, err = Tail(), Tail()
    try:
        async with asyncio.timeout(None if spec.timeout_ms is None else spec.timeout_ms / 1000):
            await _communicate(process, json.dumps(ctx.payload).encode(), out, err)
    except TimeoutError:
        await kill_group(process)
        raise ShellFailed(
            f"timed out after {spec.timeout_ms} ms (payload timeout_ms){_tail_note(err)}"
        ) from None
    except BaseException:
        await kill_group(process)  # cancelled: lease lost, job timeout, worker stopping
        raise
    code = process.returncode
    assert code is not None
    if code != 0:
        raise ShellFailed(f"{_exit_text(code)}{_tail_note(err)}")
    return {
        "exit_code": code,
        "stdout": out.text(),
        "stderr": err.text(),
        "stdout_bytes": out.total,
        "stderr_bytes": err.total,
        "truncated": out.truncated or err.truncated,
        "duration_ms": int((time.monotonic() - started) * 1000),
    }


async def _communicate(
    process: asyncio.subprocess.Process, stdin: bytes, out: Tail, err: Tail
) -> None:
    assert process.stdin and process.stdout and process.stderr
    readers = [
        asyncio.create_task(_read(process.stdout, out)),
        asyncio.create_task(_read(process.stderr, err)),
    ]
    try:
        await _feed(process.stdin, stdin)
        # The pipes close when the command and every child holding them end. `wait()` would
        # wait for the pipes too, so the command's own exit is noticed from its return code.
        pending: set[asyncio.Task[None]] = set(readers)
        while pending and process.returncode is None:
            _done, pending = await asyncio.wait(pending, timeout=EXIT_POLL_S)
        if pending:
            # A background child holds the pipes open: give it a moment, then end the group.
            _done, pending = await asyncio.wait(pending, timeout=PIPES_GRACE_S)
            if pending:
                await kill_group(process)
                await asyncio.wait(pending, timeout=PIPES_GRACE_S)
        await process.wait()
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


async def _feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    # A command that never reads stdin must not make us fail or hang.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.write(data)
        await pipe.drain()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.close()
        await pipe.wait_closed()


async def _read(stream: asyncio.StreamReader, tail: Tail) -> None:
    while chunk := await stream.read(READ_CHUNK_BYTES):
        tail.feed(chunk)


async def kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGTERM the command's process group, SIGKILL it after KILL_GRACE_S; reap the command."""
    _signal_group(process, signal.SIGTERM)
    if process.returncode is None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(process.wait()), KILL_GRACE_S)
    # Children that ignored SIGTERM (or the whole group, if the leader is gone) get SIGKILL.
    _signal_group(process, signal.SIGKILL)
    if process.returncode is None:
        await process.wait()


def _signal_group(process: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exit code {code}"


def _tail_note(err: Tail) -> str:
    text = err.text().strip()
    return f"\n--- stderr (end) ---\n{text[-3000:]}" if text else ""
