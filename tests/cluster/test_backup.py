"""Backup from a live cluster, restore into a new one (DESIGN.md §8.4): the same jobs and
schedules, every restored member agreeing, the backup naming the cluster it came from; a
damaged file or a used data dir is refused. With `--with-archive` the archive comes too
(DESIGN.md §9.2): the restored members find the archived jobs by id and by payload field."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from drains import drain, keep_succeeded
from test_archive import job_on, search, submit, wait_archived

from raftcron.cluster.clients.client import Client
from raftcron.cluster.commandline import main as cli
from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster
from raftcron.cluster.ops import backup
from raftcron.cluster.storage.snapshots import SNAPSHOT_NAME


def test_backup_then_restore_into_a_new_cluster_keeps_every_job_and_schedule(
    cluster_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = cluster_factory.open(cluster_name="prod")
    leader = cluster.leader()
    submitted = []
    for n in range(20):
        status, job, _ = cluster.request(leader, "POST", "/v1/jobs",
                                         {"task": "t", "payload": {"n": n}, "delay_ms": 3_600_000})
        assert status == 201
        submitted.append(job)
    status, _, _ = cluster.request(leader, "PUT", "/v1/schedules/nightly",
                                   {"cron": "0 3 * * *", "job": {"task": "report"}})
    assert status == 201
    connect = ",".join(node.url for node in cluster.nodes)
    out = tmp_path / "cluster.backup"

    # Writes keep coming while the backup is made: it is a state as of one entry, whole.
    stop, under_load = threading.Event(), []

    def load() -> None:
        for n in range(10_000):
            if stop.is_set():
                return
            answer = cluster.request(leader, "POST", "/v1/jobs", {"task": "load", "payload": n})
            if answer[0] == 201:
                under_load.append(answer[1]["id"])

    writer = threading.Thread(target=load)
    writer.start()
    try:
        deadline = time.monotonic() + 30
        while len(under_load) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        before_backup = list(under_load)
        code = cli.main(["backup", "--json", "--out", str(out), "--connect", connect])
    finally:
        stop.set()
        writer.join(30)
    printed, err = capsys.readouterr()
    assert code == 0, err
    info = json.loads(printed)
    assert info["schedules"] == 1 and info["jobs"] >= 20 + len(before_backup) >= 25
    assert out.stat().st_size == info["size_bytes"]
    assert not Path(str(out) + ".partial").exists()
    # The backup names the cluster it came from: in its body (what the command prints), in
    # the answer's header, and in words for a person.
    assert info["cluster_name"] == "prod"
    with Client(connect) as client:
        served = client.download_backup(str(tmp_path / "again.backup"))
    assert served["cluster_name"] == "prod"
    assert cli.main(["backup", "--out", str(tmp_path / "again.backup"), "--connect", connect]) == 0
    assert "backup of cluster prod from n" in capsys.readouterr().out

    # Restored into a cluster of another name: allowed (a clone), and said plainly.
    fresh = LocalCluster(tmp_path / "restored", nodes=3, raft=FAST_RAFT, cluster_name="staging")
    cluster_factory.clusters.append(fresh)
    for node in fresh.configure():
        code = cli.main(["restore", "--from", str(out), "--config", str(node.config_path)])
        printed, err = capsys.readouterr()
        assert code == 0, err
        assert f"at log index {info['index']}" in printed
        assert "of cluster staging from a backup of cluster prod" in printed
        assert "note: the backup is of cluster prod" in printed
    for node in fresh.configure():  # each member holds the backup's state, byte for byte
        written = (node.data_dir / SNAPSHOT_NAME).read_bytes()
        _, restored_info = backup.check(written, str(node.data_dir))
        assert restored_info.digest == info["digest"] and restored_info.index == info["index"]
        assert restored_info.members == sorted(n.raft_address for n in fresh.nodes)
    node = fresh.configure()[0]
    code = cli.main(["restore", "--from", str(out), "--config", str(node.config_path)])
    assert code == 1 and "is not empty" in capsys.readouterr().err

    fresh.start()
    fresh.wait_ready()
    restored = {job["id"]: job for job in fresh.list_jobs(fresh.leader())}
    for job in submitted:
        assert restored[job["id"]]["payload"] == job["payload"], job
        assert restored[job["id"]]["status"] == "scheduled"
    assert set(before_backup) <= set(restored)  # acknowledged before it was asked: in it
    assert len(restored) == info["jobs"]  # exactly the state the file held
    status, schedule, _ = fresh.request(fresh.leader(), "GET", "/v1/schedules/nightly")
    assert status == 200 and schedule["spec"]["cron"] == "0 3 * * *"
    assert fresh.request(fresh.leader(), "GET", "/v1/cluster")[1]["cluster_name"] == "staging"
    # The new cluster takes writes, and its members agree on every entry.
    status, _, _ = fresh.request(fresh.leader(), "POST", "/v1/jobs", {"task": "after"})
    assert status == 201
    digests = fresh.audit()
    assert len(set(digests.values())) == 1 and len(digests) == 3, digests


@pytest.mark.parametrize("damage", ["flip_a_byte", "cut_in_half", "not_a_snapshot"])
def test_a_damaged_backup_is_refused_naming_the_damage(
    shared_cluster: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    damage: str,
) -> None:
    out = tmp_path / "b.snapshot"
    connect = ",".join(node.url for node in shared_cluster.nodes)
    assert cli.main(["backup", "--out", str(out), "--connect", connect]) == 0
    data = bytearray(out.read_bytes())
    if damage == "flip_a_byte":
        data[len(data) // 2] ^= 0x40
    elif damage == "cut_in_half":
        del data[len(data) // 2:]
    else:
        data = bytearray(b"{}" * 40)
    out.write_bytes(bytes(data))
    capsys.readouterr()
    target = LocalCluster(tmp_path / "target", nodes=1).configure()[0]
    code = cli.main(["restore", "--from", str(out), "--config", str(target.config_path)])
    err = capsys.readouterr().err
    assert code == 1 and str(out) in err, err
    expected = {"flip_a_byte": "checksum", "cut_in_half": "bytes of snapshot body",
                "not_a_snapshot": "not a raftcron snapshot"}[damage]
    assert expected in err, err
    assert not target.data_dir.exists() or not any(target.data_dir.iterdir())


def test_a_backup_with_its_archive_restores_the_archived_jobs_on_every_new_member(
    cluster_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = cluster_factory.open(cluster_name="prod")
    keep_succeeded(cluster, 5)
    ids = submit(cluster, "billing", 12)  # customer ids 0..11
    drain(cluster, "billing", result=lambda job: {"done": job["payload"]["customer"]})
    evicted = ids[:7]  # the newest 5 stay in the state
    wait_archived(cluster, evicted, "the 7 evicted jobs")
    archived = {job_id: job_on(cluster, cluster.nodes[0], job_id) for job_id in evicted}
    connect = ",".join(node.url for node in cluster.nodes)
    out = tmp_path / "prod.backup"

    code = cli.main(["backup", "--json", "--with-archive", "--out", str(out),
                     "--connect", connect])
    printed, err = capsys.readouterr()
    assert code == 0, err
    info = json.loads(printed)
    assert info["archive"]["file"] == f"{out}.archive" and info["archive"]["rows"] == 7, info
    assert Path(f"{out}.archive").stat().st_size == info["archive"]["size_bytes"]
    assert sorted(path.name for path in tmp_path.iterdir() if path.is_file()) == [
        "prod.backup", "prod.backup.archive"]  # no partial file left
    code = cli.main(["backup", "--with-archive", "--out", str(tmp_path / "again.backup"),
                     "--connect", connect])
    assert code == 0 and "archived jobs" in capsys.readouterr().out

    fresh = LocalCluster(tmp_path / "restored", nodes=3, raft=FAST_RAFT, cluster_name="prod")
    cluster_factory.clusters.append(fresh)
    for node in fresh.configure():
        code = cli.main(["restore", "--from", str(out), "--config", str(node.config_path)])
        printed, err = capsys.readouterr()
        assert code == 0, err
        assert f"archive: 7 archived jobs restored from {out}.archive" in printed, printed
    fresh.start()
    fresh.wait_ready()
    for node in fresh.nodes:
        for job_id in evicted:  # by id: as it was archived, payload, result and all
            assert job_on(fresh, node, job_id) == archived[job_id], (node.node_id, job_id)
        for job_id in ids[7:]:
            view = job_on(fresh, node, job_id)
            assert view is not None and "archived" not in view
        found = search(fresh, node, **{"payload.customer.id": 2, "created_from_ms": 0})
        assert [(job["id"], job["archived"]) for job in found] == [(ids[2], True)]
        # One search over both halves: every job once, the archived ones from the archive.
        every = search(fresh, node, task="invoice", limit=4)
        assert [job["id"] for job in every] == sorted(ids, reverse=True)
