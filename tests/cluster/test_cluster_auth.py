"""Bearer tokens and roles on a real cluster whose configs set `[api] tokens`: no token or an
unknown one is 401, a role without the grant is 403, the right role passes, and the health
routes stay open. Roles and grants: cluster/http/common.py ROLE_GRANTS."""

from __future__ import annotations

from typing import Any

import pytest

from raftcron.cluster.dev.localcluster import LocalCluster

TOKENS = {
    "admin-token-0123": "admin",
    "submit-token-0123": "submit",
    "worker-token-0123": "worker",
    "read-token-012345": "read",
}
TOKEN_OF = {role: token for token, role in TOKENS.items()}

SUBMIT = ("POST", "/v1/jobs", {"task": "t"})
CLAIM = ("POST", "/v1/claims", {"worker": "w", "queues": ["auth-none"], "max": 1})
READ = ("GET", "/v1/jobs", None)
MANAGE = ("PUT", "/v1/schedules/auth-s", {"every": "1h", "job": {"task": "t"}})
AUDIT = ("POST", "/v1/cluster/audits", None)


@pytest.fixture(scope="module")
def auth_cluster(module_cluster_factory: Any) -> LocalCluster:
    cluster: LocalCluster = module_cluster_factory.open(tokens=TOKENS)
    return cluster


def ask(cluster: LocalCluster, route: tuple[str, str, Any], token: str | None) -> Any:
    method, path, body = route
    return cluster.call(method, path, body, token=token)


@pytest.mark.parametrize("route", [SUBMIT, CLAIM, READ, MANAGE, AUDIT, ("GET", "/metrics", None)])
def test_a_request_without_a_token_gets_401(
    auth_cluster: LocalCluster, route: tuple[str, str, Any]
) -> None:
    status, body, headers = ask(auth_cluster, route, None)

    assert status == 401, body
    assert body["error"]["code"] == "unauthorized"
    assert headers.get("WWW-Authenticate") == "Bearer"


def test_an_unknown_token_gets_401(auth_cluster: LocalCluster) -> None:
    status, body, _ = ask(auth_cluster, READ, "not-a-known-token")

    assert status == 401, body
    assert "not known" in body["error"]["message"]


@pytest.mark.parametrize(
    ("role", "route"),
    [
        ("read", SUBMIT),
        ("worker", SUBMIT),
        ("read", CLAIM),
        ("submit", CLAIM),
        ("submit", MANAGE),
        ("worker", MANAGE),
        ("read", AUDIT),
        ("submit", AUDIT),
    ],
)
def test_a_role_without_the_grant_gets_403(
    auth_cluster: LocalCluster, role: str, route: tuple[str, str, Any]
) -> None:
    status, body, _ = ask(auth_cluster, route, TOKEN_OF[role])

    assert status == 403, body
    assert body["error"]["code"] == "forbidden"
    assert role in body["error"]["message"]


@pytest.mark.parametrize(
    ("role", "route", "expected"),
    [
        ("submit", SUBMIT, 201),
        ("admin", SUBMIT, 201),
        ("worker", CLAIM, 200),
        ("admin", CLAIM, 200),
        ("read", READ, 200),
        ("worker", READ, 200),
        ("admin", MANAGE, 201),
        ("admin", AUDIT, 201),
    ],
)
def test_a_role_with_the_grant_passes(
    auth_cluster: LocalCluster, role: str, route: tuple[str, str, Any], expected: int
) -> None:
    if route is MANAGE:  # a fresh name each time: a replace answers 200
        route = ("PUT", f"/v1/schedules/auth-{role}", route[2])

    status, body, _ = ask(auth_cluster, route, TOKEN_OF[role])

    assert status == expected, body


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_health_routes_need_no_token(auth_cluster: LocalCluster, path: str) -> None:
    for node in auth_cluster.nodes:
        status, body, _ = auth_cluster.request(node, "GET", path)
        assert status == 200, body


@pytest.mark.parametrize(
    "path", ["/ui/../v1/jobs", "/ui/%2e%2e/v1/jobs", "//v1/jobs", "/v1/jobs/", "/V1/jobs"]
)
def test_path_tricks_do_not_skip_authentication(auth_cluster: LocalCluster, path: str) -> None:
    status, body, _ = auth_cluster.request(auth_cluster.nodes[0], "POST", path, {"task": "t"})

    assert status in (401, 404), body
