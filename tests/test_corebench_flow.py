"""The core benchmark's flow-control comparison runs and says what it measured (a smoke run:
the figures themselves are the benchmark's, never a test's)."""

import json

from raftcron.cluster.dev import corebench


def test_the_flow_comparison_reports_every_mode_against_off(capsys):
    assert corebench.main(["--flow", "1", "--quick"]) == 0
    figures = json.loads(capsys.readouterr().out)["flow"]
    for batch in ("batch_1", "batch_100"):
        assert set(figures[batch]) == set(corebench.FLOW_MODES)
        assert figures[batch]["off"]["of_off"] == 1.0
        assert figures[batch]["final"]["cpu_of_final"] == 1.0
        assert all(mode["median_per_s"] > 0 and mode["cpu_median_per_s"] > 0
                   for mode in figures[batch].values())


def test_the_fair_claims_comparison_reports_each_key_count_against_plain(capsys):
    assert corebench.main(["--fair-claims", "1", "--quick"]) == 0
    figures = json.loads(capsys.readouterr().out)["fair_claims"]
    assert set(figures) == {"keys_0", "keys_2", "keys_1000"}
    assert figures["keys_0"]["of_plain"] == 1.0
    assert all(entry["claim_us_median"] > 0 for entry in figures.values())
