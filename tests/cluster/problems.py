"""The checks every test cluster gets at its end (see conftest.py), as a function a test may
also call itself: nodes that exited by themselves, replicas that disagree, PySyncObj's
truncation alarm and tracebacks through our code in the node logs."""

from __future__ import annotations

import re

from raftcron.cluster.consensus import raftpatch
from raftcron.cluster.dev.localcluster import LocalCluster

TRUNCATION_WARNING = raftpatch.TRUNCATION_ALARM


def cluster_problems(cluster: LocalCluster, *, check_convergence: bool) -> list[str]:
    where = f"(node logs under {cluster.base_dir})"
    problems = [
        f"{node.node_id} exited by itself with code {node.process.returncode} {where}"
        for node in cluster.crashed_nodes()
        if node.process is not None
    ]
    live = cluster.live_nodes()
    whole = len(live) == len(cluster.nodes)
    quorum = 2 * len(live) > len(cluster.nodes)
    if cluster.nodes and (whole or (check_convergence and quorum)) and not problems:
        try:
            cluster.wait_ready(timeout_s=20)
            entries = cluster.audit_entries(timeout_s=20)
        except Exception as error:
            problems.append(f"the cluster did not converge at the end: {error} {where}")
        else:
            if len(set(entries.values())) != 1:
                problems.append(f"replicas diverged: audit {entries} {where}")
    truncations = cluster.scan_logs(re.escape(TRUNCATION_WARNING))
    if truncations:
        problems.append(f"PySyncObj truncated applied entries {where}:\n" + "\n".join(truncations))
    problems += [f"a traceback through our code {where}:\n{t}" for t in cluster.tracebacks()]
    return problems
