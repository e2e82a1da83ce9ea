"""`raftcron bench --peers DIR` running a fake baselines folder (tests/cluster/peerfolder.py):
each peer's program is started with our jobs and repeats and $BASELINE_RESULTS pointing at a
file of ours, its row becomes its figure, a failed, hung or self-failing program gets a reason
instead, and a server is stopped again whenever its start script was run.

The programs are tiny Python scripts and the servers' scripts only log their calls: no Node,
Redis or PostgreSQL is started, and ports are the test's own."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import peerfolder
import pytest

from raftcron.cluster.dev.bench import peerrun

pytestmark = pytest.mark.processes  # runs the fake folder's scripts: make integration


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake `node` first on PATH (bash and the rest after it)."""
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.usefixtures("on_path")
def test_figures_reasons_and_the_servers_started_and_stopped(tmp_path: Path) -> None:
    folder = peerfolder.make(
        tmp_path,
        behave={"keep": {"rate": 2000.0}, "remove": {"fail": "Error: connect ECONNREFUSED"}},
        modules=("bullmq",),
    )
    fake = peerfolder.peers(peerfolder.free_port(), peerfolder.free_port())
    found = peerrun.measure(folder, jobs=500, repeats=3, peers=fake)
    keep = found["peers"]["bullmq_fsync_always_keep"]
    assert keep["median_per_s"] == 2000.0
    assert (keep["min_per_s"], keep["max_per_s"]) == (1800.0, 2200.0)
    assert keep["runs"] == [1800.0, 2000.0, 2200.0]
    assert keep["config"] == "drain n=500 fake" and keep["version"] == "bullmq 6.7.6"
    assert keep["command"] == (f"cd {folder / 'bullmq'} && node bench_bullmq.mjs --jobs 500 "
                               f"--concurrency 100 --fsync always --completed keep --repeats 3")
    remove = found["peers"]["bullmq_fsync_always_remove"]
    assert remove["median_per_s"] is None
    assert remove["why"] == "exited 1: Error: connect ECONNREFUSED"
    for key in ("graphile_batched", "graphile_default"):
        assert found["peers"][key]["median_per_s"] is None
        assert "graphile/node_modules missing: run npm ci" in found["peers"][key]["why"]
    assert peerfolder.argv(folder) == [
        "bench_bullmq.mjs --jobs 500 --concurrency 100 --fsync always --completed keep "
        "--repeats 3",
        "bench_bullmq.mjs --jobs 500 --concurrency 100 --fsync always --completed remove "
        "--repeats 3",
    ]
    # One start for both BullMQ drains, one stop after them; PostgreSQL was never needed.
    assert peerfolder.calls(folder) == ["redis_start.sh always", "redis_stop.sh "]
    assert found["peers_servers"] == {
        "redis": "started by bullmq/redis_start.sh always, stopped by bullmq/redis_stop.sh",
        "postgresql": "not needed: none of its peers could run",
    }
    # The rows went to a file of ours, not to the folder's baseline-results.jsonl.
    assert not list(folder.rglob("baseline-results.jsonl"))


@pytest.mark.usefixtures("on_path")
def test_a_failed_start_is_every_peers_reason_and_the_server_is_still_stopped(
    tmp_path: Path,
) -> None:
    folder = peerfolder.make(
        tmp_path, behave={"batched": {"rate": 9.0}, "default": {"rate": 9.0}},
        scripts={"pg_start.sh": 'echo "initdb: cannot be run as root" >&2\nexit 1',
                 "pg_stop.sh": 'echo "pg_ctl: PID file does not exist" >&2\nexit 1'},
    )
    fake = peerfolder.peers(peerfolder.free_port(), peerfolder.free_port())
    found = peerrun.measure(folder, jobs=100, repeats=1, peers=fake[2:])
    for key in ("graphile_batched", "graphile_default"):
        assert found["peers"][key]["median_per_s"] is None
        assert found["peers"][key]["why"] == (
            "pg_start.sh failed (exit 1): initdb: cannot be run as root")
    assert peerfolder.argv(folder) == []  # no program ran against no server
    assert peerfolder.calls(folder) == ["pg_start.sh ", "pg_stop.sh "]
    assert found["peers_servers"]["postgresql"] == (
        "not started: pg_start.sh failed (exit 1): initdb: cannot be run as root; "
        "pg_stop.sh failed (exit 1): pg_ctl: PID file does not exist")


