"""The Dockerfile, compose.yaml and .dockerignore read without building anything: each compose
node loads as the node its name says (from its environment alone, as in its container), the
worker reaches every node with the worker token the nodes know, the API is published on the
host's loopback only, and the image agrees with deploy/kubernetes/ on the user, the data path
and the ports. tests/container/test_image.py builds and runs them."""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import pytest
from kubernetes.manifests import IMAGE_ENTRYPOINT, one, rendered

from raftcron.cluster import config as configuration
from raftcron.cluster.commandline.cliparts import DEFAULT_CONNECT
from raftcron.cluster.worker import cli as worker_cli

from .compose import DOCKERFILE, REPO, raw, services

NODES = ("n1", "n2", "n3")
VARIABLES = {"CLUSTER_PASSWORD": "p" * 32, "ADMIN_TOKEN": "a" * 32, "WORKER_TOKEN": "w" * 32}


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's (instruction, arguments), continuation lines joined, comments out."""
    lines = [line for line in DOCKERFILE.read_text().splitlines()
             if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(word.upper(), rest.strip()) for word, _, rest in
            (line.strip().partition(" ") for line in joined.splitlines() if line.strip())]


def final_stage() -> list[tuple[str, str]]:
    found = instructions()
    last = max(index for index, (word, _) in enumerate(found) if word == "FROM")
    return found[last:]


def clear_raftcron_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("RAFTCRON_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize("node_id", NODES)  # not `node`: a process fixture's name (conftest)
def test_each_compose_node_loads_as_the_node_its_name_says(
        node_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    service = services(VARIABLES)[node_id]
    clear_raftcron_variables(monkeypatch)
    for name, value in service.environment.items():
        monkeypatch.setenv(name, value)
    loaded = configuration.load(None)
    assert (loaded.node_id, loaded.raft_address, loaded.http_address) == (
        node_id, f"{node_id}:7000", f"{node_id}:8080")
    assert service.hostname == node_id  # the name it binds resolves to its own container
    assert sorted(peer.node_id for peer in loaded.peers) == sorted(set(NODES) - {node_id})
    assert {(peer.raft_address, peer.http_address) for peer in loaded.peers} == {
        (f"{peer}:7000", f"{peer}:8080") for peer in set(NODES) - {node_id}}
    assert str(loaded.data_dir) == "/var/lib/raftcron" == service.volumes[f"{node_id}-data"]
    assert service.command[0] == "node" and "--rejoin-empty=auto" in service.command
    assert loaded.tokens == {VARIABLES["ADMIN_TOKEN"]: "admin", VARIABLES["WORKER_TOKEN"]: "worker"}
    assert loaded.cluster_password == VARIABLES["CLUSTER_PASSWORD"]


def test_the_worker_reaches_every_node_with_the_worker_token_they_know(
        monkeypatch: pytest.MonkeyPatch) -> None:
    found = services(VARIABLES)
    worker = found["worker"]
    assert worker.command == ["worker"] and set(worker.depends_on) == set(NODES)
    clear_raftcron_variables(monkeypatch)
    for name, value in worker.environment.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    worker_cli.add_arguments(parser)  # the flags' defaults are read from the environment now
    args = parser.parse_args([])
    assert args.connect.split(",") == [f"http://{node}:8080" for node in NODES]
    tokens = found["n1"].environment["RAFTCRON_API_TOKENS"].split(",")
    assert f"worker:worker:{args.api_token}" in tokens
    assert args.allow_shell is True
    # Draining (RAFTCRON_DRAIN_TIMEOUT_MS, default 30 s) ends before Compose's SIGKILL.
    assert worker.stop_grace_s > args.drain_timeout_ms / 1000


def test_the_api_is_published_on_the_hosts_loopback_at_the_clis_default_addresses() -> None:
    found = services(VARIABLES)
    published = [f"http://{port.host_ip}:{port.host_port}"
                 for node in NODES for port in found[node].ports]
    assert published == DEFAULT_CONNECT.split(",")
    assert all(port.container_port == 8080 for node in NODES for port in found[node].ports)
    assert found["worker"].ports == []  # and no Raft port is published at all


def test_the_tokens_and_password_come_from_the_shell_or_an_env_file() -> None:
    text = json.dumps(raw()["services"])
    for name in VARIABLES:
        assert f"${{{name}:-" in text


def test_the_image_is_what_the_kubernetes_manifests_expect() -> None:
    statefulset = one(rendered(), "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    stage = final_stage()
    (user,) = [rest for word, rest in stage if word == "USER"]
    assert user == f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    (mount,) = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "data"]
    assert [rest for word, rest in stage if word == "VOLUME"] == [json.dumps([mount])]
    (exposed,) = [rest for word, rest in stage if word == "EXPOSE"]
    assert sorted(int(port) for port in exposed.split()) == sorted(
        port["containerPort"] for port in container["ports"])
    # The pod gives arguments only, which the image's entrypoint runs after tini.
    assert "command" not in container and container["args"][0] == "node"
    (entrypoint,) = [json.loads(rest) for word, rest in stage if word == "ENTRYPOINT"]
    assert entrypoint == ["/usr/bin/tini", "--", *IMAGE_ENTRYPOINT]
    (path,) = [rest for word, rest in stage if word == "ENV" and rest.startswith("PATH=")]
    assert path.split()[0].split("=", 1)[1].split(":")[0] == "/opt/raftcron/bin"  # `raftcron`


def test_the_image_runs_raftcron_under_an_init_in_exec_form_and_sets_no_raftcron_variable(
        ) -> None:
    stage = final_stage()
    (entrypoint,) = [json.loads(rest) for word, rest in stage if word == "ENTRYPOINT"]
    assert entrypoint == ["/usr/bin/tini", "--", "raftcron"]
    assert [json.loads(rest) for word, rest in stage if word == "CMD"] == [["node"]]
    assert not any("RAFTCRON_" in rest for word, rest in instructions() if word in {"ENV", "ARG"})


def test_the_build_context_leaves_out_the_venv_git_caches_and_data() -> None:
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "**/__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
            ".hypothesis", "data"} <= ignored
    # What the wheel is built from stays in: pyproject.toml, README.md and the packages.
    assert not ignored & {"pyproject.toml", "README.md", "raftcron", "scheduler", "cluster",
                          "chaos"}


def test_the_base_image_script_is_executable() -> None:
    script = Path(REPO / "deploy" / "container" / "base-image.sh")
    assert os.access(script, os.X_OK)
