"""The built-in shell task on its own: environment, stdin, capped output, exit codes,
timeouts that kill the whole process group, and payloads it refuses."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from raftcron.cluster.worker import JobContext, PermanentError
from raftcron.cluster.worker.shell import (
    STREAM_BYTES_MAX,
    ShellFailed,
    Tail,
    run_shell,
    shell_env_names,
    shell_task,
)
from raftcron.scheduler import limits, parse

pytestmark = pytest.mark.processes  # starts processes: make integration


async def _no_heartbeat(lease_ms: int | None) -> bool:
    return True


def shell(payload: Any, passed_env: tuple[str, ...] | None = None, **job: Any) -> dict[str, Any]:
    handler = run_shell if passed_env is None else shell_task(passed_env)

    async def main() -> dict[str, Any]:
        claimed = {"id": 7, "task": "shell", "token": 42, "attempt": 2, "payload": payload}
        claimed.update(job)
        ctx = JobContext(
            claimed,
            worker="w1",
            lease_ms=30_000,
            loop=asyncio.get_running_loop(),
            heartbeat=_no_heartbeat,
        )
        result: dict[str, Any] = await handler(ctx)
        return result

    return asyncio.run(main())


def test_the_command_gets_the_job_in_its_environment_and_the_payload_on_stdin() -> None:
    script = (
        "import json, os, sys; "
        "print(json.dumps({'env': dict(os.environ), 'stdin': sys.stdin.read()}))"
    )
    payload = {"argv": [sys.executable, "-c", script], "env": {"GREETING": "hi"}, "extra": [1]}
    result = shell(payload, key="report@1", schedule="report", fire_time_ms=1_000)
    seen = json.loads(result["stdout"])
    env = seen["env"]
    assert env["RAFTCRON_JOB_ID"] == "7" and env["RAFTCRON_TOKEN"] == "42"
    assert env["RAFTCRON_ATTEMPT"] == "2" and env["RAFTCRON_JOB_KEY"] == "report@1"
    assert env["RAFTCRON_SCHEDULE"] == "report" and env["RAFTCRON_FIRE_TIME_MS"] == "1000"
    assert env["GREETING"] == "hi"
    assert json.loads(seen["stdin"]) == payload
    assert result["exit_code"] == 0 and result["truncated"] is False


def test_a_job_without_key_or_schedule_gets_empty_variables() -> None:
    result = shell({"argv": ["sh", "-c", 'echo "[$RAFTCRON_JOB_KEY|$RAFTCRON_SCHEDULE]"']})
    assert result["stdout"] == "[|]\n"


def test_huge_output_is_capped_to_its_end_and_the_result_fits_the_cluster_limit() -> None:
    # 1 MB of stdout and of invalid UTF-8 on stderr (each bad byte decodes to 3 bytes).
    script = (
        "import sys; sys.stdout.write('a' * 1_000_000 + 'END'); "
        "sys.stderr.buffer.write(bytes([0xff]) * 200_000)"
    )
    result = shell({"argv": [sys.executable, "-c", script]})
    assert result["stdout"].endswith("aaaEND") and len(result["stdout"]) == STREAM_BYTES_MAX
    assert result["stdout_bytes"] == 1_000_003 and result["stderr_bytes"] == 200_000
    assert result["truncated"] is True
    assert len(result["stderr"].encode()) <= STREAM_BYTES_MAX
    parse.json_value(result, "result", bytes_max=limits.RESULT_BYTES_MAX)  # does not raise


def test_a_non_zero_exit_fails_with_the_code_and_the_end_of_stderr() -> None:
    with pytest.raises(ShellFailed) as failure:
        shell({"argv": ["sh", "-c", "echo 'disk full' >&2; exit 3"]})
    assert str(failure.value).startswith("exit code 3")
    assert "disk full" in str(failure.value)


def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    # The command starts a background child that would outlive it; both must die.
    command = f"sleep 60 & echo $! > {pid_file}; wait"
    started = time.monotonic()
    with pytest.raises(ShellFailed, match="timed out after 300 ms"):
        shell({"argv": ["sh", "-c", command], "timeout_ms": 300})
    assert time.monotonic() - started < 10
    child = int(pid_file.read_text())
    assert not _alive(child)


def test_a_background_child_holding_the_pipes_does_not_hang_the_job(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    result = shell({"argv": ["sh", "-c", f"sleep 60 & echo $! > {pid_file}; echo parent done"]})
    assert result["stdout"] == "parent done\n"
    assert not _alive(int(pid_file.read_text()))


def test_a_command_that_ignores_stdin_still_succeeds() -> None:
    big = {"argv": ["true"], "blob": "z" * 200_000}
    assert shell(big)["exit_code"] == 0


@pytest.mark.parametrize(
    "payload",
    [
        None,
        {"argv": []},
        {"argv": "echo hi"},
        {"argv": ["echo", 1]},
        {"argv": ["echo"], "env": {"A": 1}},
        {"argv": ["echo"], "timeout_ms": 0},
        {"argv": ["/no/such/program"]},
    ],
)
def test_bad_payloads_and_missing_programs_fail_for_good(payload: Any) -> None:
    with pytest.raises(PermanentError):
        shell(payload)


def test_tail_keeps_the_last_bytes_and_counts_all() -> None:
    tail = Tail(bytes_max=4)
    for chunk in (b"ab", b"cdef", b"g"):
        tail.feed(chunk)
    assert tail.text() == "defg" and tail.total == 7 and tail.truncated


def _alive(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # It may be a zombie of a reaped group for a moment: look at its state.
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except (FileNotFoundError, IndexError):
            return False
        if state == "Z":
            return False
        time.sleep(0.02)
    return True


ENV_SCRIPT = "import json, os; print(json.dumps(dict(os.environ)))"
JOB_VARIABLES = {"RAFTCRON_JOB_ID", "RAFTCRON_JOB_KEY", "RAFTCRON_ATTEMPT", "RAFTCRON_TOKEN",
                 "RAFTCRON_SCHEDULE", "RAFTCRON_FIRE_TIME_MS"}


def test_the_command_sees_none_of_the_workers_environment_but_the_allowed_names(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAFTCRON_API_TOKEN", "worker-secret-token")
    monkeypatch.setenv("RAFTCRON_CONNECT", "http://10.0.0.1:8001")
    monkeypatch.setenv("DATABASE_URL", "postgres://user:pw@db/app")
    monkeypatch.setenv("LANG", "C.UTF-8")
    result = shell({"argv": [sys.executable, "-c", ENV_SCRIPT], "env": {"MINE": "1"}},
                   passed_env=())
    env = json.loads(result["stdout"])
    assert set(env) <= {"PATH", "HOME", "LANG", "MINE", "LC_CTYPE"} | JOB_VARIABLES, env
    assert env["PATH"] == os.environ["PATH"] and env["LANG"] == "C.UTF-8"
    assert "worker-secret-token" not in result["stdout"]
    assert "DATABASE_URL" not in env and "RAFTCRON_CONNECT" not in env


def test_shell_env_passes_the_names_it_lists_and_refuses_raftcron_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://db/app")
    env = json.loads(shell({"argv": [sys.executable, "-c", ENV_SCRIPT]},
                           passed_env=("DATABASE_URL",))["stdout"])
    assert env["DATABASE_URL"] == "postgres://db/app"
    for bad in ("RAFTCRON_API_TOKEN", "raftcron_connect", "A-B", "", "1X"):
        with pytest.raises(ValueError, match="--shell-env"):
            shell_env_names([bad])


_WORKER_AS = """
import asyncio, ctypes, os, sys
from raftcron.cluster.worker import JobContext
from raftcron.cluster.worker.shell import run_shell, shell_task
hidden, uid = sys.argv[1] == "hidden", int(sys.argv[2])
if uid:  # a worker running as its own user (a change of user leaves a process non-dumpable;
    os.setgid(uid)  # one started as that user is dumpable)
    os.setuid(uid)
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)
handler = shell_task() if hidden else run_shell  # shell_task is what a worker serves
async def no_heartbeat(lease_ms):
    return True
