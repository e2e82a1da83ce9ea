"""`raftcron cluster doctor`'s judgement (cluster/ops/doctor.py) over members' own views."""

import argparse
import copy

import pytest

from raftcron.cluster.commandline import opsargs
from raftcron.cluster.commandline.cliparts import UsageError
from raftcron.cluster.ops.doctor import PROBLEM, WARNING, Thresholds, diagnose, rows

GiB, MiB = 1024**3, 1024**2
BUDGET = 512 * MiB


def view(node: str, *, role: str = "follower", leader: str | None = "n1", applied: int = 100,
         commit: int = 100, **changes):
    base = {
        "node": node, "role": role, "leader": leader, "term": 3, "commit_index": commit,
        "applied_index": applied, "ready": True, "has_quorum": role == "leader",
        "version": "0.1.0", "cluster_name": "prod", "release_level": 3,
        "state": {"now_ms": 1_700_000_000_000, "jobs": 40, "level": 3, "finalized": True,
                  "state_bytes": 10 * MiB, "budget_bytes": BUDGET},
        "clock": {"skew_ms": 4, "skewed": False, "max_skew_ms": 1_000, "majority_ms": 1},
        "storage": {"healthy": True, "problem": None, "free_bytes": 50 * GiB,
                    "log_entries": 1_200, "snapshot_index": 90, "snapshot_age_s": 3_700.0},
        "archive": {"rows": 1_204_311, "row_bytes": 400 * MiB, "file_bytes": 310 * MiB,
                    "oldest_finished_ms": None, "pending_jobs": 12, "durable_index": 99,
                    "problem": None},
    }
    for key, value in changes.items():
        if isinstance(value, dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


def healthy():
    return {"n1": view("n1", role="leader"), "n2": view("n2"), "n3": view("n3")}


def found(views, **kwargs):
    return {(f.severity, f.node, f.check) for f in diagnose(views, **kwargs)}


def test_a_healthy_cluster_needs_nothing():
    assert diagnose(healthy()) == []
    table = rows(healthy())
    assert [row[0] for row in table] == ["n1", "n2", "n3"]
    assert table[0][1:4] == ["leader", 3, 0] and table[0][7] == "1.0h"
    assert table[0][8] == "1,204,311 / 310 MiB / -"


def test_the_archive_is_shown_and_a_writer_far_behind_is_named():
    views = healthy()
    views["n2"]["archive"] = None
    views["n3"]["archive"] = {**views["n3"]["archive"], "pending_jobs": 50_000}
    assert found(views) == {(WARNING, "n3", "archive")}
    assert "50,000 jobs wait" in diagnose(views)[0].detail
    table = rows(views)
    assert table[1][8] == "off"


def test_an_archive_filling_from_a_peer_is_named_and_so_is_a_gap_no_member_can_give():
    views = healthy()
    views["n2"]["archive"] = {**views["n2"]["archive"], "missing_jobs": 1_500,
                              "unanswered_gap": None}
    assert found(views) == {(WARNING, "n2", "archive")}
    assert "misses 1,500 jobs" in diagnose(views)[0].detail
    assert "yet" not in diagnose(views)[0].detail
    views["n2"]["archive"]["unanswered_gap"] = [4_001, 5_501]
    assert "numbered 4,001 to 5,500 yet" in diagnose(views)[0].detail


def test_each_kind_of_trouble_is_named_with_its_member():
    views = healthy()
    views["n3"] = None
    assert found(views, errors={"n3": "refused"}) == {(PROBLEM, "n3", "reachable")}
    assert "refused" in diagnose(views, errors={"n3": "refused"})[0].detail

    views = healthy()
    views["n2"] = view("n2", applied=5_000, commit=9_000)
    views["n1"] = view("n1", role="leader", applied=9_000, commit=9_000)
    views["n3"]["applied_index"] = 9_000
    assert found(views) == {(WARNING, "n2", "lag")}
    assert found(views, thresholds=Thresholds(max_lag_entries=5_000)) == set()

    views = healthy()
    views["n2"] = view("n2", clock={"skewed": True, "skew_ms": 4_000})
    views["n3"] = view("n3", storage={"healthy": False, "problem": "disk full"})
    views["n1"] = view("n1", role="leader", storage={"free_bytes": 100 * 1024**2,
                                                     "log_entries": 2_000_000})
    assert found(views) == {(PROBLEM, "n2", "clock"), (PROBLEM, "n3", "storage"),
                            (PROBLEM, "n1", "disk"), (WARNING, "n1", "log")}


def test_leadership_trouble():
    views = healthy()
    for member in views.values():
        member["leader"] = None
    assert (PROBLEM, "*", "leader") in found(views)

    views = healthy()
    views["n3"]["leader"] = "n3"
    assert (PROBLEM, "*", "leader") in found(views)

    views = healthy()
    views["n1"] = None  # the leader the others name is down
    assert {(PROBLEM, "n1", "reachable"), (PROBLEM, "n1", "leader")} <= found(views)

    views = healthy()
    views["n1"]["has_quorum"] = False
    assert found(views) == {(PROBLEM, "n1", "quorum")}


def test_mixed_versions_are_a_warning():
    views = healthy()
    views["n2"] = view("n2", version="0.2.0")
    assert found(views) == {(WARNING, "*", "version")}


def test_a_member_that_names_another_cluster_is_a_problem():
    views = healthy()
    views["n3"]["cluster_name"] = "staging"  # a peer of another cluster in the members list
    assert found(views) == {(PROBLEM, "n3", "cluster")}
    [finding] = diagnose(views)
    assert "'staging'" in finding.detail and "'prod'" in finding.detail

    views = {"n1": view("n1", role="leader"), "n2": view("n2", cluster_name="staging")}
    assert found(views) == {(PROBLEM, "*", "cluster")}  # no majority: both named
    assert "'prod': n1; 'staging': n2" in diagnose(views)[0].detail


def test_a_member_of_a_release_before_cluster_names_is_not_judged_by_it():
    views = healthy()
    views["n2"]["cluster_name"] = None
    del views["n3"]["cluster_name"]
    assert found(views) == set()


def test_an_old_snapshot_is_a_warning_only_when_entries_came_after_it():
    two_days_s = 2 * 86_400.0
    views = healthy()  # each member applied 100, its snapshot covers 90
    views["n2"] = view("n2", storage={"snapshot_age_s": two_days_s})
    assert found(views) == {(WARNING, "n2", "snapshot")}
    [finding] = diagnose(views)
    assert "2.0d old and 10 entries were applied since" in finding.detail
    assert found(views, thresholds=Thresholds(max_snapshot_age_s=3 * 86_400)) == set()

    views = healthy()  # a quiet cluster: nothing since its old snapshot
    views["n2"] = view("n2", storage={"snapshot_age_s": two_days_s, "snapshot_index": 100})
    assert found(views) == set()

    views = healthy()  # no snapshot yet: its age is not known, the log size judges it
    views["n2"] = view("n2", storage={"snapshot_age_s": None, "snapshot_index": 0})
    assert found(views) == set()


def test_nothing_answered_is_only_unreachable_members():
    views = {node: None for node in ("n1", "n2", "n3")}
    assert found(copy.deepcopy(views)) == {(PROBLEM, n, "reachable") for n in views}


# -- the state budget (DESIGN.md §9.1) ---------------------------------------------------------


def test_a_state_near_its_budget_is_a_warning_and_at_it_a_problem():
    at_80_pct = -(-BUDGET * 8 // 10)  # the first byte count at or over 80%
    views = healthy()
    views["n2"] = view("n2", state={"state_bytes": at_80_pct})
    views["n3"] = view("n3", state={"state_bytes": at_80_pct - 1})  # just under
    assert found(views) == {(WARNING, "n2", "budget")}
    [finding] = diagnose(views)
    assert finding.detail.startswith("the state is 80% of its budget (409.6 MiB of 512.0 MiB)")
    for advice in ("finish or cancel work", "lower retention", "raftcron settings budget SIZE"):
        assert advice in finding.detail
    assert found(views, thresholds=Thresholds(budget_warn_pct=90)) == set()

    views["n3"] = view("n3", state={"state_bytes": BUDGET})  # full: a problem, not a warning
    views["n1"] = view("n1", role="leader", state={"state_bytes": BUDGET + 5 * MiB})
    assert found(views) == {(WARNING, "n2", "budget"), (PROBLEM, "n3", "budget"),
                            (PROBLEM, "n1", "budget")}
    full = {f.node: f.detail for f in diagnose(views) if f.severity == PROBLEM}
    assert full["n3"].startswith("the state is 100% of its budget (512.0 MiB of 512.0 MiB)")
    assert "new jobs are refused" in full["n3"] and "raftcron settings budget SIZE" in full["n3"]
    assert "(517.0 MiB of 512.0 MiB)" in full["n1"]


def test_a_percentage_just_under_the_budget_is_not_rounded_up_to_100():
    views = healthy()
    views["n2"] = view("n2", state={"state_bytes": BUDGET - MiB})  # 99.8%
    [finding] = diagnose(views)
    assert (finding.severity, finding.check) == (WARNING, "budget")
    assert finding.detail.startswith("the state is 99% of its budget")


def test_before_the_cluster_is_finalized_there_is_no_budget_to_judge():
    views = healthy()
    for member in views.values():  # an upgrade in progress: a member of the last release
        member["state"] = {**member["state"], "level": 2, "finalized": False,
                           "state_bytes": 900 * MiB, "budget_bytes": None}
    del views["n3"]["release_level"]
    assert found(views) == set()


def test_the_budget_warning_share_is_a_doctor_flag():
    parser = argparse.ArgumentParser()
    opsargs.add_commands(parser.add_subparsers(dest="command"))

    def thresholds(*flags: str) -> Thresholds:
        return opsargs.doctor_thresholds(parser.parse_args(["cluster", "doctor", *flags]))

    assert thresholds() == Thresholds()
    assert thresholds("--budget-warn-pct", "90").budget_warn_pct == 90
    assert thresholds("--max-snapshot-age-h", "2").max_snapshot_age_s == 7_200
    for wrong in ("-1", "101"):
        with pytest.raises(UsageError, match="--budget-warn-pct"):
            thresholds("--budget-warn-pct", wrong)


# -- the upgrade gate (DESIGN.md §9.0) ---------------------------------------------------------


def not_finalized(views):
    for member in views.values():
        member["state"] = {**member["state"], "level": 2, "finalized": False,
                           "budget_bytes": None}
    return views


def test_a_cluster_every_member_of_which_could_be_finalized_is_a_warning():
    views = not_finalized(healthy())
    assert found(views) == {(WARNING, "*", "finalize")}
    [finding] = diagnose(views)
    assert "not finalized" in finding.detail and "raftcron cluster finalize" in finding.detail


def test_a_cluster_mid_upgrade_is_not_told_to_finalize():
    views = not_finalized(healthy())
    views["n3"]["release_level"] = 2
    assert found(views) == set()
    views = not_finalized(healthy())
    del views["n2"]["release_level"]  # a member of a release before the gate
    assert found(views) == set()
    views = not_finalized(healthy())
    views["n3"] = None  # its release is not known: finalize would refuse too
    assert found(views) == {(PROBLEM, "n3", "reachable")}


def test_a_member_of_an_older_release_in_a_finalized_cluster_is_a_problem():
    views = healthy()
    del views["n2"]["release_level"]  # a release before the gate
    views["n3"]["release_level"] = 2
    assert found(views) == {(PROBLEM, "n2", "release"), (PROBLEM, "n3", "release")}
    details = {f.node: f.detail for f in diagnose(views)}
    assert "names no release level" in details["n2"]
    assert "release level 2 but the cluster is finalized at level 3" in details["n3"]

    # One member that applied the Finalize is enough: the log holds it, the others follow.
    views = not_finalized(healthy())
    views["n1"]["state"] = {**views["n1"]["state"], "level": 3, "finalized": True}
    views["n3"]["release_level"] = 2
    assert found(views) == {(PROBLEM, "n3", "release")}
