"""A rolling upgrade from the previous release (DESIGN.md §8.4, §9.0; docs/operations/upgrade.md):
its wheel is built from its git commit into a venv of its own, three nodes run it, and they are
upgraded one at a time under writes. Along the way each release installs a snapshot the other
made (a node of this release rejoins empty from a leader of the previous one, and the other
way round) and loads its own data dir written by the other. While releases are mixed the
cluster cannot be finalized (the upgrade gate names the members still on the previous
release) and settings are refused; once every member runs this release it is finalized, the
settings take effect on every member, and a node of the previous release can no longer join
(it refuses the snapshot of a finalized cluster, naming the version it does not read). At the end:
nothing acknowledged is lost and every member's digest is equal.

A wheel build (pip fetches the build backend from PyPI) and a cluster, 10-30 s: `make
integration` runs it with the other process tests, so `make test` and CI do (CI's clone has the
commit: it clones the whole history); `make upgrade` runs it alone, printing its figures
(marker `upgrade`). `PREVIOUS_RELEASE` names the commit; move it on at each release.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from writes import Writer, assert_every_write_on_every_member

from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster
from raftcron.cluster.dev.nodeprocesses import REPO_ROOT, LocalNode
from raftcron.scheduler.gate import RELEASE_LEVEL
from raftcron.scheduler.settings import Budget

pytestmark = [pytest.mark.processes, pytest.mark.upgrade]

# The last release of wave 2 (DESIGN.md §9.0): the previous release.
PREVIOUS_RELEASE = "a93257b2d3d5849beddb95e994a5787dc3974e52"


def build_previous_release(work: Path) -> str:
    """The python of a venv holding the previous release's wheel (its dependencies are this
    venv's: the pins did not change); built from the commit, never from this checkout."""
    source, wheels, venv = work / "src", work / "wheel", work / "venv"
    source.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", PREVIOUS_RELEASE],
                             capture_output=True, check=False)
    assert archive.returncode == 0, (
        f"git archive {PREVIOUS_RELEASE} failed (a shallow clone?): {archive.stderr!r}")
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
                   check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    [wheel] = wheels.glob("raftcron-*.whl")
    subprocess.run([*pip, "--python", python, "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


class MixedCluster(LocalCluster):
    """Each node runs the release it is given: the previous one from its own venv (isolated:
    -I ignores PYTHONPATH, which points at this checkout), or this one."""

    def __init__(self, base_dir: Path, old_python: str, **options: Any) -> None:
        super().__init__(base_dir, **options)
        self.old_python = old_python
        self.release: dict[str, str] = {}
        self.extra_args: dict[str, list[str]] = {}

    def command(self, node: LocalNode) -> list[str]:
        args = ["node", "--config", str(node.config_path), *self.extra_args.pop(node.node_id, [])]
        if self.release.get(node.node_id, "previous") == "previous":
            # The previous release's command module, before cluster/ had its rooms.
            return [self.old_python, "-I", "-u", "-m", "raftcron.cluster.cli", *args]
        return [self.python, "-m", "raftcron.cluster.commandline", *args]


def runs_this_release(cluster: LocalCluster, node: LocalNode) -> bool:
    """Only this release says its release level (the upgrade gate's, scheduler/gate.py)."""
    status, body, _ = cluster.request(node, "GET", "/healthz")
    return status == 200 and body.get("release_level") == RELEASE_LEVEL


def upgrade(cluster: MixedCluster, node: LocalNode, writer: Writer) -> None:
    """Stop the node (SIGTERM), start it on this release, and let writes flow again."""
    cluster.release[node.node_id] = "this"
    cluster.restart(node, sig=15)
    cluster.wait_ready(60)
    writer.wait_for(30)


def rejoin_empty(cluster: MixedCluster, node: LocalNode) -> None:
    """Lose the node's data and bring it back empty: it installs the leader's snapshot."""
    cluster.kill(node)
    shutil.rmtree(node.data_dir)
    for other in cluster.live_nodes():  # a snapshot made now, by whoever leads
        cluster.request(other, "POST", "/v1/cluster/compact")
    cluster.extra_args[node.node_id] = ["--rejoin-empty"]
    cluster.start_node(node)
    cluster.wait_for(lambda: any("rejoin_caught_up" in line for line in cluster.log_lines(node)),
                     60, f"{node.node_id} rejoining")
    assert any("snapshot_installed" in line for line in cluster.log_lines(node))


def finalize(cluster: MixedCluster, node: LocalNode) -> tuple[int, Any, Any]:
    return cluster.request(node, "POST", "/v1/cluster/finalize", {}, token=cluster.admin_token)


def settings_of(cluster: LocalCluster, node: LocalNode) -> dict[str, Any]:
    status, body, _ = cluster.request(node, "GET", "/v1/settings")
    assert status == 200, body
    return dict(body)


def refuse_to_rejoin_with_the_previous_release(cluster: MixedCluster, node: LocalNode) -> None:
    cluster.kill(node)
    shutil.rmtree(node.data_dir)
    for other in cluster.live_nodes():  # a snapshot of the finalized state, made now
        cluster.request(other, "POST", "/v1/cluster/compact")
    cluster.release[node.node_id] = "previous"
    cluster.extra_args[node.node_id] = ["--rejoin-empty"]
    cluster.start_node(node)
    cluster.wait_for(lambda: not node.running, 60, f"{node.node_id} of the previous release "
                     "stopping on the finalized snapshot")
    assert any("snapshot version 4 is not one this release reads" in line
               for line in cluster.log_lines(node)), cluster.log_lines(node)[-20:]
    cluster.release[node.node_id] = "this"


METERED = {"rate_limit": {"max": 5, "per_ms": 1_000}}
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def rate_rule(cluster: LocalCluster, node: LocalNode) -> Any:
    return cluster.request(node, "GET", "/v1/queues/metered", token=cluster.admin_token)[1][
        "rate_rule"]


def claimed_job(cluster: LocalCluster, node: LocalNode, queue: str) -> tuple[int, int]:
    """A job of its own queue, claimed: (id, token)."""
    token = cluster.admin_token
    status, job, _ = cluster.request(node, "POST", "/v1/jobs", {"task": "t", "queue": queue},
                                     token=token)
    assert status == 201, job
    claim = {"worker": "w-progress", "queues": [queue], "max": 1, "request_id": f"{queue}-claim"}
    status, claimed, _ = cluster.request(node, "POST", "/v1/claims", claim, token=token)
    assert status == 200 and claimed["jobs"], claimed
    return job["id"], claimed["jobs"][0]["token"]


def report_progress(cluster: LocalCluster, node: LocalNode, job: tuple[int, int],
                    request_id: str) -> tuple[int, Any, Any]:
    body = {"token": job[1], "progress": {"value": 0.5, "message": "half"},
            "request_id": request_id}
    return cluster.request(node, "POST", f"/v1/jobs/{job[0]}/heartbeat", body,
                           token=cluster.admin_token)


def progress_on(cluster: LocalCluster, node: LocalNode, job_id: int) -> Any:
    status, body, _ = cluster.request(node, "GET", f"/v1/jobs/{job_id}?consistent=1",
                                      token=cluster.admin_token)
    assert status == 200, body
    return body.get("progress")


def traceparent_on(cluster: LocalCluster, node: LocalNode, job_id: int) -> Any:
    status, body, _ = cluster.request(node, "GET", f"/v1/jobs/{job_id}?consistent=1",
                                      token=cluster.admin_token)
    assert status == 200, body
    return body.get("traceparent")


def test_a_rolling_upgrade_from_the_previous_release_under_writes_loses_nothing(
        tmp_path: Path) -> None:
    old_python = build_previous_release(tmp_path / "previous")
    with MixedCluster(tmp_path / "cluster", old_python, raft=FAST_RAFT) as cluster:
        cluster.start()
        cluster.wait_ready(60)
        n1, n2, n3 = cluster.nodes
        assert not any(runs_this_release(cluster, node) for node in cluster.nodes)
        # A rate limit put on the previous release: a token bucket (DESIGN.md §9.4).
        status, _, _ = cluster.request(n1, "PUT", "/v1/queues/metered", METERED,
                                       token=cluster.admin_token)
        assert status == 200
        with Writer(cluster, "upgrade") as writer:
            writer.wait_for(50)
            for node in cluster.nodes:  # each data dir holds a snapshot of the old release
                cluster.request(node, "POST", "/v1/cluster/compact")
            writer.wait_for(20)
            # n1 upgraded: it loads the old release's data dir and snapshot.
            upgrade(cluster, n1, writer)
            assert runs_this_release(cluster, n1)
            # Mixed: the gate stays shut, naming who is behind; settings are refused.
            refused = finalize(cluster, n1)
            assert refused[0] == 409 and refused[1]["error"]["code"] == "members_not_ready"
            assert "n2" in refused[1]["error"]["message"] and "n3" in refused[1]["error"]["message"]
            status, body, _ = cluster.request(n1, "PUT", "/v1/settings/budget",
                                              {"bytes": 64 << 20}, token=cluster.admin_token)
            assert (status, body["error"]["code"]) == (409, "not_finalized")
            assert rate_rule(cluster, n1) == "bucket"  # its old meaning, on this release too
            # A job's rate key, mixed: refused by both releases, each in its own words.
            rated = {"task": "t", "rate": {"key": "cust-1", "max": 1, "per_ms": 1_000}}
            status, body, _ = cluster.request(n1, "POST", "/v1/jobs", rated,
                                              token=cluster.admin_token)
            assert (status, body["error"]["code"]) == (409, "not_finalized"), body
            status, body, _ = cluster.request(n2, "POST", "/v1/jobs", rated,
                                              token=cluster.admin_token)
            assert status == 400 and body["error"]["field"] == "rate", body
            # A job's traceparent, mixed: refused in the body as rate is; from the header of
            # the client's trace, not recorded (the previous release would refuse the field).
            status, body, _ = cluster.request(n1, "POST", "/v1/jobs",
                                              {"task": "t", "traceparent": TRACEPARENT},
                                              token=cluster.admin_token)
            assert (status, body["error"]["code"]) == (409, "not_finalized"), body
            status, body, _ = cluster.request(n1, "POST", "/v1/jobs", {"task": "t"},
                                              token=cluster.admin_token,
                                              headers={"traceparent": TRACEPARENT})
            assert status == 201 and body["traceparent"] is None, body
            burst = {"rate_limit": {**METERED["rate_limit"], "burst": 10}}
            status, body, _ = cluster.request(n1, "PUT", "/v1/queues/metered", burst,
                                              token=cluster.admin_token)
            assert (status, body["error"]["code"]) == (409, "not_finalized")
            # A heartbeat's progress, mixed: a node of the previous release refuses the field by
            # name (a worker then heartbeats without it); through this release's node it is
            # applied by every member and ignored by every member alike (the previous release
            # reads only the fields it knows), the same state on each.
            mixed = claimed_job(cluster, n1, "progress-mixed")
            status, body, _ = report_progress(cluster, n2, mixed, "progress-mixed-old")
            assert (status, body["error"]["field"]) == (400, "progress"), body
            assert report_progress(cluster, n1, mixed, "progress-mixed-new")[0] == 200
            assert [progress_on(cluster, node, mixed[0]) for node in cluster.nodes] == [None] * 3
            digests = cluster.audit_entries(timeout_s=60)
            assert len(set(digests.values())) == 1 and len(digests) == 3, digests
            # Lost again, n1 installs a snapshot of a leader of the old release (n1 is down).
            rejoin_empty(cluster, n1)
            writer.wait_for(30)
            upgrade(cluster, n2, writer)
            # The old release's n3 installs a snapshot made by this release (n1 or n2 leads).
            rejoin_empty(cluster, n3)
            writer.wait_for(30)
            upgrade(cluster, n3, writer)
            assert all(runs_this_release(cluster, node) for node in cluster.nodes)
            for node in cluster.nodes:
                assert settings_of(cluster, node)["finalized"] is False
            # Every member runs this release: the gate opens, for every member alike.
            status, opened, _ = finalize(cluster, n2)
            assert status == 200 and opened["finalized_now"] is True, opened
            writer.wait_for(20)
            for node in cluster.nodes:
                shown = cluster.wait_for(lambda node=node: settings_of(cluster, node)
                                         if settings_of(cluster, node)["finalized"] else None,
                                         30, f"{node.node_id} finalized")
                assert shown["budget"] == {"bytes": Budget().bytes}
                assert rate_rule(cluster, node) == "bucket"  # finalize keeps what was put
            # Put again once finalized, the limit is the exact window, on every member.
            status, _, _ = cluster.request(n2, "PUT", "/v1/queues/metered", METERED,
                                           token=cluster.admin_token)
            assert status == 200
            for node in cluster.nodes:
                cluster.wait_for(lambda node=node: rate_rule(cluster, node) == "window", 30,
                                 f"{node.node_id} counts the limit in the window")
            # Finalized: the client's trace is recorded with its job, on every member.
            status, body, _ = cluster.request(n3, "POST", "/v1/jobs", {"task": "t"},
                                              token=cluster.admin_token,
                                              headers={"traceparent": TRACEPARENT})
            assert status == 201 and body["traceparent"] == TRACEPARENT, body
            for node in cluster.nodes:
                cluster.wait_for(lambda node=node: traceparent_on(cluster, node, body["id"])
                                 == TRACEPARENT, 30, f"{node.node_id} has the traceparent")
            # Finalized: every member records a heartbeat's progress.
            finalized = claimed_job(cluster, n2, "progress-finalized")
            assert report_progress(cluster, n3, finalized, "progress-finalized")[0] == 200
            for node in cluster.nodes:
                assert progress_on(cluster, node, finalized[0])["message"] == "half"
            # The previous release can no longer join: it refuses the finalized snapshot.
            refuse_to_rejoin_with_the_previous_release(cluster, n3)
            n3.data_dir.mkdir(parents=True, exist_ok=True)  # rejoin_empty clears it
            rejoin_empty(cluster, n3)  # this release, again
            writer.wait_for(20)
        assert_every_write_on_every_member(cluster, writer.acknowledged)
        print(f"rolling upgrade: {len(writer.acknowledged)} writes acknowledged, "
              f"{writer.failures} attempts failed over")