async def main():
    script = 'tr "\\\\0" "\\\\n" < /proc/$PPID/environ; echo "environ: $?"'
    claimed = {"id": 7, "task": "shell", "token": 42, "attempt": 1,
               "payload": {"argv": ["sh", "-c", script]}}
    ctx = JobContext(claimed, worker="w1", lease_ms=30_000, loop=asyncio.get_running_loop(),
                     heartbeat=no_heartbeat)
    print((await handler(ctx))["stdout"])
asyncio.run(main())
"""


@pytest.mark.parametrize("hidden", [True, False], ids=["worker", "unhidden-self-test"])
def test_a_command_cannot_read_the_workers_token_from_the_workers_proc_files(
    hidden: bool,
) -> None:
    """The command's environment is clean, but its worker's own is a file away: a command of
    the worker's user read RAFTCRON_API_TOKEN from /proc/$PPID/environ until the worker made
    its /proc files root's (PR_SET_DUMPABLE 0). As root (which reads them anyway) the worker
    here runs as nobody, as a worker should; the self-test shows the read works without it."""
    import subprocess

    uid = 65534 if os.geteuid() == 0 else 0
    done = subprocess.run(
        [sys.executable, "-c", _WORKER_AS, "hidden" if hidden else "plain", str(uid)],
        env={**os.environ, "RAFTCRON_API_TOKEN": "wrk-secret-token-123",
             "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    if hidden:
        assert "wrk-secret-token-123" not in done.stdout and "environ: 0" not in done.stdout
    else:
        assert "RAFTCRON_API_TOKEN=wrk-secret-token-123" in done.stdout
