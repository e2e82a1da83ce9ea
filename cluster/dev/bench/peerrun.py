"""Running the peers' drains (peers.py) and reading their figures.

What it owns: the prerequisites of a peer (node on PATH, its node_modules, its server), its
server's start and stop, running its program bounded in time with $BASELINE_RESULTS pointing at a
file of ours, and the figure read from the row the program appends there. A peer that cannot run
or fails gets a figure of None and the reason, never a number of ours. Nothing is installed: the
start scripts would `apt-get install` a missing server, so a missing one is a reason instead.

A server is started only when nothing answers on its port, and then stopped again by its stop
script, also when a peer or the start failed (a half-started server is not left behind). Every
process started here runs in its own process group and is killed by that group's id if it
outlives its bound.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from raftcron.cluster.dev.bench.peers import PEERS, PeerDrain, Server

START_S = 300.0  # pg_start.sh's first start runs initdb
STOP_S = 120.0
TAIL_CHARS = 400  # of a failed script's or program's output, in the reason


def timeout_s(jobs: int, repeats: int) -> float:
    """A bound on one peer's program: each repeat pre-fills, drains and resets. Far above what
    the peers take (5,000-60,000 jobs/s): it stops a hung program, not a slow one."""
    return 120.0 + repeats * max(120.0, jobs / 200)


def measure(
    folder: Path,
    *,
    jobs: int,
    repeats: int,
    peers: tuple[PeerDrain, ...] = PEERS,
    bound_s: float | None = None,
) -> dict[str, Any]:
    """Run each peer's drain of `jobs` jobs, `repeats` times; return `peers` (key -> figure)
    and `peers_servers` (name -> what was done with it)."""
    # Absolute: the servers' scripts run in their own folders, where a path relative to the
    # caller's would name nothing.
    folder = folder.resolve()
    figures: dict[str, dict[str, Any]] = {}
    servers: dict[str, str] = {}
    node = shutil.which("node")
    bound = bound_s if bound_s is not None else timeout_s(jobs, repeats)
    for server in dict.fromkeys(peer.server for peer in peers):  # in order, each once
        group = [peer for peer in peers if peer.server == server]
        runnable = []
        for peer in group:
            why = _missing(folder, peer, node)
            if why is None:
                runnable.append(peer)
            else:
                figures[peer.key] = _none(folder, peer, jobs, repeats, why)
        if not runnable:
            servers[server.name] = "not needed: none of its peers could run"
            continue
        with _serving(folder, server, servers) as why:
            for peer in runnable:
                if why is not None:
                    figures[peer.key] = _none(folder, peer, jobs, repeats, why)
                else:
                    _say(f"peer {peer.key}: {' '.join(peer.command(jobs, repeats))}")
                    figures[peer.key] = _run_peer(folder, peer, jobs, repeats, bound)
                    _say(f"peer {peer.key}: {_summary(figures[peer.key])}")
    return {"peers": {peer.key: figures[peer.key] for peer in peers}, "peers_servers": servers}


def judge(
    peer: PeerDrain, returncode: int | None, rows: list[dict[str, Any]], output: str, bound_s: float
) -> dict[str, Any]:
    """The figure of one run of a peer's program, from its exit, its rows and its output."""
    mine = [row for row in rows if isinstance(row, dict) and row.get("system") == peer.system]
    row = mine[-1] if mine else None
    if returncode is None:
        return {"median_per_s": None,
                "why": f"did not finish in {bound_s:.0f} s: its process group was killed"}
    if row is not None and row.get("all_ok") is False:
        return {"median_per_s": None,
                "why": f"its own checks failed (all_ok false: a job lost, run twice or left), "
                       f"so its median of {row.get('median')} jobs/s is not counted"}
    if returncode != 0:
        return {"median_per_s": None, "why": f"exited {returncode}: {_tail(output)}"}
    if row is None:
        return {"median_per_s": None,
                "why": f"exited 0 but appended no {peer.system} row to $BASELINE_RESULTS"}
    numbers = [row.get(name) for name in ("median", "min", "max")]
    rates = [float(x) for x in numbers
             if isinstance(x, int | float) and math.isfinite(x) and x > 0]
    if len(rates) != 3:
        return {"median_per_s": None, "why": f"its row has no usable median/min/max: {numbers}"}
    median, low, high = (round(rate, 1) for rate in rates)
    figure: dict[str, Any] = {
        "median_per_s": median,
        "min_per_s": low,
        "max_per_s": high,
        "runs": row.get("runs"),
        "config": row.get("config"),  # the row's own words: versions, server settings
    }
    if isinstance(row.get("node"), str):
        figure["node"] = row["node"]
    return figure


def _missing(folder: Path, peer: PeerDrain, node: str | None) -> str | None:
    """Why a peer cannot be run on this machine as it is, or None."""
    if node is None:
        return "node is not on PATH (the peers' programs are Node programs)"
    modules = folder / peer.folder / "node_modules"
    if not modules.is_dir():
        return f"{peer.folder}/node_modules missing: run npm ci in {folder / peer.folder}"
    if not (modules / peer.package / "package.json").is_file():
        return (f"{peer.folder}/node_modules has no {peer.package}: "
                f"run npm ci in {folder / peer.folder}")
    return None


def _version(folder: Path, peer: PeerDrain) -> str | None:
    path = folder / peer.folder / "node_modules" / peer.package / "package.json"
    with contextlib.suppress(OSError, ValueError, AttributeError):
        version = json.loads(path.read_text()).get("version")
        return f"{peer.package} {version}" if isinstance(version, str) else None
    return None


