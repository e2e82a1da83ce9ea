"""The endurance scenario's slope checker (chaos/tier2/checkers/slopes.py) on made-up series,
and a short run of the scenario itself with sampling every few seconds.

The checker must fail a leak, pass a plateau and noise, and start a new series when the
nemesis restarts a node (a new PID), so a restart's drop is never read as a level-off nor its
climb back as a leak. The smoke proves the sampler's events reach the history and the checker
judges them in a real run.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from raftcron.chaos.tier2.checkers import RunData, check_slopes, slopes_table
from raftcron.chaos.tier2.checkers.slopes import fit, slopes
from raftcron.chaos.tier2.endurance import read_process

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
START_MS = 1_800_000_000_000
SMOKE_TIMEOUT_S = 120


def _run(history: list[dict[str, Any]]) -> RunData:
    return RunData(history=history, jobs={}, schedules=[], cluster_events=[], digests={},
                   sink=[])


def _samples(node: str, pid: int, rss: list[float], *, start_s: float = 0.0,
             every_s: float = 60.0) -> list[dict[str, Any]]:
    return [{"kind": "resource", "t": START_MS + int((start_s + i * every_s) * 1000),
             "node": node, "pid": pid, "rss_bytes": value + 4 * MIB, "state_bytes": 4 * MIB,
             "fds": 40, "threads": 20,
             "log_entries": 900, "log_bytes": 2 * MIB} for i, value in enumerate(rss)]


def _sampler(warmup_min_s: float = 120.0) -> dict[str, Any]:
    return {"kind": "sampler", "t": START_MS, "every_s": 60.0, "warmup_min_s": warmup_min_s}


def test_the_fit_is_least_squares_with_its_standard_error() -> None:
    assert fit([(0, 1.0), (1, 3.0), (2, 5.0)]) == (2.0, 0.0)
    slope, stderr = fit([(0, 0.0), (1, 1.0), (2, 0.0), (3, 1.0)])
    assert slope == pytest.approx(0.2) and stderr > 0.1
    assert fit([(5, 1.0)]) == (0.0, 0.0)


def test_a_leak_fails_the_checker() -> None:
    leak = [80 * MIB + i * MIB for i in range(60)]  # 1 MiB a minute for an hour
    result = check_slopes(_run([_sampler(), *_samples("n1", 100, leak)]))
    assert not result.ok
    assert "n1 (pid 100) rss_beyond_state_bytes does not level off" in result.violations[0]
    assert result.counts["judged"] == 5  # one slope per figure of the one series


def test_a_plateau_after_the_warm_up_passes() -> None:
    climb = [20 * MIB + i * 8 * MIB for i in range(10)]  # the state filling its budget
    plateau = climb + [100 * MIB] * 50
    result = check_slopes(_run([_sampler(), *_samples("n1", 100, plateau)]))
    assert result.ok, result.violations
    assert "n1    100" in slopes_table([_sampler(), *_samples("n1", 100, plateau)])


def test_noise_on_a_plateau_does_not_fail_it() -> None:
    rng = random.Random(27)
    for _ in range(20):
        noisy = [100 * MIB + rng.gauss(0, 3 * MIB) for _ in range(60)]
        result = check_slopes(_run([_sampler(), *_samples("n1", 100, noisy)]))
        assert result.ok, result.violations


def test_a_sawtooth_like_a_compacted_log_does_not_fail_it() -> None:
    saw = [100 * MIB + (i % 7) * 2 * MIB for i in range(60)]
    assert check_slopes(_run([_sampler(), *_samples("n1", 100, saw)])).ok


def test_a_restart_starts_a_new_series() -> None:
    """Before the restart a plateau at 60 MiB; the new process climbs back, to 100 MiB (it came
    back with more to hold) and stays there. As one series the climb after the drop reads as
    growth; as two (a new PID), both level off."""
    before = [60 * MIB] * 40
    after = [30 * MIB + i * 10 * MIB for i in range(8)] + [100 * MIB] * 12
    history = [_sampler(), *_samples("n1", 100, before),
               *_samples("n1", 200, after, start_s=40 * 60)]
    found = {(s.pid, s.figure): s for s in slopes(history)}
    assert {pid for pid, _ in found} == {100, 200}
    assert found[(200, "rss_beyond_state_bytes")].judged
    assert check_slopes(_run(history)).ok
    merged = [{**event, "pid": 100} for event in history]
    assert not check_slopes(_run(merged)).ok  # the same samples as one series: a false leak


def test_a_leak_after_a_restart_still_fails() -> None:
    before = [100 * MIB] * 30
    leak = [100 * MIB + i * 2 * MIB for i in range(30)]
    history = [_sampler(), *_samples("n1", 100, before),
               *_samples("n1", 200, leak, start_s=30 * 60)]
    result = check_slopes(_run(history))
    assert not result.ok and "pid 200" in result.violations[0]


def test_a_short_series_is_listed_but_not_judged() -> None:
    history = [_sampler(), *_samples("n1", 100, [100 * MIB] * 60),
               *_samples("n2", 300, [10 * MIB * i for i in range(4)], start_s=3000)]
    result = check_slopes(_run(history))
    assert result.ok and result.counts["short"] == 5 and result.counts["judged"] == 5
    assert "short" in slopes_table(history)


def test_the_sampler_splits_the_resident_size_into_anonymous_and_file_pages() -> None:
    figures = read_process(os.getpid())
    assert figures is not None
    anon, file, rss = figures["rss_anon_bytes"], figures["rss_file_bytes"], figures["rss_bytes"]
    assert anon > 4 * MIB and file > 1 * MIB  # an interpreter's heaps, and its mapped code
    assert anon + file <= rss <= anon + file + 64 * MIB  # the rest: shared memory, if any
    blob = bytearray(32 * MIB)  # written pages are anonymous
    grown = read_process(os.getpid())
    assert grown is not None and grown["rss_anon_bytes"] - anon > 24 * MIB
    del blob


@pytest.mark.processes
def test_a_process_killed_and_not_yet_reaped_is_no_sample() -> None:
    """A node the nemesis has just killed is a zombie until it is reaped: its status has no
    memory and its descriptors are gone. Sampled, it read as 0 bytes and 0 descriptors (the
    smoke's own check failed on one in a fresh-clone CI)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert read_process(child.pid) is not None  # alive: a sample
        os.kill(child.pid, signal.SIGKILL)  # as the nemesis kills a node's main PID
        deadline = time.monotonic() + 10
        while "zombie" not in Path(f"/proc/{child.pid}/status").read_text():
            assert time.monotonic() < deadline, "the child never died"
            time.sleep(0.01)
        assert read_process(child.pid) is None
    finally:
        child.wait(10)
    assert read_process(child.pid) is None  # reaped: gone


def test_the_parts_of_the_resident_size_are_shown_not_judged() -> None:
    history = [_sampler()] + [{**e, "rss_anon_bytes": e["rss_bytes"] * (1 + i),
                               "rss_file_bytes": 8 * MIB}
                              for i, e in enumerate(_samples("n1", 100, [60 * MIB] * 40))]
    found = {s.figure: s for s in slopes(history)}
    assert found["rss_anon_bytes"].verdict == "info" and found["rss_file_bytes"].verdict == "info"
    assert check_slopes(_run(history)).ok  # the anonymous part "grows": not judged
    assert "rss_anon_bytes" in slopes_table(history)


def test_no_samples_is_no_verdict_and_no_table() -> None:
    result = check_slopes(_run([]))
    assert result.ok and result.counts["samples"] == 0 and slopes_table([]) == ""


@pytest.mark.processes
@pytest.mark.timeout(SMOKE_TIMEOUT_S + 30)
def test_the_endurance_smoke_samples_every_node_and_judges_the_slopes(tmp_path: Path) -> None:
    started = time.monotonic()
    env = {**os.environ, "CHAOS_SAMPLE_EVERY_S": "3", "CHAOS_WARMUP_MIN_S": "6"}
    done = subprocess.run(
        [sys.executable, "-m", "raftcron.chaos", "run", "--scenario", "endurance",
         "--minutes", "0.6", "--seed", "27", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False,
        env=env,
    )
    print(done.stdout)
    print(done.stderr[-3000:], file=sys.stderr)
    assert done.returncode != 1, "a safety violation or a harness error"
    [folder] = list(tmp_path.glob("*/endurance"))
    events = [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]
    samples = [e for e in events if e["kind"] == "resource"]
    assert {e["node"] for e in samples} == {"n1", "n2", "n3"}
    assert all(e["rss_bytes"] > 0 and e["threads"] >= 1 and e["fds"] >= 3 for e in samples)
    assert all(0 < e["rss_anon_bytes"] + e["rss_file_bytes"] <= e["rss_bytes"] for e in samples)
    for node in ("n1", "n2", "n3"):  # a process sampled right after its start is still small
        mine = [e for e in samples if e["node"] == node]
        assert max(e["rss_bytes"] for e in mine) > 30 * MIB
        assert max(e["threads"] for e in mine) > 1 and max(e["log_entries"] or 0
                                                           for e in mine) > 0
    assert any(e["kind"] == "state_size" for e in events)
    results = json.loads((folder / "results.json").read_text())["results"]
    [slope_result] = [r for r in results if r["name"] == "resources level off"]
    assert slope_result["counts"]["samples"] == len(samples) >= 3 * 8
    assert "figure" in done.stdout and "rss_anon_bytes" in done.stdout  # the table is printed
    assert time.monotonic() - started < SMOKE_TIMEOUT_S
