"""deploy/kubernetes/ read as Kubernetes would: the kustomization rendered (the few features
it uses, done here so the tests need no kubectl; any other key fails), and a pod of the
StatefulSet rendered for an ordinal as the kubelet would: its command and environment, the
downward API's values and the Secret's filled in."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"
KUSTOMIZATION = KUBERNETES / "kustomization.yaml"
KUSTOMIZE_KEYS = {"apiVersion", "kind", "labels", "resources", "images"}
# What the image's entrypoint runs after tini (`tini -- raftcron`, the Dockerfile; checked by
# tests/container/test_files.py): a container without a `command` runs it with its `args`.
IMAGE_ENTRYPOINT = ["raftcron"]


def rendered() -> list[dict[str, Any]]:
    """The objects `kubectl apply -k deploy/kubernetes/` would send."""
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text())
    unknown = set(kustomization) - KUSTOMIZE_KEYS
    assert not unknown, f"the tests' kustomize does not do {sorted(unknown)}: teach it"
    objects = []
    for name in kustomization["resources"]:
        objects += [item for item in yaml.safe_load_all((KUBERNETES / name).read_text()) if item]
    for entry in kustomization.get("labels", []):
        assert set(entry) <= {"pairs", "includeSelectors"} and not entry.get("includeSelectors")
        for item in objects:
            item["metadata"].setdefault("labels", {}).update(entry["pairs"])
    images = {image["name"]: image for image in kustomization.get("images", [])}
    for item in objects:
        for container in containers(item):
            image = images.get(container["image"])
            if image is not None:
                container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return objects


def containers(item: dict[str, Any]) -> list[dict[str, Any]]:
    if item["kind"] != "StatefulSet":
        return []
    spec = item["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [item for item in objects
             if item["kind"] == kind and name in (None, item["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


@dataclass(frozen=True)
class Pod:
    name: str
    command: list[str]
    environment: dict[str, str]
    data_dir: str  # where the volume is mounted


def pod(objects: list[dict[str, Any]], ordinal: int, namespace: str) -> Pod:
    """The StatefulSet's pod `ordinal` in `namespace`: what its container runs, with what."""
    statefulset = copy.deepcopy(one(objects, "StatefulSet"))
    name = f"{statefulset['metadata']['name']}-{ordinal}"
    spec = statefulset["spec"]["template"]["spec"]
    assert not spec.get("initContainers"), "the tests run one container per pod"
    (container,) = spec["containers"]
    fields = {"metadata.name": name, "metadata.namespace": namespace}
    environment = {"HOSTNAME": name}  # the kubelet's, a pod's hostname is its name
    for variable in container["env"]:
        if "value" in variable:
            environment[variable["name"]] = variable["value"]
            continue
        source = variable["valueFrom"]
        if "fieldRef" in source:
            environment[variable["name"]] = fields[source["fieldRef"]["fieldPath"]]
        else:
            reference = source["secretKeyRef"]
            secret = one(objects, "Secret", reference["name"])
            environment[variable["name"]] = secret["stringData"][reference["key"]]
    (mount,) = [mount for mount in container["volumeMounts"] if mount["name"] == "data"]
    command = container.get("command", IMAGE_ENTRYPOINT)
    return Pod(name, [*command, *container.get("args", [])], environment,
               mount["mountPath"])


def agreed_leader(answers: Iterable[tuple[int, dict[str, Any]]]) -> str | None:
    """The leader every `/readyz` answer (status, body) names while ready, or None: what the
    pod test and the container test wait for before they use a cluster."""
    leaders = set()
    for status, body in answers:
        if status != 200 or body.get("ready") is not True:
            return None
        leaders.add(body["leader"])
    return leaders.pop() if len(leaders) == 1 else None

