"""`raftcron bench --peers DIR`, the parts that start no process: the option's checks, the
figure read from a peer's exit and rows, the reasons given when a peer cannot run, and the
ratios and lines shown beside our drain. (Running fake peers: test_bench_peers_run.py.)"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import peerfolder
import pytest

from raftcron.cluster.commandline.main import main
from raftcron.cluster.dev.bench import peerreport, peerrun, peers, run

BULLMQ = peers.PEERS[0]


def test_the_folder_must_exist_and_hold_the_peers_programs_and_scripts(tmp_path: Path) -> None:
    assert "no such folder" in str(peers.problem(tmp_path / "nope"))
    (tmp_path / "file").write_text("")
    assert "not a folder" in str(peers.problem(tmp_path / "file"))
    folder = peerfolder.make(tmp_path, behave={})
    assert peers.problem(folder) is None
    (folder / "pg_stop.sh").unlink()
    (folder / "bullmq" / "bench_bullmq.mjs").unlink()
    problem = str(peers.problem(folder))
    assert "not a baselines folder" in problem
    assert "bullmq/bench_bullmq.mjs" in problem and "pg_stop.sh" in problem
    assert "redis_start.sh" not in problem  # only what is missing is named
    assert peers.expected_files() == [
        "bullmq/bench_bullmq.mjs", "bullmq/redis_start.sh", "bullmq/redis_stop.sh",
        "common.mjs", "graphile/bench_graphile.mjs", "pg_start.sh", "pg_stop.sh"]


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["--peers", "{missing}"], "no such folder"),
        (["--peers", "{empty}"], "it lacks bullmq/bench_bullmq.mjs"),
        (["--peers", "{good}", "--only", "claim"], "--only must include drain"),
        (["--peers", "{good}", "--peer-repeats", "0"], "--peer-repeats must be at least 1"),
        (["--peer-repeats", "2"], "--peer-repeats needs --peers DIR"),
        (["--only", "drain", "--slots", "0"], "--slots must be from 1 to 1,000"),
        (["--only", "drain", "--slots", "1001"], "--slots must be from 1 to 1,000"),
        (["--only", "claim", "--slots", "128"], "--only must include drain"),
    ],
)
def test_bad_peers_options_are_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], words: list[str], said: str
) -> None:
    (tmp_path / "empty").mkdir()
    good = peerfolder.make(tmp_path, behave={})
    places = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "good": good}
    # A cluster would be started (processes: the tier guard fails the test) if not refused.
    assert main(["bench", *(word.format(**places) for word in words)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("raftcron bench: ") and said in error


def row(**changes: Any) -> dict[str, Any]:
    base = {"system": "bullmq", "config": "drain n=100 fake", "median": 2000.04, "min": 1800.0,
            "max": 2200.0, "runs": [1800.0, 2000.0, 2200.0], "all_ok": True, "node": "v20.1.0",
            "first_job_ms_max": math.nan}
    return base | changes


def test_a_peer_figure_is_read_from_its_row() -> None:
    figure = peerrun.judge(BULLMQ, 0, [row(system="other", median=9.0), row()], "", 60)
    assert figure == {"median_per_s": 2000.0, "min_per_s": 1800.0, "max_per_s": 2200.0,
                      "runs": [1800.0, 2000.0, 2200.0], "config": "drain n=100 fake",
                      "node": "v20.1.0"}
    json.dumps(figure, allow_nan=False)  # the row's NaN is not carried into our JSON


@pytest.mark.parametrize(
    ("returncode", "rows", "output", "why"),
    [
        (None, [row()], "", "did not finish in 60 s: its process group was killed"),
        (1, [row(all_ok=False)], "", "its own checks failed (all_ok false"),
        (1, [], "Error: connect ECONNREFUSED\n    at main\n", "exited 1: Error: connect "
         "ECONNREFUSED | at main"),
        (0, [], "", "exited 0 but appended no bullmq row to $BASELINE_RESULTS"),
        (0, [row(system="graphile-worker")], "", "appended no bullmq row"),
        (0, [row(median=math.nan)], "", "no usable median/min/max"),
        (0, [row(median="fast")], "", "no usable median/min/max"),
    ],
    ids=["timeout", "checks", "exit", "no-row", "other-row", "nan", "text"],
)
def test_a_failed_peer_gets_no_figure_and_the_reason(
    returncode: int | None, rows: list[dict[str, Any]], output: str, why: str
) -> None:
    figure = peerrun.judge(BULLMQ, returncode, rows, output, 60)
    assert figure["median_per_s"] is None
    assert why in figure["why"]
    assert set(figure) == {"median_per_s", "why"}


def test_without_node_no_peer_runs_and_nothing_is_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = peerfolder.make(tmp_path, behave={})
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    found = peerrun.measure(folder, jobs=100, repeats=1, peers=peerfolder.peers(1, 1))
    assert list(found["peers"]) == [peer.key for peer in peers.PEERS]
    for figure in found["peers"].values():
        assert figure["median_per_s"] is None
        assert figure["why"] == "node is not on PATH (the peers' programs are Node programs)"
    assert found["peers_servers"] == {"redis": "not needed: none of its peers could run",
                                      "postgresql": "not needed: none of its peers could run"}
    assert peerfolder.calls(folder) == []


def test_missing_node_modules_and_a_missing_server_are_reasons_not_installs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = peerfolder.make(tmp_path, behave={}, modules=("bullmq",))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    port = peerfolder.free_port()
    found = peerrun.measure(folder, jobs=100, repeats=3,
                            peers=peerfolder.peers(port, port, needs=("no-such-redis-server",)))
    graphile = found["peers"]["graphile_default"]
    assert graphile["median_per_s"] is None
    assert graphile["why"] == (f"graphile/node_modules missing: run npm ci in "
                               f"{folder / 'graphile'}")
    assert graphile["command"] == (f"cd {folder / 'graphile'} && node bench_graphile.mjs "
                                   f"--jobs 100 --concurrency 24 --mode default --repeats 3")
    bullmq = found["peers"]["bullmq_fsync_always_keep"]
    assert bullmq["median_per_s"] is None
    assert bullmq["why"].startswith("no-such-redis-server not installed "
                                    "(bullmq/redis_start.sh would apt-get install it")
    assert bullmq["version"] == "bullmq 6.7.6"
    assert found["peers_servers"]["redis"].startswith("not started: no-such-redis-server")
    assert found["peers_servers"]["postgresql"] == "not needed: none of its peers could run"
    assert peerfolder.calls(folder) == []  # no start script ran, so none would install


def test_ratios_are_ours_over_theirs_and_a_peer_without_figure_has_none() -> None:
    ours = {"drain_jobs_per_s": 13_000, "drain_ready_jobs_per_s": 15_000}
    compared = peerreport.compare(
        {"a": {"median_per_s": 26_000.0, "min_per_s": 25_000.0, "max_per_s": 27_000.0,
               "version": "bullmq 6.7.6"},
         "b": {"median_per_s": None, "why": "graphile/node_modules missing: run npm ci in x"}},
        ours,
    )
    assert compared["a"]["drain_over_peer"] == 0.5
    assert compared["a"]["ready_over_peer"] == 0.58
    assert "drain_over_peer" not in compared["b"] and "ready_over_peer" not in compared["b"]
    text = peerreport.table({**ours, "peers": compared, "peers_jobs": 100_000,
                             "peers_repeats": 3, "peers_servers": {"redis": "started by x"}})
    assert text.splitlines() == [
        "peers, after our drain in the same sitting: 100,000 jobs, median of 3 (ours: "
        "13,000 jobs/s, 15,000 jobs/s from ready workers)",
        "  a                               26,000 jobs/s (25,000-27,000)  ours 0.50x, "
        "0.58x from ready  [bullmq 6.7.6]",
        "  b                            no figure: graphile/node_modules missing: run npm ci in x",
        "  server redis: started by x",
    ]


def test_the_bench_runs_the_peers_after_its_drain_with_its_jobs_and_shows_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The wiring of run.py: our measures and the peers' runs are stand-ins here."""
    folder = peerfolder.make(tmp_path, behave={})
    asked: list[tuple[Path, int, int]] = []

    async def our_measures(*args: Any) -> dict[str, Any]:
        return {"drain_jobs_per_s": 12_000, "drain_ready_jobs_per_s": 14_000, "drain_jobs": 2_000,
                "drain_workers": 4}

    def their_drains(where: Path, *, jobs: int, repeats: int) -> dict[str, Any]:
        asked.append((where, jobs, repeats))
        return {"peers": {"bullmq_fsync_always_keep": {"median_per_s": 24_000.0,
                                                       "min_per_s": 1.0, "max_per_s": 2.0},
                          "graphile_default": {"median_per_s": None, "why": "x"}},
                "peers_servers": {"redis": "started"}}

    monkeypatch.setattr(run, "_measure", our_measures)
    monkeypatch.setattr(peerrun, "measure", their_drains)
    base = ["bench", "--connect", "http://127.0.0.1:9", "--only", "drain", "--peers", str(folder)]
    assert main([*base, "--json", "--peer-repeats", "2"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert asked == [(folder, 2_000, 2)]
    assert figures["drain_jobs_per_s"] == 12_000
    assert figures["peers"]["bullmq_fsync_always_keep"]["drain_over_peer"] == 0.5
    assert figures["peers"]["graphile_default"] == {"median_per_s": None, "why": "x"}
    assert (figures["peers_jobs"], figures["peers_repeats"]) == (2_000, 2)
    assert main(base) == 0
    out = capsys.readouterr().out
    assert asked[-1] == (folder, 2_000, peers.DEFAULT_REPEATS)
    assert "ours 0.50x, 0.58x from ready" in out and "graphile_default" in out
    assert "{" not in out  # the peers' dicts have their own lines, not the figures' loop
