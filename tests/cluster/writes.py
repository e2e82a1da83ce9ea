"""Writes flowing while a cluster changes, and the check that none was lost: every job the
cluster acknowledged is on every member, and the members' digests are equal."""

from __future__ import annotations

import threading
import time

from raftcron.cluster.dev.localcluster import LocalCluster


class Writer:
    """Submits jobs one at a time through any member, keeping the acknowledged ids."""

    def __init__(self, cluster: LocalCluster, prefix: str) -> None:
        self.cluster, self.prefix = cluster, prefix
        self.acknowledged: list[int] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for n in range(100_000):
            body = {"task": "t", "payload": n, "request_id": f"{self.prefix}-{n}"}
            while not self._stop.is_set():  # a member just removed or restarted: same id again
                try:
                    status, job, _ = self.cluster.call("POST", "/v1/jobs", body, timeout_s=20)
                except Exception:
                    self.failures += 1
                    continue
                if status in (200, 201):
                    self.acknowledged.append(int(job["id"]))
                else:
                    self.failures += 1
                break
            if self._stop.is_set():
                return

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def wait_for(self, count: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        target = len(self.acknowledged) + count
        while len(self.acknowledged) < target and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.acknowledged) >= target, "writes stopped flowing"


def assert_every_write_on_every_member(cluster: LocalCluster, acknowledged: list[int]) -> None:
    digests = cluster.audit_entries(timeout_s=60)  # every member applied all before it
    assert len(set(digests.values())) == 1 and len(digests) == len(cluster.nodes), digests
    for node in cluster.nodes:
        held = {job["id"] for job in cluster.list_jobs(node)}
        missing = set(acknowledged) - held
        assert not missing, f"{node.node_id} lacks acknowledged jobs {sorted(missing)[:10]}"
