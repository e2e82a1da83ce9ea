"""The peers' drains `raftcron bench --peers DIR` runs beside ours, as data.

The peers are the queues a user would pick instead of raftcron (BullMQ on Redis, graphile-worker
on PostgreSQL), timed by the programs of a baselines folder that is not part of this repository
(`../shared/baselines` on the development machine, absent from a fresh clone): so the folder is
an option, and what this module owns is what that folder must hold, the servers its programs
need and the command lines, checked before any cluster is started. How they are run is
peerrun.py's; how they are shown beside ours is peerreport.py's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_REPEATS = 3  # as the baselines' README runs them: a median of 3


@dataclass(frozen=True)
class Server:
    """A server the peers' programs talk to, started and stopped by the folder's scripts."""

    name: str
    start: tuple[str, ...]  # a script under DIR, then its arguments
    stop: tuple[str, ...]
    port: int  # a server already answering here is used as it is, and left running
    port_env: str | None  # the variable the scripts and the program read the port from
    # What the start script would `apt-get install` when missing: commands on PATH, or globs
    # of paths. The bench installs nothing on the user's machine, so a missing one is a reason.
    needs: tuple[str, ...]

    def address(self) -> int:
        value = os.environ.get(self.port_env or "", "")
        return int(value) if value.isdigit() else self.port


@dataclass(frozen=True)
class PeerDrain:
    """One drain of one peer: a Node program of DIR run with our drain's jobs."""

    key: str  # its name in the figures
    system: str  # the `system` field of the row it appends to $BASELINE_RESULTS
    folder: str  # under DIR: the program, and the node_modules `npm ci` installs there
    program: str
    options: tuple[str, ...]  # between --jobs N and --repeats R
    server: Server
    package: str  # the node package the figure is of (its version is reported)
    describe: str  # a line for the human output

    def command(self, jobs: int, repeats: int) -> list[str]:
        return ["node", self.program, "--jobs", str(jobs), *self.options,
                "--repeats", str(repeats)]


REDIS = Server(
    name="redis",
    start=("bullmq/redis_start.sh", "always"),
    stop=("bullmq/redis_stop.sh",),
    port=63790,
    port_env="REDIS_PORT",
    needs=("redis-server", "redis-cli"),
)
POSTGRESQL = Server(
    name="postgresql",
    start=("pg_start.sh",),
    stop=("pg_stop.sh",),
    port=54329,  # pg_start.sh writes it into the cluster's postgresql.conf
    port_env=None,
    needs=("/usr/lib/postgresql/*/bin",),
)

# In the order they run; the two of a server run one after the other on one start of it.
PEERS = (
    PeerDrain(
        key="bullmq_fsync_always_keep",
        system="bullmq",
        folder="bullmq",
        program="bench_bullmq.mjs",
        options=("--concurrency", "100", "--fsync", "always", "--completed", "keep"),
        server=REDIS,
        package="bullmq",
        describe="BullMQ, appendfsync always, finished jobs kept, concurrency 100",
    ),
    PeerDrain(
        key="bullmq_fsync_always_remove",
        system="bullmq",
        folder="bullmq",
        program="bench_bullmq.mjs",
        options=("--concurrency", "100", "--fsync", "always", "--completed", "remove"),
        server=REDIS,
        package="bullmq",
        describe="BullMQ, appendfsync always, finished jobs removed, concurrency 100",
    ),
    PeerDrain(
        key="graphile_batched",
        system="graphile-worker",
        folder="graphile",
        program="bench_graphile.mjs",
        options=("--concurrency", "24", "--mode", "batched"),
        server=POSTGRESQL,
        package="graphile-worker",
        describe="graphile-worker, batched (local queue 500), concurrency 24",
    ),
    PeerDrain(
        key="graphile_default",
        system="graphile-worker",
        folder="graphile",
        program="bench_graphile.mjs",
        options=("--concurrency", "24", "--mode", "default"),
        server=POSTGRESQL,
        package="graphile-worker",
        describe="graphile-worker, defaults (a fetch and a DELETE per job), concurrency 24",
    ),
)


def expected_files(peers: tuple[PeerDrain, ...] = PEERS) -> list[str]:
    """The files DIR must hold for the peers to be run, relative to it."""
    files = {"common.mjs"}  # the Node programs' shared RESULT line and row
    for peer in peers:
        files |= {f"{peer.folder}/{peer.program}", peer.server.start[0], peer.server.stop[0]}
    return sorted(files)


def problem(folder: Path, peers: tuple[PeerDrain, ...] = PEERS) -> str | None:
    """What is wrong with `--peers folder`, or None: checked before anything is started."""
    if not folder.exists():
        return f"--peers {folder}: no such folder (the baselines folder, e.g. ../shared/baselines)"
    if not folder.is_dir():
        return f"--peers {folder}: not a folder (the baselines folder, e.g. ../shared/baselines)"
    missing = [name for name in expected_files(peers) if not (folder / name).is_file()]
    if missing:
        return (f"--peers {folder}: not a baselines folder, it lacks {', '.join(missing)}")
    return None