@pytest.mark.usefixtures("on_path")
def test_a_server_already_answering_is_used_and_left_running(tmp_path: Path) -> None:
    folder = peerfolder.make(tmp_path, behave={"keep": {"rate": 100.0},
                                               "remove": {"rate": 300.0}})
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        fake = peerfolder.peers(port, peerfolder.free_port())
        found = peerrun.measure(folder, jobs=100, repeats=1, peers=fake[:2])
    assert found["peers"]["bullmq_fsync_always_keep"]["median_per_s"] == 90.0  # 1 run: 0.9x
    assert found["peers"]["bullmq_fsync_always_remove"]["median_per_s"] == 270.0
    assert peerfolder.calls(folder) == []
    assert found["peers_servers"] == {
        "redis": f"already answering on 127.0.0.1:{port}: used, left running"}


@pytest.mark.usefixtures("on_path")
def test_a_hung_peer_is_killed_at_its_bound_and_failed_checks_are_not_a_figure(
    tmp_path: Path,
) -> None:
    folder = peerfolder.make(
        tmp_path,
        behave={"keep": {"hang": True}, "remove": {"rate": 500.0, "all_ok": False},
                "batched": {"no_row": True}, "default": {"rate": 50.0}},
    )
    fake = peerfolder.peers(peerfolder.free_port(), peerfolder.free_port())
    found = peerrun.measure(folder, jobs=100, repeats=2, peers=fake, bound_s=5.0)
    figures = found["peers"]
    assert figures["bullmq_fsync_always_keep"]["median_per_s"] is None
    assert figures["bullmq_fsync_always_keep"]["why"] == (
        "did not finish in 5 s: its process group was killed")
    hung = int((folder / "hung.pid").read_text())
    assert gone(hung)  # killed and reaped before measure returned
    assert figures["bullmq_fsync_always_remove"]["median_per_s"] is None
    assert "its own checks failed (all_ok false" in figures["bullmq_fsync_always_remove"]["why"]
    assert figures["graphile_batched"]["why"] == (
        "exited 0 but appended no graphile-worker row to $BASELINE_RESULTS")
    assert figures["graphile_default"]["median_per_s"] == 50.0  # of runs 45 and 50
    assert peerfolder.calls(folder) == ["redis_start.sh always", "redis_stop.sh ",
                                        "pg_start.sh ", "pg_stop.sh "]


@pytest.mark.usefixtures("on_path")
def test_a_relative_folder_is_found_from_where_bench_was_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `raftcron bench --peers ../shared/baselines`: the servers' scripts run in their own
    # folders, so a path relative to where bench started must be made absolute first.
    folder = peerfolder.make(tmp_path, behave={"keep": {"rate": 2000.0}}, modules=("bullmq",))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    relative = Path(os.path.relpath(folder, tmp_path / "elsewhere"))
    assert not relative.is_absolute()
    fake = peerfolder.peers(peerfolder.free_port(), peerfolder.free_port())
    found = peerrun.measure(relative, jobs=500, repeats=3, peers=fake)
    assert found["peers"]["bullmq_fsync_always_keep"]["median_per_s"] == 2000.0
    assert peerfolder.calls(folder) == ["redis_start.sh always", "redis_stop.sh "]
    assert found["peers_servers"]["redis"].startswith("started by bullmq/redis_start.sh")
    assert found["peers"]["bullmq_fsync_always_keep"]["command"].startswith(f"cd {folder}/")
