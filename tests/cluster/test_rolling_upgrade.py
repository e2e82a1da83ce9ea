"""A rolling upgrade from the previous release (DESIGN.md §8.4; README, "Upgrading"): its wheel
is built from its git commit into a venv of its own, three nodes run it, and they are upgraded
one at a time under writes. Along the way each release installs a snapshot the other made (a
node of this release rejoins empty from a leader of the previous one, and the other way
round) and loads its own data dir written by the other. At the end: nothing acknowledged is
lost and every member's digest is equal.

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

from raftcron.cluster.dev.localcluster import FAST_RAFT, REPO_ROOT, LocalCluster, LocalNode

pytestmark = [pytest.mark.processes, pytest.mark.upgrade]

# The commit main was at when this release's work began (issue 14): the previous release.
PREVIOUS_RELEASE = "39f2bd9e707ad142e8779f53ce507e121d4596ea"


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
        args = ["-m", "raftcron.cluster.cli", "node", "--config", str(node.config_path),
                *self.extra_args.pop(node.node_id, [])]
        if self.release.get(node.node_id, "previous") == "previous":
            return [self.old_python, "-I", "-u", *args]
        return [self.python, *args]


def runs_this_release(cluster: LocalCluster, node: LocalNode) -> bool:
    """Only this release serves the membership routes."""
    return cluster.request(node, "GET", "/v1/cluster/members")[0] != 404


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


def test_a_rolling_upgrade_from_the_previous_release_under_writes_loses_nothing(
        tmp_path: Path) -> None:
    old_python = build_previous_release(tmp_path / "previous")
    with MixedCluster(tmp_path / "cluster", old_python, raft=FAST_RAFT) as cluster:
        cluster.start()
        cluster.wait_ready(60)
        n1, n2, n3 = cluster.nodes
        assert not any(runs_this_release(cluster, node) for node in cluster.nodes)
        with Writer(cluster, "upgrade") as writer:
            writer.wait_for(50)
            for node in cluster.nodes:  # each data dir holds a snapshot of the old release
                cluster.request(node, "POST", "/v1/cluster/compact")
            writer.wait_for(20)
            # n1 upgraded: it loads the old release's data dir and snapshot.
            upgrade(cluster, n1, writer)
            assert runs_this_release(cluster, n1)
            # Lost again, n1 installs a snapshot of a leader of the old release (n1 is down).
            rejoin_empty(cluster, n1)
            writer.wait_for(30)
            upgrade(cluster, n2, writer)
            # The old release's n3 installs a snapshot made by this release (n1 or n2 leads).
            rejoin_empty(cluster, n3)
            writer.wait_for(30)
            upgrade(cluster, n3, writer)
        assert all(runs_this_release(cluster, node) for node in cluster.nodes)
        assert_every_write_on_every_member(cluster, writer.acknowledged)
        print(f"rolling upgrade: {len(writer.acknowledged)} writes acknowledged, "
              f"{writer.failures} attempts failed over")
