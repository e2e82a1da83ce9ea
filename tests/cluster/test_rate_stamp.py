"""A claim on a queue counted by a rate window is stamped with the leader's clock (a Tick in the
same log entry, DESIGN.md §9.4): its start time is when it happened, not the last Tick's, which
may be a whole tick interval earlier. Seen with Ticks a second apart, for a claim made through
the leader and one made through a follower (which asks the leader for the Tick,
cluster/http/stamps.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import ClusterKeeper

from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster


@pytest.mark.parametrize("through", ["leader", "follower"])
def test_a_claim_on_a_window_queue_starts_at_the_leaders_time(
        cluster_factory: ClusterKeeper, through: str) -> None:
    cluster: LocalCluster = cluster_factory.open(raft={**FAST_RAFT, "tick_ms": 1_000})
    leader = cluster.leader()
    claimer = leader if through == "leader" else cluster.followers()[0]
    limit = {"rate_limit": {"max": 1_000, "per_ms": 1_000}}
    assert cluster.call("PUT", "/v1/queues/metered", limit, token=cluster.admin_token)[0] == 200
    lags: list[int] = []
    deadline = time.monotonic() + 3  # claims spread over three tick intervals
    n = 0
    while time.monotonic() < deadline and n < 200:
        n += 1
        status, job, _ = cluster.request(leader, "POST", "/v1/jobs",
                                         {"task": "t", "queue": "metered", "request_id": f"s{n}"},
                                         token=cluster.admin_token)
        assert status == 201, job
        before_ms = time.time() * 1000
        claim: dict[str, Any] = {"worker": "w", "queues": ["metered"], "max": 1,
                                 "request_id": f"c{n}"}
        status, claimed, _ = cluster.request(claimer, "POST", "/v1/claims", claim,
                                             token=cluster.admin_token)
        assert status == 200 and claimed["jobs"], claimed
        status, view, _ = cluster.request(claimer, "GET", f"/v1/jobs/{claimed['jobs'][0]['id']}",
                                          token=cluster.admin_token)
        lags.append(round(before_ms - view["history"][0]["start_ms"]))
    assert len(lags) >= 20, lags
    status, text, _ = cluster.request(claimer, "GET", "/metrics", token=cluster.admin_token)
    assert status == 200
    stamped = [line for line in str(text).splitlines()
               if line.startswith("raftcron_claim_stamps_total{") and 'outcome="stamped"' in line]
    # A follower counts each claim it asked the leader's time for; the leader asks nobody.
    assert [float(line.rsplit(" ", 1)[1]) for line in stamped] == (
        [float(len(lags))] if through == "follower" else []), stamped
    # Stamped: within a few ms of when it was asked (the clocks are one machine's). Unstamped,
    # a start is the last Tick's time: on average half a tick interval (500 ms) earlier.
    assert max(lags) < 150, sorted(lags)[-10:]