def _none(folder: Path, peer: PeerDrain, jobs: int, repeats: int, why: str) -> dict[str, Any]:
    _say(f"peer {peer.key}: no figure: {why}")
    return {"median_per_s": None, "why": why, **_about(folder, peer, jobs, repeats)}


def _about(folder: Path, peer: PeerDrain, jobs: int, repeats: int) -> dict[str, Any]:
    """What a figure is of, whether it was measured or not."""
    about: dict[str, Any] = {
        "describe": peer.describe,
        "command": f"cd {folder / peer.folder} && {' '.join(peer.command(jobs, repeats))}",
    }
    version = _version(folder, peer)
    if version is not None:
        about["version"] = version
    return about


def _run_peer(
    folder: Path, peer: PeerDrain, jobs: int, repeats: int, bound_s: float
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="raftcron-peer-") as scratch:
        results = Path(scratch) / "results.jsonl"
        returncode, output = _run(
            peer.command(jobs, repeats),
            cwd=folder / peer.folder,
            env={**os.environ, "BASELINE_RESULTS": str(results)},
            bound_s=bound_s,
            log=Path(scratch) / "output.log",
        )
        rows = _rows(results)
    return {**judge(peer, returncode, rows, output, bound_s), **_about(folder, peer, jobs, repeats)}


def _rows(path: Path) -> list[dict[str, Any]]:
    """The JSON rows of a results file (Python's json reads the NaN a row may hold)."""
    rows = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if isinstance(row, dict):
                    rows.append(row)
    return rows


@contextlib.contextmanager
def _serving(folder: Path, server: Server, servers: dict[str, str]) -> Any:
    """Yield None once the server answers (started by us or already there), else the reason;
    stop it on the way out if we ran its start script, whatever happened meanwhile."""
    port = server.address()
    if _answering(port):
        servers[server.name] = f"already answering on 127.0.0.1:{port}: used, left running"
        _say(f"peer server {server.name}: {servers[server.name]}")
        yield None
        return
    absent = [need for need in server.needs if not _installed(need)]
    if absent:
        lacking = (f"{', '.join(absent)} not installed ({server.start[0]} would apt-get install "
               f"it; raftcron bench installs nothing): install it, or start the server with "
               f"{folder / server.start[0]}, and run again")
        servers[server.name] = f"not started: {lacking}"
        yield lacking
        return
    start = " ".join(server.start)
    why: str | None = None
    try:
        _say(f"peer server {server.name}: {start}")
        returncode, output = _script(folder, server.start, START_S)
        if returncode != 0:
            why = (f"{start} failed ({_exit(returncode, START_S)}): {_tail(output)}")
            servers[server.name] = f"not started: {why}"
        else:
            servers[server.name] = f"started by {start}"
        yield why
    finally:
        returncode, output = _script(folder, server.stop, STOP_S)
        stop = " ".join(server.stop)
        if returncode == 0:
            servers[server.name] += f", stopped by {stop}"
        else:
            servers[server.name] += (f"; {stop} failed ({_exit(returncode, STOP_S)}): "
                                     f"{_tail(output)}")
        _say(f"peer server {server.name}: {servers[server.name]}")


def _script(folder: Path, words: tuple[str, ...], bound_s: float) -> tuple[int | None, str]:
    # Through bash: a copy of the folder may have lost the scripts' executable bits.
    path = folder / words[0]
    with tempfile.TemporaryDirectory(prefix="raftcron-peer-") as scratch:
        return _run(["bash", str(path), *words[1:]], cwd=path.parent, env=dict(os.environ),
                    bound_s=bound_s, log=Path(scratch) / "output.log")


def _run(
    command: list[str], *, cwd: Path, env: dict[str, str], bound_s: float, log: Path
) -> tuple[int | None, str]:
    """Run `command` in its own process group, its output to `log` (a file, not a pipe: a
    server a start script daemonizes may keep the descriptor, and a pipe would then never end);
    return its exit status (None: killed at the bound) and its output."""
    with log.open("wb") as out:
        try:
            process = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        except OSError as error:  # bash or node gone since the checks
            return 127, f"could not start {command[0]}: {error}"
    returncode: int | None = None
    try:
        returncode = process.wait(bound_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if returncode is None:  # the bound, or the bench interrupted: nothing of it stays
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(STOP_S)
    return returncode, log.read_text(errors="replace")


def _answering(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _installed(need: str) -> bool:
    return bool(glob.glob(need)) if "/" in need else shutil.which(need) is not None


def _exit(returncode: int | None, bound_s: float) -> str:
    return f"not done in {bound_s:.0f} s, killed" if returncode is None else f"exit {returncode}"


def _tail(output: str) -> str:
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    text = " | ".join(lines[-3:]) or "no output"
    return text if len(text) <= TAIL_CHARS else "..." + text[-TAIL_CHARS:]


def _summary(figure: dict[str, Any]) -> str:
    if figure["median_per_s"] is None:
        return f"no figure: {figure['why']}"
    return (f"median {figure['median_per_s']:,.0f} jobs/s "
            f"({figure['min_per_s']:,.0f}-{figure['max_per_s']:,.0f})")


def _say(line: str) -> None:
    # Progress on stderr, as the measures' lines: stdout holds only the figures.
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
