"""The sicknet smoke: real nodes and workers under latency, stalled links, one-way loss and
resets (chaos/tier2/net_faults.py) keep every safety promise, and every kind of sickness is in
the history (`raftcron chaos run --scenario sicknet --minutes 0.75`, about a minute); and the
real packet loss the scenario uses inside namespaces costs TCP retransmission timeouts.

As root with `ip`, the nodes live in network namespaces with the sick relay in the harness's
namespace (loss is then real packet loss by iptables); elsewhere everything is on loopback.
Every checker must pass, the sick network's too: no leader change under 50 +- 25 ms of latency
nor while a link stalls (PreVote; before it, each stall cost a few).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from raftcron.chaos.tier2.checkers.network import SICK_FAULTS
from raftcron.chaos.tier2.netns import Namespaces, _setns, leftover_namespaces
from raftcron.chaos.tier2.sick_network import (
    RELAY_ADDRESS,
    add_relay_address,
    drop_at_random,
    undo_drop,
)

T = TypeVar("T")

pytestmark = pytest.mark.processes  # starts nodes and workers: make integration

REPO = Path(__file__).resolve().parents[2]
SMOKE_TIMEOUT_S = 150


@pytest.mark.timeout(SMOKE_TIMEOUT_S + 30)
def test_the_sicknet_smoke_keeps_every_safety_promise_under_each_sickness(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "raftcron.chaos", "run", "--scenario", "sicknet",
         "--minutes", "0.75", "--seed", "27", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False,
    )
    elapsed = time.monotonic() - started
    print(done.stdout)
    print(done.stderr[-3000:], file=sys.stderr)
    assert done.returncode == 0, f"sicknet failed (exit {done.returncode}):\n{done.stdout}"
    [results_path] = tmp_path.glob("*/sicknet/results.json")
    results = json.loads(results_path.read_text())
    assert results["error"] is None
    assert [r["name"] for r in results["results"] if r["safety"] and not r["ok"]] == []
    assert set(results["faults"]) == SICK_FAULTS
    history = [json.loads(line) for line in
               (results_path.parent / "history.jsonl").read_text().splitlines()]
    guard = [e for e in history if e["kind"] == "fault" and e.get("phase") == "start"
             and e.get("leader_changes_max") == 0]
    assert guard and guard[0]["delay_ms"] == 50 and guard[0]["jitter_ms"] == 25
    assert elapsed < SMOKE_TIMEOUT_S
    if os.geteuid() == 0 and shutil.which("ip"):
        assert leftover_namespaces() == []
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", "processes of the sicknet run are still alive"


def _on_thread_in(net: Namespaces, host: str, work: Callable[[], T]) -> T:
    """`work()` on a thread that entered host's namespace (setns is per thread)."""
    box: dict[str, Any] = {}

    def target() -> None:
        _setns(f"/run/netns/{net.namespace(host)}")
        try:
            box["value"] = work()
        except BaseException as error:  # handed to the caller
            box["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(60)
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _echo_forever(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(4096):
                conn.sendall(data)


def _round_trips_s(address: str, count: int) -> list[float]:
    """Seconds of each of `count` round trips to address:7000, from the relay's address."""
    times = []
    with socket.create_connection((address, 7000), timeout=10,
                                  source_address=(RELAY_ADDRESS, 0)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for index in range(count):
            message = b"r%04d" % index
            started = time.monotonic()
            sock.sendall(message)
            got = b""
            while len(got) < len(message):
                got += sock.recv(len(message) - len(got))
            assert got == message  # lost packets are retransmitted: the stream stays whole
            times.append(time.monotonic() - started)
    return times


def test_real_loss_in_the_namespaces_costs_retransmission_timeouts() -> None:
    # as CI and the development machines are: root, with iptables (never skipped there)
    assert os.geteuid() == 0, "real packet loss needs root (network namespaces)"
    assert shutil.which("iptables"), "real packet loss needs iptables: apt-get install iptables"
    net = Namespaces(["n1", "ctl"])
    try:
        net.create()
        add_relay_address(net)
        listener = _on_thread_in(
            net, "n1", lambda: socket.create_server((net.address("n1"), 7000)))
        threading.Thread(target=_echo_forever, args=(listener,), daemon=True).start()
        healthy = _on_thread_in(net, "ctl", lambda: _round_trips_s(net.address("n1"), 30))
        rule = drop_at_random(net, "n1", 0.3)  # n1's answers to the relay, 30 % lost
        lossy = _on_thread_in(net, "ctl", lambda: _round_trips_s(net.address("n1"), 30))
        undo_drop(rule)
        listener.close()
    finally:
        net.close()
    assert max(healthy) < 0.2, healthy
    slow = [t for t in lossy if t >= 0.2]  # Linux's minimum retransmission timeout
    assert 3 <= len(slow) <= 25, lossy
