"""Who may call what, over every route of the app (DESIGN.md §8.3), and the audit trail of
admin actions with the token's name, on a real node.

`GRANTS` is the specification, written out here rather than read from the code: a route the
app serves that is missing from it fails the test, so a new route needs a decision.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, cast

import pytest

from raftcron.cluster.clients.peerhttp import peer_token
from raftcron.cluster.config import load
from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.http import app as http_app
from raftcron.cluster.http.common import Services

OPEN = None
GRANTS: dict[tuple[str, str], str | None] = {
    ("POST", "/v1/jobs"): "submit",
    ("POST", "/v1/jobs/batch"): "submit",
    ("POST", "/v1/workflows"): "submit",
    ("GET", "/v1/jobs"): "read",
    ("GET", "/v1/jobs/{id}"): "read",
    ("POST", "/v1/jobs/{id}/cancel"): "submit",
    ("POST", "/v1/jobs/{id}/retry"): "submit",
    ("POST", "/v1/jobs/{id}/heartbeat"): "work",
    ("POST", "/v1/jobs/{id}/complete"): "work",
    ("POST", "/v1/jobs/{id}/fail"): "work",
    ("POST", "/v1/claims"): "work",
    ("GET", "/v1/schedules"): "read",
    ("POST", "/v1/schedules/preview"): "read",
    ("PUT", "/v1/schedules/{name}"): "manage",
    ("GET", "/v1/schedules/{name}"): "read",
    ("DELETE", "/v1/schedules/{name}"): "manage",
    ("POST", "/v1/schedules/{name}/pause"): "manage",
    ("POST", "/v1/schedules/{name}/resume"): "manage",
    ("POST", "/v1/schedules/{name}/trigger"): "manage",
    ("POST", "/v1/schedules/{name}/backfill"): "manage",
    ("GET", "/v1/schedules/{name}/preview"): "read",
    ("GET", "/v1/queues"): "read",
    ("GET", "/v1/queues/{name}"): "read",
    ("PUT", "/v1/queues/{name}"): "manage",
    ("POST", "/v1/queues/{name}/pause"): "manage",
    ("POST", "/v1/queues/{name}/resume"): "manage",
    ("POST", "/v1/jobs/bulk"): "manage",
    ("GET", "/v1/cluster"): "status",
    ("POST", "/v1/cluster/audits"): "manage",
    ("GET", "/v1/cluster/audits/{id}"): "read",
    ("POST", "/v1/cluster/compact"): "manage",
    ("GET", "/v1/cluster/backup"): "manage",
    ("GET", "/v1/cluster/backup/archive"): "manage",
    ("GET", "/v1/cluster/archive/rows"): "archive",
    ("POST", "/v1/cluster/stamp"): "stamp",
    ("GET", "/v1/cluster/members"): "status",
    ("POST", "/v1/cluster/members"): "manage",
    ("DELETE", "/v1/cluster/members/{node_id}"): "manage",
    ("POST", "/v1/cluster/finalize"): "manage",
    ("GET", "/v1/settings"): "read",
    ("PUT", "/v1/settings/{section}"): "manage",
    ("GET", "/v1/audit"): "audit",
    ("GET", "/v1/events"): "read",
    ("GET", "/v1/notifications"): "manage",  # admin only: urls may hold a receiver's token
    ("PUT", "/v1/notifications/{name}"): "manage",
    ("GET", "/v1/notifications/{name}"): "manage",
    ("DELETE", "/v1/notifications/{name}"): "manage",
    ("GET", "/metrics"): "read",
    ("GET", "/v1/activity"): "read",
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/openapi.json"): OPEN,
    ("GET", "/"): OPEN,
    ("GET", "/ui/{name}"): OPEN,
}
MAY: dict[str, set[str]] = {
    "admin": {"read", "status", "submit", "work", "manage", "audit", "archive", "stamp"},
    "submit": {"read", "status", "submit"},
    "worker": {"read", "status", "work"},
    "read": {"read", "status"},
    # A member filling its archive copies a peer's rows; a follower's claim on a rate-window
    # queue asks the leader for its time.
    "peer": {"status", "archive", "stamp"},
}
TOKENS = {"admin-token-0123": "admin", "submit-token-0123": "submit",
          "worker-token-0123": "worker", "read-token-012345": "read"}
NAMED_ADMIN = "alice-admin-token-0123"
BODIES: dict[str, Any] = {
    "/v1/claims": {"worker": "w", "queues": ["matrix-none"], "max": 1, "wait_ms": 0},
}


@pytest.fixture(scope="module")
def node_cluster(module_cluster_factory: Any) -> LocalCluster:
    cluster: LocalCluster = module_cluster_factory.open(
        nodes=1, tokens=TOKENS, env={"RAFTCRON_API_TOKENS": f"alice:admin:{NAMED_ADMIN}"})
    return cluster


def test_the_specification_covers_every_route_the_app_serves() -> None:
    app = http_app.build_app(cast(Services, None))
    served = {(route.method, route.resource.canonical) for route in app.router.routes()
              if route.method != "HEAD" and route.resource is not None}
    assert served == set(GRANTS)


def _tokens(cluster: LocalCluster) -> dict[str | None, str | None]:
    peer = peer_token(load(cluster.nodes[0].config_path).cluster_password)
    return {None: None, **{role: token for token, role in TOKENS.items()}, "peer": peer}


@pytest.mark.parametrize(("method", "path"), sorted(GRANTS))
def test_the_role_matrix(node_cluster: LocalCluster, method: str, path: str) -> None:
    grant = GRANTS[(method, path)]
    concrete = path.replace("{id}", "999999").replace("{name}", "matrix-s").replace(
        "{node_id}", "not-a-member").replace("{section}", "budget")
    body = BODIES.get(path, {} if method in ("POST", "PUT") else None)
    node = node_cluster.nodes[0]
    for role, token in _tokens(node_cluster).items():
        status, answer, _ = node_cluster.request(node, method, concrete, body, token=token)
        if grant is OPEN:
            allowed = True
        elif role is None:
            assert status == 401, (role, method, path, status, answer)
            continue
        else:
            allowed = grant in MAY[role]
        if allowed:
            assert status not in (401, 403), (role, method, path, status, answer)
        else:
            assert status == 403, (role, method, path, status, answer)


def test_admin_actions_are_in_the_audit_trail_with_the_tokens_name(
        node_cluster: LocalCluster, tmp_path: Path) -> None:
    node = node_cluster.nodes[0]
    names = load(node.config_path).token_names
    # Flow control's admin actions (queue limits, bulk actions) first: the oldest here.
    assert node_cluster.request(node, "PUT", "/v1/queues/trail-q", {"paused": True},
                                token=NAMED_ADMIN)[0] == 200
    bulk = {"action": "cancel", "filter": {"queue": "trail-q"}}
    assert node_cluster.request(node, "POST", "/v1/jobs/bulk", bulk, token=NAMED_ADMIN)[0] == 200
    spec = {"every": "1h", "job": {"task": "t"}}
    assert node_cluster.request(node, "PUT", "/v1/schedules/trail-s", spec,
                                token=NAMED_ADMIN)[0] == 201
    assert node_cluster.request(node, "POST", "/v1/schedules/trail-s/pause", {},
                                token=NAMED_ADMIN, headers={"X-Request-Id": "rq-1"})[0] == 200
    status, job, _ = node_cluster.request(node, "POST", "/v1/jobs", {"task": "t"},
                                          token="submit-token-0123")
    assert status == 201
    assert node_cluster.request(node, "POST", f"/v1/jobs/{job['id']}/cancel", {},
                                token="submit-token-0123")[0] == 200
    assert node_cluster.request(node, "POST", "/v1/cluster/compact", None,
                                token="read-token-012345")[0] == 403
    assert node_cluster.request(node, "GET", "/v1/audit", token="read-token-012345")[0] == 403

    def trail() -> list[dict[str, Any]]:
        status, body, _ = node_cluster.request(node, "GET", "/v1/audit?limit=1000",
                                               token="admin-token-0123")
        assert status == 200, body
        return list(body["entries"])

    def seen(entries: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(e["name"], e["role"], e["method"], e["path"], e["status"]) for e in entries]

    expected = [
        (names["read-token-012345"], "read", "POST", "/v1/cluster/compact", 403),
        (names["submit-token-0123"], "submit", "POST", f"/v1/jobs/{job['id']}/cancel", 200),
        ("alice", "admin", "POST", "/v1/schedules/trail-s/pause", 200),
        ("alice", "admin", "PUT", "/v1/schedules/trail-s", 201),
    ]
    entries = trail()
    assert seen(entries)[:4] == expected
    assert seen(entries)[4:6] == [("alice", "admin", "POST", "/v1/jobs/bulk", 200),
                                  ("alice", "admin", "PUT", "/v1/queues/trail-q", 200)]
    assert entries[2]["request_id"] == "rq-1" and entries[2]["node"] == node.node_id
    assert all("token-0123" not in str(entry) for entry in entries)  # names, never tokens
    assert ("submit-token-0123" not in str(entries)) and NAMED_ADMIN not in str(entries)
    # Submitting is not an admin action.
    assert not any(e["path"] == "/v1/jobs" for e in entries)
    # The trail survives a restart.
    node_cluster.restart(node, sig=signal.SIGTERM)
    node_cluster.wait_ready()
    assert seen(trail())[:4] == expected
