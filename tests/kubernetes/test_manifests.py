"""deploy/kubernetes/ offline: every object validates against the schemas of a pinned
Kubernetes release (the kubernetes-validate package ships them), strictly (an unknown field
is an error), and holds what DESIGN.md §9.5 and issue 30 ask of it."""

from __future__ import annotations

import os
from typing import Any

import kubernetes_validate
import pytest
import yaml

from raftcron.cluster import config as configuration
from raftcron.cluster import configenv

from .manifests import KUBERNETES, KUSTOMIZATION, one, pod, rendered

KUBERNETES_VERSION = "1.31.0"  # the newest the pinned kubernetes-validate has schemas for


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return rendered()


def test_every_object_validates_strictly_against_the_kubernetes_schemas(
        objects: list[dict[str, Any]]) -> None:
    for item in objects:
        try:
            kubernetes_validate.validate(item, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{item['kind']} {item['metadata']['name']}: {error.message} at "
                        f"{'.'.join(map(str, error.path))}")


def test_the_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load(KUSTOMIZATION.read_text())["resources"])
    present = {path.name for path in KUBERNETES.glob("*.yaml")} - {KUSTOMIZATION.name}
    assert listed == present


def node_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = one(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def test_three_members_start_in_parallel_under_the_headless_service(
        objects: list[dict[str, Any]]) -> None:
    statefulset = one(objects, "StatefulSet")["spec"]
    headless = one(objects, "Service", statefulset["serviceName"])["spec"]
    assert (statefulset["replicas"], statefulset["podManagementPolicy"]) == (3, "Parallel")
    assert headless["clusterIP"] == "None"
    # The members reach each other (and the start step asks them) before they are ready.
    assert headless["publishNotReadyAddresses"] is True
    labels = statefulset["template"]["metadata"]["labels"]
    for service in [item for item in objects if item["kind"] == "Service"]:
        assert service["spec"]["selector"].items() <= labels.items()
    client = one(objects, "Service", "raftcron-client")["spec"]
    assert not client.get("publishNotReadyAddresses") and client.get("clusterIP") != "None"


def test_a_disruption_takes_one_member_and_no_two_share_a_machine(
        objects: list[dict[str, Any]]) -> None:
    budget = one(objects, "PodDisruptionBudget")["spec"]
    template = one(objects, "StatefulSet")["spec"]["template"]
    assert budget["maxUnavailable"] == 1
    assert budget["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    (term,) = template["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= template["metadata"][
        "labels"].items()


def test_probes_allow_for_a_replay_and_never_restart_a_node_in_a_hurry(
        objects: list[dict[str, Any]]) -> None:
    container = node_container(objects)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    startup, readiness = container["startupProbe"], container["readinessProbe"]
    assert readiness["httpGet"] == {"path": "/readyz", "port": "http"}
    assert startup["httpGet"]["path"] == "/healthz" and "http" in ports
    # Replaying a million jobs takes tens of seconds; asking the peers up to --ask-peers-s.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    liveness = container.get("livenessProbe")
    if liveness is not None:  # lenient: minutes without an answer, not a missed heartbeat
        assert liveness["httpGet"]["path"] == "/healthz"
        assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 300


def test_a_pod_stops_by_sigterm_and_is_configured_from_the_environment_alone(
        objects: list[dict[str, Any]]) -> None:
    spec = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    container = node_container(objects)
    assert "lifecycle" not in container  # no preStop hook: SIGTERM, no leadership transfer
    assert 10 <= spec["terminationGracePeriodSeconds"] <= 60
    # Service links would give the pods a variable per Service (below): off.
    assert spec["enableServiceLinks"] is False
    # The image's entrypoint (tini, then raftcron) runs the arguments: no `command`, which
    # would leave the node PID 1, deaf to SIGTERM until its handler is installed.
    assert "command" not in container
    assert container["args"][:2] == ["node", "--rejoin-empty=auto"]
    names = {variable["name"] for variable in container["env"]}
    assert "RAFTCRON_CONFIG" not in names


def test_the_secret_holds_the_password_and_tokens_and_the_pod_reads_them_from_it(
        objects: list[dict[str, Any]]) -> None:
    secret = one(objects, "Secret")
    env = {variable["name"]: variable for variable in node_container(objects)["env"]}
    for variable, key in (("RAFTCRON_CLUSTER_PASSWORD", "cluster-password"),
                          ("RAFTCRON_API_TOKENS", "api-tokens")):
        assert env[variable]["valueFrom"]["secretKeyRef"] == {
            "name": secret["metadata"]["name"], "key": key}
        assert key in secret["stringData"]


@pytest.mark.parametrize("ordinal", [0, 1, 2])
def test_each_pod_loads_as_the_node_its_name_says(
        objects: list[dict[str, Any]], ordinal: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rendered_pod = pod(objects, ordinal, "prod")
    for name in [name for name in os.environ if name.startswith("RAFTCRON_")]:
        monkeypatch.delenv(name)
    for name, value in rendered_pod.environment.items():
        monkeypatch.setenv(name, value)
    loaded = configuration.load(None)
    assert loaded.node_id == f"raftcron-{ordinal}"
    assert loaded.raft_address == f"raftcron-{ordinal}.raftcron.prod.svc.cluster.local:7000"
    assert sorted(peer.node_id for peer in loaded.peers) == sorted(
        {"raftcron-0", "raftcron-1", "raftcron-2"} - {loaded.node_id})
    assert str(loaded.data_dir) == rendered_pod.data_dir


def test_service_links_would_stop_every_node_which_is_why_they_are_off(
        objects: list[dict[str, Any]]) -> None:
    """The kubelet's service links name each Service in capitals: the Service `raftcron`
    becomes variables a node refuses as unknown RAFTCRON_* names (a typo must not pass)."""
    services = [item["metadata"]["name"] for item in objects if item["kind"] == "Service"]
    links = {f"{name.upper().replace('-', '_')}_SERVICE_HOST": "10.0.0.1" for name in services}
    environment = {**pod(objects, 0, "prod").environment, **links}
    with pytest.raises(configenv.ConfigError, match="is not a raftcron variable"):
        configenv.merge({}, environment, configuration.KEYS, file_label=None)
