"""Three real nodes configured from the environment alone (no file): they form one cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

pytestmark = pytest.mark.processes


class EnvironmentCluster(LocalCluster):
    """A LocalCluster whose nodes start with `raftcron node` and no --config: each node's
    config is its RAFTCRON_* variables (given on the command line through env(1), which
    execs the node, so the harness still signals and kills the node itself)."""

    def command(self, node: LocalNode) -> list[str]:
        members = ",".join(f"{m.node_id}={m.raft_address}/{m.http_address}" for m in self.nodes)
        variables = {
            "RAFTCRON_NODE_ID": node.node_id,
            "RAFTCRON_RAFT_ADDRESS": node.raft_address,
            "RAFTCRON_HTTP_ADDRESS": node.http_address,
            "RAFTCRON_DATA_DIR": str(node.data_dir),
            "RAFTCRON_PEERS": members,  # every member, this one included: one value for all
            "RAFTCRON_CLUSTER_PASSWORD": str(self.password),
            "RAFTCRON_LOG_LEVEL": self.log_level,
            **{f"RAFTCRON_RAFT_{key.upper()}": str(value) for key, value in self.raft.items()},
        }
        return ["env", *(f"{name}={value}" for name, value in variables.items()),
                self.python, "-m", "raftcron.cluster.commandline", "node"]


def test_three_nodes_from_the_environment_alone_form_one_cluster(
        cluster_factory, tmp_path: Path) -> None:
    cluster = EnvironmentCluster(tmp_path / "env", nodes=3, raft=FAST_RAFT)
    cluster_factory.clusters.append(cluster)  # checked and closed with the test's clusters
    for node in cluster.configure():
        node.config_path.unlink()  # nothing to read but the environment
    cluster.start()
    leader = cluster.wait_ready(timeout_s=30)
    status, body, _ = cluster.request(leader, "GET", "/v1/cluster")
    assert status == 200, body
    assert sorted(member["node_id"] for member in body["members"]) == ["n1", "n2", "n3"]
    status, job, _ = cluster.request(leader, "POST", "/v1/jobs", {"task": "from-env"})
    assert status == 201, job
    for node in cluster.nodes:
        log = node.log_path.read_text()
        assert "config_from_environment" in log and "peers=RAFTCRON_PEERS" in log, log[-2000:]
