"""A fake baselines folder for the tests of `raftcron bench --peers` (cluster/dev/bench/peers.py).

Its layout is the real one's (bullmq/, graphile/, the start and stop scripts, common.mjs), but
the programs are small Python scripts, run by a fake `node` that is Python: each appends a row
to $BASELINE_RESULTS and prints a RESULT line as common.mjs does, or fails, hangs, or reports
failed checks, as `behave` tells it. The scripts only log that they were called, in calls.log.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import sys
from pathlib import Path
from typing import Any

from raftcron.cluster.dev.bench.peers import PEERS, PeerDrain

PROGRAM = r'''
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
with open(os.path.join(here, "..", "argv.log"), "a") as log:
    log.write(os.path.basename(__file__) + " " + " ".join(sys.argv[1:]) + "\n")
with open(os.path.join(here, "..", "behave.json")) as f:
    what = json.load(f)[args.get("--completed") or args.get("--mode")]
if "fail" in what:
    print(what["fail"], file=sys.stderr)
    sys.exit(1)
if "hang" in what:
    with open(os.path.join(here, "..", "hung.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
if "no_row" in what:
    sys.exit(0)
runs = [what["rate"] * k for k in (0.9, 1.0, 1.1)][: int(args["--repeats"])]
row = {"system": SYSTEM, "config": "drain n=" + args["--jobs"] + " fake",
       "ts": "2026-12-05T00:00:00", "median": sorted(runs)[len(runs) // 2],
       "min": min(runs), "max": max(runs), "runs": runs,
       "first_job_ms_max": float("nan"), "all_ok": what.get("all_ok", True), "node": "v20-fake"}
with open(os.environ["BASELINE_RESULTS"], "a") as f:
    f.write(json.dumps(row) + "\n")
print("RESULT %s | %s | median %.1f/s" % (SYSTEM, row["config"], row["median"]))
sys.exit(0 if row["all_ok"] else 1)
'''

SCRIPT = """#!/bin/bash
echo "{name} $*" >> "$(dirname "$0")/{up}calls.log"
{body}
"""


def make(root: Path, *, behave: dict[str, Any], modules: tuple[str, ...] = ("bullmq", "graphile"),
         scripts: dict[str, str] | None = None) -> Path:
    """A baselines folder under `root`, and a fake `node` in root/bin (put it on PATH).
    `behave` maps --completed keep|remove and --mode batched|default to what the program does:
    {"rate": jobs/s}, {"fail": message}, {"hang": True}, {"no_row": True}, all_ok False.
    `modules`: the folders with node_modules; `scripts`: a start or stop script's body."""
    folder = root / "baselines"
    for sub, system in (("bullmq", "bullmq"), ("graphile", "graphile-worker")):
        (folder / sub).mkdir(parents=True)
        program = "bench_bullmq.mjs" if sub == "bullmq" else "bench_graphile.mjs"
        (folder / sub / program).write_text(f"SYSTEM = {system!r}\n{PROGRAM}")
        if sub in modules:
            package = folder / sub / "node_modules" / system
            package.mkdir(parents=True)
            version = "6.7.6" if sub == "bullmq" else "0.17.3"
            (package / "package.json").write_text(json.dumps({"version": version}))
    (folder / "common.mjs").write_text("// the fake programs write their rows themselves\n")
    (folder / "behave.json").write_text(json.dumps(behave))
    for path in ("bullmq/redis_start.sh", "bullmq/redis_stop.sh", "pg_start.sh", "pg_stop.sh"):
        name = Path(path).name
        body = (scripts or {}).get(name, "exit 0")
        up = "../" if "/" in path else ""
        (folder / path).write_text(SCRIPT.format(name=name, up=up, body=body))
    bin_dir = root / "bin"
    bin_dir.mkdir()
    node = bin_dir / "node"
    node.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    node.chmod(0o755)
    return folder


def calls(folder: Path) -> list[str]:
    path = folder / "calls.log"
    return path.read_text().splitlines() if path.exists() else []


def argv(folder: Path) -> list[str]:
    path = folder / "argv.log"
    return path.read_text().splitlines() if path.exists() else []


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def peers(redis_port: int, pg_port: int, needs: tuple[str, ...] = ()) -> tuple[PeerDrain, ...]:
    """The real peers, their servers on ports of the test's and needing `needs` installed
    (nothing by default, so no test depends on this machine's redis or PostgreSQL)."""
    servers = {}
    for peer in PEERS:
        port = redis_port if peer.server.name == "redis" else pg_port
        servers.setdefault(peer.server.name, dataclasses.replace(
            peer.server, port=port, port_env=None, needs=needs))
    return tuple(dataclasses.replace(peer, server=servers[peer.server.name]) for peer in PEERS)
