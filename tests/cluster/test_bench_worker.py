"""The worker runtime's bench runs every job it hands out to an ack, and refuses bad sizes."""

from __future__ import annotations

import json

import pytest

from raftcron.cluster.dev.bench import workerbench


def test_every_job_handed_out_is_claimed_run_and_acked_once() -> None:
    figures = workerbench.measure(jobs=700, concurrency=8, runs=1)
    assert figures["worker_runtime_counts"] == {"claimed": 700, "succeeded": 700}
    assert figures["worker_runtime_us_per_job"] > 0


def test_the_figures_print_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert workerbench.main(["--jobs", "200", "--concurrency", "4", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["worker_runtime_jobs"] == 200
    assert figures["worker_runtime_counts"]["succeeded"] == 200


@pytest.mark.parametrize("flags", [["--jobs", "0"], ["--concurrency", "0"]])
def test_a_size_below_one_is_refused(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        workerbench.main(flags)
    assert exit_info.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err
