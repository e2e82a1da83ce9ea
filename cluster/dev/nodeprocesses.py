"""The processes of a local cluster's nodes: each node's record, and its process's life.

What it owns: `LocalNode` (a node's addresses, files and process), and `NodeProcesses`, the
base of `localcluster.LocalCluster`: starting each node as `raftcron node` in its own process
group with its output appended to its log file, delivering signals (kill, pause, resume, stop,
restart, whole-cluster stop and kill), reaping, telling a crash from an exit the harness caused,
and reading the node logs (tracebacks are `nodelogs`').

Rules it keeps: every process it started is killed by `close()`, which runs on context exit and
at interpreter exit, and continues a paused process first so that nothing is left stopped; every
wait for an exit is bounded. It never touches a process it did not start. What a node is
configured with, and what the cluster answers over HTTP, are `localcluster`'s.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Self

from raftcron.cluster import configenv
from raftcron.cluster.dev.loopback import release_ports
from raftcron.cluster.dev.nodelogs import thread_stacks, tracebacks

REPO_ROOT = Path(__file__).resolve().parents[2]
STOP_TIMEOUT_S = 10.0

class ClusterError(Exception):
    """The local cluster did not reach the state a caller waited for (with the reason)."""


@dataclass
class LocalNode:
    node_id: str
    raft_address: str
    http_address: str
    config_path: Path
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    tls: bool = False  # the node serves HTTPS
    starts: int = 0  # how many times this node was started
    expected_exit: bool = False  # the harness killed or stopped it
    crash_reported: bool = False
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.http_address}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        """Started and not exited (a paused node is running)."""
        return self.process is not None and self.process.poll() is None

    @property
    def live(self) -> bool:
        """Running and not paused: it can answer requests."""
        return self.running and not self.paused

    @property
    def http_port(self) -> int:
        return int(self.http_address.rsplit(":", 1)[1])

    @property
    def raft_port(self) -> int:
        return int(self.raft_address.rsplit(":", 1)[1])




class NodeProcesses:
    """The node processes of one local cluster under `base_dir`; `LocalCluster` adds their
    configs, the waits and HTTP. `nodes` is filled by the subclass (`LocalCluster.configure`)."""

    def __init__(self, base_dir: Path, *, python: str = sys.executable,
                 env: dict[str, str] | None = None) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.python = python
        self.env = dict(env or {})
        self.nodes: list[LocalNode] = []
        self.retired: list[LocalNode] = []  # removed from the cluster (cluster/dev/joining.py)
        self.closed = False
        atexit.register(self.close)

    # -- context manager -------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- processes -------------------------------------------------------------------------

    def start_node(self, node: LocalNode) -> None:
        """Start one node in its own process group, appending its output to its log file."""
        self._check_open()
        if node.running:
            raise ClusterError(f"{node.node_id} is already running (pid {node.pid})")
        self._close_log(node)
        node.log_path.parent.mkdir(parents=True, exist_ok=True)
        node._log_file = node.log_path.open("ab")
        node.starts += 1
        node._log_file.write(f"--- harness: start #{node.starts} of {node.node_id}\n".encode())
        node._log_file.flush()
        node.process = subprocess.Popen(
            self.command(node),
            cwd=REPO_ROOT,
            env=self._environment(),
            stdin=subprocess.DEVNULL,
            stdout=node._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: signals reach its forks too
        )
        node.paused = False
        node.expected_exit = False
        node.crash_reported = False

    def command(self, node: LocalNode) -> list[str]:
        config = str(node.config_path)
        return [self.python, "-m", "raftcron.cluster.commandline", "node", "--config", config]

    def _environment(self) -> dict[str, str]:
        # The config is the file this harness wrote: a RAFTCRON_* config variable of the
        # caller's shell would be refused beside it (or change it), so only the variables the
        # project uses for other purposes pass through, and those given as `env`.
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(configenv.PREFIX) or name in configenv.OTHER_USES}
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env)
        return env

    def send_signal(self, node: LocalNode, sig: int) -> None:
        """Send a signal to the node's process group (the node and any fork it made)."""
        if node.process is None or node.process.poll() is not None:
            raise ClusterError(f"{node.node_id} is not running")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.process.pid, sig)

    def kill(self, node: LocalNode, sig: int = signal.SIGKILL) -> None:
        """Kill a node (SIGKILL by default) and reap it; a paused node is continued first."""
        if not node.running:
            return
        node.expected_exit = True
        if node.paused and sig != signal.SIGKILL:
            self.resume(node)
        self.send_signal(node, sig)
        if sig == signal.SIGKILL:
            self._reap(node, STOP_TIMEOUT_S)
            node.paused = False

    def pause(self, node: LocalNode) -> None:
        """SIGSTOP: the node keeps its sockets but answers nothing until resumed."""
        self.send_signal(node, signal.SIGSTOP)
        node.paused = True

    def resume(self, node: LocalNode) -> None:
        """SIGCONT a paused node."""
        self.send_signal(node, signal.SIGCONT)
        node.paused = False

    def stop(self, node: LocalNode, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM and wait for a clean exit (SIGKILL after timeout_s); the exit code."""
        if not node.running:
            return None if node.process is None else node.process.returncode
        node.expected_exit = True
        if node.paused:
            self.resume(node)
        self.send_signal(node, signal.SIGTERM)
        process = node.process
        assert process is not None
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            # Its threads' stacks into its log first (the node dumps them on SIGUSR1:
            # cluster/node.py, dump_stacks): a stop that hangs then says where.
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(1.0)
            self.kill(node)
            self._close_log(node)
            stacks = thread_stacks(self.log_lines(node)) or "(none in its log)"
            raise ClusterError(
                f"{node.node_id} did not exit within {timeout_s:g} s of SIGTERM; killed. "
                f"Its threads' stacks (from {node.log_path}):\n{stacks}"
            ) from None
        finally:
            self._close_log(node)

    def restart(self, node: LocalNode, *, sig: int = signal.SIGKILL) -> None:
        """Kill (SIGKILL by default, or stop cleanly with SIGTERM) a running node, start it."""
        if node.running:
            if sig == signal.SIGTERM:
                self.stop(node)
            else:
                self.kill(node, sig)
        self.start_node(node)

    def stop_all(self) -> None:
        """SIGTERM every running node at once, then wait for each (SIGKILL stragglers)."""
        running = [node for node in self.nodes if node.running]
        for node in running:
            node.expected_exit = True
            if node.paused:
                self.resume(node)
            self.send_signal(node, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for node in running:
            self._reap(node, max(0.1, deadline - time.monotonic()))

    def kill_all(self) -> None:
        """SIGKILL every running node (a whole-cluster crash)."""
        for node in self.nodes:
            self.kill(node)

    def _reap(self, node: LocalNode, timeout_s: float) -> None:
        assert node.process is not None
        try:
            node.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.process.pid, signal.SIGCONT)
                os.killpg(node.process.pid, signal.SIGKILL)
            node.process.wait(STOP_TIMEOUT_S)
        self._close_log(node)

    def _close_log(self, node: LocalNode) -> None:
        if node._log_file is not None:
            node._log_file.close()
            node._log_file = None

    def close(self) -> None:
        """Kill every process this cluster started (continue, then SIGKILL). Idempotent."""
        if self.closed:
            return
        self.closed = True
        for node in self.nodes + self.retired:
            process = node.process
            if process is not None and process.poll() is None:
                node.expected_exit = True
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, sig)
            if process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(STOP_TIMEOUT_S)
            node.paused = False
            self._close_log(node)
        release_ports([int(address.rpartition(":")[2]) for node in self.nodes
                       for address in (node.raft_address, node.http_address)])
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)

    def _check_open(self) -> None:
        if self.closed:
            raise ClusterError("this LocalCluster is closed")

    # -- lookups ---------------------------------------------------------------------------

    def node(self, node_id: str) -> LocalNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(node_id)

    def crashed_nodes(self) -> list[LocalNode]:
        """Nodes that exited without the harness killing or stopping them."""
        return [
            node
            for node in self.nodes
            if node.process is not None
            and node.process.poll() is not None
            and not node.expected_exit
        ]

    def live_nodes(self) -> list[LocalNode]:
        return [node for node in self.nodes if node.live]

    def _live_or_raise(self) -> list[LocalNode]:
        """The live nodes; a node that exited on its own is an error worth reporting now."""
        for node in self.crashed_nodes():
            if not node.crash_reported:
                node.crash_reported = True
                self._close_log(node)
                tail = "\n".join(self.log_lines(node)[-20:])
                assert node.process is not None
                raise ClusterError(
                    f"{node.node_id} exited by itself with code {node.process.returncode}; "
                    f"log tail:\n{tail}"
                )
        return self.live_nodes()

    # -- logs ------------------------------------------------------------------------------

    def log_lines(self, node: LocalNode) -> list[str]:
        try:
            return node.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []

    def scan_logs(self, pattern: str | re.Pattern[str]) -> list[str]:
        """Every log line (of every node) matching the regex, as "node_id: line"."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        return [
            f"{node.node_id}: {line}"
            for node in self.nodes
            for line in self.log_lines(node)
            if regex.search(line)
        ]

    def tracebacks(self, *, ours_only: bool = True) -> list[str]:
        """Every traceback in the node logs (see `tracebacks`), as "node_id: traceback"."""
        return [
            f"{node.node_id}: {trace}"
            for node in self.nodes
            for trace in tracebacks(self.log_lines(node), ours_only=ours_only)
        ]

