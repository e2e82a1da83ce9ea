"""A real `raftcron node` process for API tests: a 1-node cluster on loopback.

Each node gets free ports, its own data dir and log file, and API tokens for every role, so
tests see auth exactly as a deployment does. `stop()` always ends the process (SIGTERM, then
SIGKILL), and on Linux the node also dies with the test process (PR_SET_PDEATHSIG), so a
killed test run leaves no node behind. Nothing here sleeps without a condition and a deadline.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TOKENS = {
    "admin": "test-admin-token",
    "submit": "test-submit-token",
    "worker": "test-worker-token",
    "read": "test-read-token",
}
NO_BODY = object()


def wait_until(condition: Callable[[], Any], *, deadline_s: float, what: str) -> Any:
    """Poll `condition` until it returns something truthy; TimeoutError after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
        except (OSError, http.client.HTTPException) as error:
            last_error, value = error, None
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"not within {deadline_s} s: {what} (last error: {last_error})")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(repr=False)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def media_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip()

    def __repr__(self) -> str:
        return f"<{self.status} {self.body[:500]!r}>"


@dataclass
class LiveNode:
    directory: Path
    http_port: int
    raft_port: int
    extra_config: str = ""  # more TOML (peers, [raft] tuning), after the base keys
    log_name: str = "node.log"
    process: subprocess.Popen[bytes] | None = None  # None: a node some other harness runs

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def log_path(self) -> Path:
        return self.directory / self.log_name

    def request(
        self,
        method: str,
        path: str,
        body: Any = NO_BODY,
        *,
        role: str | None = "admin",
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
        timeout_s: float = 40.0,
    ) -> Reply:
        """One HTTP request; `body` is sent as JSON, `raw` as given; `role` picks the token."""
        sent = dict(headers or {})
        if role is not None:
            sent.setdefault("Authorization", f"Bearer {TOKENS[role]}")
        data = raw
        if body is not NO_BODY:
            data = json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
        connection = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout_s)
        try:
            connection.request(method, path, body=data, headers=sent)
            response = connection.getresponse()
            payload = response.read()
            got = {name.lower(): value for name, value in response.getheaders()}
            return Reply(response.status, got, payload)
        finally:
            connection.close()

    def is_ready(self) -> bool:
        return self.request("GET", "/readyz", role=None, timeout_s=2).status == 200

    def is_running(self) -> bool:
        """Our process is alive (a node run by another harness: it serves HTTP)."""
        if self.process is None:
            try:
                return self.is_serving()
            except (OSError, http.client.HTTPException):
                return False
        return self.process.poll() is None

    def is_serving(self) -> bool:
        return self.request("GET", "/healthz", role=None, timeout_s=2).status == 200

    def start(self, *, until_ready: bool = True) -> LiveNode:
        """Start the process; wait until /readyz says ready (or, if not `until_ready`, until
        it serves HTTP at all: a node without a leader is never ready)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "node.toml"
        config.write_text(self._config_text())
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "raftcron.cluster.commandline", "node", "--config",
                 str(config)],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        started = self.is_ready if until_ready else self.is_serving
        try:
            wait_until(
                lambda: not self.is_running() or started(),
                deadline_s=30,
                what=f"node at {self.base_url} {'ready' if until_ready else 'serving'}",
            )
        except TimeoutError:
            self.stop()
            raise
        if not self.is_running():
            raise RuntimeError(f"the node exited at start:\n{self.log_tail()}")
        return self

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def log_records(self) -> list[dict[str, Any]]:
        """The node's JSON log lines (other lines, such as a crash dump, are left out)."""
        records = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records

    def errors_logged(self) -> list[dict[str, Any]]:
        levels = ("error", "critical")
        return [r for r in self.log_records() if r.get("level") in levels]

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _config_text(self) -> str:
        tokens = ", ".join(f'"{token}" = "{role}"' for role, token in TOKENS.items())
        return "\n".join(
            [
                'node_id = "n1"',
                f'raft_address = "127.0.0.1:{self.raft_port}"',
                f'http_address = "127.0.0.1:{self.http_port}"',
                'data_dir = "data"',
                'log_level = "info"',
                self.extra_config,
                "[api]",
                f"tokens = {{ {tokens} }}",
                "",
            ]
        )


def start_node(directory: Path) -> LiveNode:
    return LiveNode(directory, http_port=free_port(), raft_port=free_port()).start()


def start_leaderless_node(directory: Path) -> LiveNode:
    """A node whose two peers never come: it serves HTTP but never has a leader."""
    peers = "\n".join(
        f'[[peers]]\nnode_id = "n{n}"\nraft_address = "127.0.0.1:{free_port()}"\n'
        f'http_address = "127.0.0.1:{free_port()}"'
        for n in (2, 3)
    )
    extra = f'cluster_password = "test-cluster-password"\n{peers}\n[raft]\ncommit_timeout_s = 1.0'
    node = LiveNode(directory, http_port=free_port(), raft_port=free_port(), extra_config=extra)
    return node.start(until_ready=False)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process dies (Linux only)."""
    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
