"""The tier-2 smoke: real nodes and workers survive a killed leader, a leader whose main PID is
killed mid-snapshot, a follower whose log was damaged (it must refuse to start), a paused and
an isolated leader and a whole-cluster restart with zero safety violations
(`raftcron chaos run --smoke`).

As root with `ip`, the nodes live in network namespaces; elsewhere the partition goes through
the in-process relay: either way the partition is really injected, never skipped. The smoke
runs in its own process (it moves into a network namespace) and must finish within 5 minutes.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from raftcron.chaos.tier2.netns import Relay, leftover_namespaces, pick_ports

pytestmark = pytest.mark.processes  # starts processes: make integration

REPO = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 300


@pytest.mark.timeout(SMOKE_TIMEOUT_S + 30)
def test_the_smoke_run_finds_no_violation_and_leaves_nothing_behind(tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "raftcron.chaos", "run", "--smoke", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False,
    )
    elapsed = time.monotonic() - started
    print(done.stdout)
    print(done.stderr[-4000:], file=sys.stderr)
    assert done.returncode == 0, f"smoke failed (exit {done.returncode}):\n{done.stdout}"
    assert "smoke" in done.stdout and "total faults injected: 6" in done.stdout
    assert elapsed < SMOKE_TIMEOUT_S
    if os.geteuid() == 0 and shutil.which("ip"):
        assert leftover_namespaces() == []
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", "processes of the smoke run are still alive"


def _echo_server() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)


def _round_trip(port: int, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(b"ping")
            return sock.recv(4) == b"ping"
    except OSError:
        return False


def test_the_relay_fallback_forwards_cuts_and_heals() -> None:
    server, target = _echo_server()
    relay = Relay()
    try:
        [port] = pick_ports(1, 10_000, 19_999, set())
        relay.add("n2", "n1", ("127.0.0.1", target), port)
        relay.start()
        assert _round_trip(port)
        relay.isolate("n1")
        assert not _round_trip(port, timeout_s=0.5)  # connected, but nothing comes through
        relay.heal()
        deadline = time.monotonic() + 5
        while not _round_trip(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _round_trip(port)
        relay.drop("n1", "n2")  # one way: what n2 sends never reaches n1
        assert not _round_trip(port, timeout_s=0.5)
    finally:
        relay.close()
        server.close()


def _in_namespace(net: object, host: str, work: object) -> object:
    """Run `work()` on a thread that entered host's namespace (setns is per thread)."""
    from raftcron.chaos.tier2.netns import Namespaces, _setns

    assert isinstance(net, Namespaces)
    box: dict[str, object] = {}

    def target() -> None:
        _setns(f"/run/netns/{net.namespace(host)}")
        try:
            box["value"] = work()  # type: ignore[operator]
        except BaseException as error:  # handed to the caller
            box["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(10)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                    reason="namespaces need root and ip; the relay test covers this machine")
@pytest.mark.parametrize("iptables", ["1", "0"], ids=["iptables", "neighbour-entry"])
def test_namespaces_isolate_drop_and_heal(iptables: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from raftcron.chaos.tier2.netns import Namespaces

    if iptables == "1" and shutil.which("iptables") is None:
        pytest.skip("iptables not installed; the neighbour-entry variant runs instead")
    monkeypatch.setenv("CHAOS_NO_IPTABLES", "0" if iptables == "1" else "1")
    net = Namespaces(["n1", "n2"])
    try:
        net.create()
        listener = _in_namespace(net, "n1", lambda: socket.create_server((net.address("n1"), 7000)))
        assert isinstance(listener, socket.socket)
        threading.Thread(target=lambda: _serve_echo(listener), daemon=True).start()

        def reach() -> bool:
            try:
                with socket.create_connection((net.address("n1"), 7000), timeout=0.5) as sock:
                    sock.settimeout(0.5)
                    sock.sendall(b"ping")
                    return sock.recv(4) == b"ping"
            except OSError:
                return False

        def reached_within(seconds: float) -> bool:
            # A new or healed bridge port forwards after a moment, longer on a loaded machine
            # (one try of 0.5 s failed once in a fresh-clone CI, 30 of 30 passed alone).
            deadline = time.monotonic() + seconds
            while not _in_namespace(net, "n2", reach):
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.2)
            return True

        assert reached_within(10)
        net.drop("n1", "n2")
        assert not _in_namespace(net, "n2", reach)
        net.heal()
        assert reached_within(10)
        net.isolate("n2")
        assert not _in_namespace(net, "n2", reach)
        net.heal()
        assert reached_within(10)
        listener.close()
    finally:
        net.close()
    assert net.namespace("n1") not in leftover_namespaces()


def _serve_echo(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_echo, args=(conn,), daemon=True).start()
