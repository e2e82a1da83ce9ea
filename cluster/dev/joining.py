"""Growing and shrinking a `LocalCluster` the way an operator does (docs/operations/membership.md).

`join_node` writes the config of a NEW node only (fresh loopback ports, the current members as
its ``[[peers]]``, ``join = true``) and leaves every member's config as it was: members learn
of the new node from the log, never from a rewritten file. `retire` stops a node that was
removed and moves it out of `cluster.nodes` (the cluster's checks and waits are about members),
into `cluster.retired`, which `close()` still cleans up. Tests and the chaos suite use these;
the product never does.
"""

from __future__ import annotations

from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.loopback import free_ports
from raftcron.cluster.dev.nodeprocesses import LocalNode


def join_node(cluster: LocalCluster, node_id: str, *, peers: list[LocalNode] | None = None,
              data_dir_name: str = "data") -> LocalNode:
    """A new node's config (not started): `peers` default to the cluster's current nodes."""
    members = list(cluster.nodes if peers is None else peers)
    raft_port, http_port = free_ports(2, cluster.host)
    folder = cluster.base_dir / node_id
    node = LocalNode(
        node_id=node_id,
        raft_address=f"{cluster.host}:{raft_port}",
        http_address=f"{cluster.host}:{http_port}",
        config_path=folder / f"{node_id}.toml",
        data_dir=folder / data_dir_name,
        log_path=folder / f"{node_id}.log",
        tls="tls_cert_file" in cluster.api,
    )
    folder.mkdir(parents=True, exist_ok=True)
    text = cluster.config_text(node, peers=members)
    if data_dir_name != "data":
        text = text.replace('data_dir = "data"', f'data_dir = "{data_dir_name}"')
    node.config_path.write_text(text.replace("\nlog_level", "\njoin = true\nlog_level", 1))
    cluster.nodes.append(node)
    return node


def retire(cluster: LocalCluster, node: LocalNode) -> None:
    """Stop a removed node and keep it out of the members' checks."""
    if node.running:
        cluster.stop(node)
    cluster.nodes.remove(node)
    cluster.retired.append(node)


def body(node: LocalNode) -> dict[str, str]:
    """The POST /v1/cluster/members body that adds `node`."""
    return {"node_id": node.node_id, "raft_address": node.raft_address,
            "http_address": node.http_address}
