"""Fixtures for the integration tier: real `raftcron node` processes on loopback.

What this module owns: starting clusters for tests (one per test where a test hurts its
cluster, one per module where tests only read and write), and the checks every cluster gets
when its tests are done, whatever they did:

- no node log holds PySyncObj's "truncating already-applied" warning (a sign of the
  data-loss defect we patch) or a Python traceback through our own code;
- no node exited by itself (a crash, or `apply` stopping the node on a bug);
- if every node is up (or the tests passed and a quorum is up): every live node agrees on one
  leader, and an audit shows every live replica with the same state digest at the same entry.

Every process is killed at the end, also when a test or a check fails.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from problems import cluster_problems

from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember each phase's outcome on the test item, so fixtures know if the test passed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


class ClusterKeeper:
    """Opens clusters under one folder and, at the end, checks and closes every one of them."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.clusters: list[LocalCluster] = []

    def open(self, *, nodes: int = 3, **options: Any) -> LocalCluster:
        """A started cluster (FAST_RAFT timings unless `raft` is given), ready with a leader."""
        options.setdefault("raft", FAST_RAFT)
        cluster = LocalCluster(self.base_dir / f"c{len(self.clusters) + 1}", nodes=nodes, **options)
        self.clusters.append(cluster)
        cluster.start()
        cluster.wait_ready(timeout_s=30)
        return cluster

    def finish(self, *, passed: bool) -> None:
        """Check every cluster, then close them all (also when a check fails)."""
        problems: list[str] = []
        try:
            for cluster in self.clusters:
                problems += cluster_problems(cluster, check_convergence=passed)
        finally:
            for cluster in self.clusters:
                cluster.close()
        if problems:
            pytest.fail("\n".join(problems), pytrace=False)


def _test_passed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "report_call", None)
    return report is not None and report.passed


@pytest.fixture
def cluster_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ClusterKeeper]:
    """Opens clusters (with options such as tokens) that live for one test."""
    keeper = ClusterKeeper(tmp_path)
    yield keeper
    keeper.finish(passed=_test_passed(request))


@pytest.fixture
def cluster(cluster_factory: ClusterKeeper) -> LocalCluster:
    """A fresh, ready 3-node cluster with fast Raft timings, for a test that hurts it."""
    return cluster_factory.open()


@pytest.fixture(scope="module")
def module_cluster_factory(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ClusterKeeper]:
    """Opens clusters shared by the tests of one module (tests that leave the cluster whole)."""
    keeper = ClusterKeeper(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2]))
    failed_before = request.session.testsfailed
    yield keeper
    keeper.finish(passed=request.session.testsfailed == failed_before)


@pytest.fixture(scope="module")
def shared_cluster(module_cluster_factory: ClusterKeeper) -> LocalCluster:
    """One ready 3-node cluster for every test of a module."""
    return module_cluster_factory.open()


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Names no other test uses, for tests sharing a cluster: unique("queue") -> "queue-1a2b..."."""
    return lambda prefix: f"{prefix}-{uuid.uuid4().hex[:12]}"
