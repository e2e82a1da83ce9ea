"""The operator's CLI against a real cluster: tables for people, JSON for scripts, exit codes."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from raftcron.cluster.clients.client import AsyncClient
from raftcron.cluster.commandline import main as cli
from raftcron.cluster.dev.localcluster import LocalCluster


@pytest.fixture
def run(
    shared_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str, str]]:
    connect = ",".join(node.url for node in shared_cluster.nodes)

    def run_cli(*words: str) -> tuple[int, str, str]:
        command, *rest = words
        code = cli.main(
            [command, *rest[:1], "--connect", connect, *rest[1:]]
            if command in ("jobs", "schedules", "cluster", "notifications", "queues")
            else [command, "--connect", connect, *rest]
        )
        out, err = capsys.readouterr()
        return code, out, err

    return run_cli


def test_submit_prints_the_job_and_json_gives_it_to_scripts(run, unique):
    key = unique("cli-key")
    code, out, _ = run("submit", "--key", key, "shell", "--", "sh", "-c", "echo hi")
    assert code == 0 and "shell" in out and key in out
    code, out, _ = run("submit", "--json", "--key", key, "shell", "--", "sh", "-c", "echo hi")
    job = json.loads(out)
    assert code == 0 and job["key"] == key and job["payload"] == {"argv": ["sh", "-c", "echo hi"]}
    assert job["created"] is False  # the key returned the first job


def test_submit_gives_a_job_a_rate_key_and_a_fairness_key(run, unique):
    queue = unique("cli-flow")
    code, out, err = run("submit", "--json", "--queue", queue, "--delay", "1h",
                         "--rate", "cust-42=10/1m", "--fairness", "cust-42:3", "noop")
    assert code == 0, err
    job = json.loads(out)
    assert job["rate"] == {"key": "cust-42", "max": 10, "per_ms": 60_000}
    assert job["fairness"] == {"key": "cust-42", "weight": 3}
    code, out, _ = run("jobs", "show", str(job["id"]))
    assert code == 0 and "rate: key=cust-42 max=10 per_ms=60000" in out
    assert "fairness: key=cust-42 weight=3" in out
    code, _, err = run("submit", "--rate", "cust-42", "noop")
    assert code == 2 and "--rate takes KEY=MAX/PERIOD" in err
    code, _, err = run("submit", "--fairness", "cust:x", "noop")
    assert code == 2 and "--fairness takes KEY[:WEIGHT]" in err


def test_jobs_list_show_cancel_and_retry(run, unique):
    queue = unique("cli-queue")
    _, out, _ = run("submit", "--json", "--queue", queue, "--delay", "1h", "noop")
    job_id = json.loads(out)["id"]
    code, out, _ = run("jobs", "list", "--queue", queue)
    assert code == 0 and str(job_id) in out and "scheduled" in out
    code, out, _ = run("jobs", "show", str(job_id), "--json")
    assert code == 0 and json.loads(out)["status"] == "scheduled"
    code, out, _ = run("jobs", "cancel", str(job_id), "--reason", "testing")
    assert code == 0 and "cancelled" in out
    code, out, _ = run("jobs", "retry", str(job_id), "--json")
    assert code == 0 and json.loads(out)["status"] == "scheduled"


def test_schedules_put_list_preview_pause_resume_delete(run, unique):
    name = unique("cli-sched")
    code, out, err = run(
        "schedules",
        "put",
        name,
        "--cron",
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "--task",
        "shell",
        "--",
        "true",
    )
    assert code == 0, err
    assert name in out and "America/New_York" in out
    code, out, _ = run("schedules", "preview", name, "--count", "2", "--json")
    fires = json.loads(out)
    assert code == 0 and len(fires) == 2 and fires[0]["local"].endswith(("-05:00", "-04:00"))
    assert run("schedules", "pause", name)[0] == 0
    _, out, _ = run("schedules", "show", name, "--json")
    assert json.loads(out)["paused"] is True
    assert run("schedules", "resume", name)[0] == 0
    code, out, _ = run("schedules", "list")
    assert code == 0 and name in out
    assert run("schedules", "delete", name)[0] == 0
    code, _, err = run("schedules", "show", name)
    assert code == 1 and "not_found" in err


def test_queues_put_show_pause_resume_and_list(run, unique):
    queue = unique("cli-q")
    code, out, err = run("queues", "put", queue, "--concurrency-max", "3", "--rate", "10/1s")
    assert code == 0, err
    assert queue in out and "10/1000ms" in out and "active" in out
    assert run("queues", "pause", queue)[0] == 0
    _, out, _ = run("queues", "show", queue, "--json")
    view = json.loads(out)
    assert (view["paused"], view["concurrency_max"], view["rate_limit"]) == (
        True, 3, {"max": 10, "per_ms": 1_000}
    )
    assert run("queues", "resume", queue)[0] == 0
    code, out, _ = run("queues", "list")
    assert code == 0 and queue in out
    assert view["rate_rule"] == "window"
    code, _, err = run("queues", "put", queue, "--rate", "fast")
    assert code == 2 and "--rate" in err
    code, _, err = run("queues", "put", queue, "--burst", "20")
    assert code == 2 and "--burst needs --rate" in err
    code, out, err = run("queues", "put", queue, "--rate", "10/1s", "--burst", "20")
    assert code == 0, err
    assert "10/1000ms burst 20" in out
    _, out, _ = run("queues", "show", queue, "--json")
    assert json.loads(out)["rate_rule"] == "bucket"


def test_jobs_retry_and_delete_by_filter(run, unique):
    queue = unique("cli-bulk")
    ids = []
    for _ in range(3):
        _, out, _ = run("submit", "--json", "--queue", queue, "--delay", "1h", "noop")
        ids.append(json.loads(out)["id"])
    assert run("jobs", "cancel", "--queue", queue, "--yes")[0] == 0
    code, out, _ = run("jobs", "retry", "--queue", queue, "--status", "cancelled", "--max", "2",
                       "--yes")
    assert code == 0 and out == "retried 2 of 2 matching jobs\n"
    code, out, _ = run("jobs", "delete", "--queue", queue, "--status", "cancelled", "--yes",
                       "--json")
    assert code == 0 and json.loads(out)["changed"] == 1
    code, out, _ = run("jobs", "show", str(ids[2]))  # deleted: answered from the archive
    assert code == 0 and "cancelled (archived)" in out
    code, _, err = run("jobs", "delete", "--yes")
    assert code == 2 and "at least one filter" in err
    code, _, err = run("jobs", "cancel", str(ids[0]), "--queue", queue)
    assert code == 2 and "not both" in err


def test_a_refused_request_exits_1_with_one_clear_line(run, unique):
    code, out, err = run(
        "schedules", "put", unique("bad"), "--cron", "61 * * * *", "--task", "noop"
    )
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "minute" in err and "61" in err


def test_a_bad_command_line_exits_2(run):
    code, _, err = run("submit", "--delay", "soon", "noop")
    assert code == 2 and "--delay" in err
    code, _, err = run("submit", "noop", "--", "echo")
    assert code == 2 and "shell task" in err


def test_an_unreachable_cluster_exits_3(capsys):
    code = cli.main(["cluster", "status", "--connect", "http://127.0.0.1:9", "--deadline", "1"])
    assert code == 3 and "unavailable" in capsys.readouterr().err


@pytest.mark.parametrize("deadline", ["601", "0", "-1"])
def test_a_deadline_past_what_the_cluster_remembers_of_a_request_is_refused(capsys, deadline):
    """A retry after the cluster forgot its request id would be applied twice."""
    code = cli.main(["cluster", "status", "--connect", "http://127.0.0.1:9",
                     "--deadline", deadline])
    assert code == 2 and "--deadline must be more than 0 and at most 600 s" in (
        capsys.readouterr().err)


def test_the_client_refuses_a_retry_deadline_past_what_the_cluster_remembers():
    with pytest.raises(ValueError, match="retry_deadline_s"):
        AsyncClient("http://127.0.0.1:9", retry_deadline_s=3_600)


def test_cluster_status_shows_every_member_and_one_leader(run, shared_cluster):
    code, out, _ = run("cluster", "status")
    assert code == 0
    rows = [line.split() for line in out.splitlines()[2:]]
    assert sorted(row[0] for row in rows) == ["n1", "n2", "n3"]
    assert [row[2] for row in rows].count("leader") == 1


def test_audit_merges_every_member_s_trail_newest_first_and_says_what_it_lacks(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str], unique
):
    """Each node records what it was asked; `raftcron audit` is the union of the trails."""
    connect = ",".join(node.url for node in cluster.nodes)
    spec = {"every": "1h", "job": {"task": "t"}}
    names = {}
    for node in cluster.nodes:  # one admin action through each node
        names[node.node_id] = unique(f"audit-{node.node_id}")
        status, _, _ = cluster.request(node, "PUT", f"/v1/schedules/{names[node.node_id]}", spec)
        assert status == 201
    code = cli.main(["audit", "--json", "--limit", "1000", "--connect", connect])
    out, err = capsys.readouterr()
    assert code == 0, err
    merged = json.loads(out)
    ours = [e for e in merged["entries"] if e["path"].rsplit("/", 1)[-1] in names.values()]
    assert [e["node"] for e in ours] == [node.node_id for node in reversed(cluster.nodes)]
    times = [e["time_ms"] for e in merged["entries"]]
    assert times == sorted(times, reverse=True) and merged["missing"] == []

    stopped = cluster.nodes[2]
    cluster.stop(stopped)
    code = cli.main(["audit", "--connect", connect])
    out, err = capsys.readouterr()
    assert code == 3 and f"lacks the records of {stopped.node_id}" in err, err
    assert names[cluster.nodes[0].node_id] in out and names[stopped.node_id] not in out
    code = cli.main(["audit", "--limit", "0", "--connect", connect])
    assert code == 2 and "--limit must be between 1 and 1000" in capsys.readouterr().err


def test_cluster_doctor_says_nothing_needs_attention_then_names_a_member_that_is_down(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
):
    connect = ",".join(node.url for node in cluster.nodes)
    code = cli.main(["cluster", "doctor", "--connect", connect])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "nothing needs attention" in out and out.count("0.1.0") == 3, out
    code = cli.main(["cluster", "doctor", "--json", "--connect", connect])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["findings"] == []
    for node_view in report["members"].values():
        storage = node_view["storage"]
        assert storage["healthy"] and storage["free_bytes"] > 0 and storage["log_entries"] >= 1

    follower = cluster.followers()[0]
    cluster.stop(follower)
    code = cli.main(["cluster", "doctor", "--connect", connect])
    out, err = capsys.readouterr()
    assert code == 4, out + err
    assert f"problem: {follower.node_id}: reachable" in out
    code = cli.main(["cluster", "doctor", "--min-free-mb", "-1", "--connect", connect])
    assert code == 2 and "--min-free-mb must be 0 or more" in capsys.readouterr().err


def test_notifications_put_list_show_delete_with_the_secret_from_a_file(run, unique, tmp_path):
    name = unique("cli-hook")
    secret = tmp_path / "secret"
    secret.write_text("a-secret-from-a-file-0123\n")
    code, out, err = run("notifications", "put", name, "--url", "https://hooks.example.com/x",
                         "--events", "dead_letter, misfire", "--secret-file", str(secret))
    assert code == 0 and name in out and "dead_letter,misfire" in out, err
    code, out, _ = run("notifications", "list", "--json")
    [shown] = [n for n in json.loads(out) if n["name"] == name]
    assert (shown["pending"], shown["lost"]) == (0, 0) and "secret" not in shown
    code, out, _ = run("notifications", "show", name)
    assert code == 0 and "https://hooks.example.com/x" in out and "a-secret" not in out
    code, _, err = run("notifications", "put", name, "--url", "ftp://x", "--events", "misfire",
                       "--secret-file", str(secret))
    assert code == 1 and "url" in err
    code, _, err = run("notifications", "put", name, "--url", "https://x.example.com/",
                       "--events", "misfire", "--secret-file", str(tmp_path / "missing"))
    assert code == 2 and "cannot read" in err
    assert run("notifications", "delete", name)[0] == 0
    code, _, err = run("notifications", "show", name)
    assert code == 1 and "not_found" in err
