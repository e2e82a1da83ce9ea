"""compose.yaml read as Compose reads it, for the tests: its anchors and `<<` merges (YAML's),
its variables interpolated (`${NAME}`, `${NAME:-default}`, `${NAME:?message}`) from a mapping
the test gives, and each service turned into the `podman run` arguments Compose would start it
with: image, command, environment, hostname, published ports, named volumes and stop timeout.
A key the tests do not know fails ("teach it"), so no part of the file goes unrun by them.

What is not run as Compose would: `restart` (a test wants a crash to show, not be retried) and
`depends_on` (the test starts the nodes before the worker). The project network's DNS is done
by each container's hosts file instead (test_image.py): Debian's podman has no DNS plugin."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose.yaml"
DOCKERFILE = REPO / "Dockerfile"
TOP_KEYS = {"name", "services", "volumes"}
SERVICE_KEYS = {"image", "build", "command", "restart", "stop_grace_period", "hostname",
                "environment", "ports", "volumes", "depends_on"}
VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|:\?)(?P<arg>[^}]*))?\}")
DURATION = re.compile(r"(?P<count>\d+(?:\.\d+)?)(?P<unit>ms|s|m|h)")
DURATION_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class Port:
    host_ip: str
    host_port: int
    container_port: int


@dataclass(frozen=True)
class Service:
    name: str
    image: str
    build: str
    command: list[str]
    environment: dict[str, str]
    hostname: str | None
    ports: list[Port]
    volumes: dict[str, str]  # named volume -> its path in the container
    stop_grace_s: float
    depends_on: list[str]


def raw() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    unknown = {key for key in document if not key.startswith("x-")} - TOP_KEYS
    assert not unknown, f"the tests' compose does not do {sorted(unknown)}: teach it"
    return document


def services(variables: Mapping[str, str]) -> dict[str, Service]:
    """Every service of compose.yaml, its variables taken from `variables` (the shell's and
    the .env file's, for Compose)."""
    document = raw()
    declared = set(document.get("volumes") or {})
    found = {}
    for name, spec in document["services"].items():
        unknown = set(spec) - SERVICE_KEYS
        assert not unknown, f"the tests' compose does not do {sorted(unknown)}: teach it"
        environment = {key: interpolate(str(value), variables)
                       for key, value in (spec.get("environment") or {}).items()}
        volumes = {}
        for item in spec.get("volumes", []):
            source, path = item.split(":")
            assert source in declared, f"{name}: volume {source} is not a named volume"
            volumes[source] = path
        found[name] = Service(
            name=name, image=spec["image"], build=spec["build"],
            command=[str(part) for part in spec.get("command", [])],
            environment=environment, hostname=spec.get("hostname"),
            ports=[port(item) for item in spec.get("ports", [])], volumes=volumes,
            stop_grace_s=duration_s(spec.get("stop_grace_period", "10s")),
            depends_on=list(spec.get("depends_on", [])))
    return found


def interpolate(text: str, variables: Mapping[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        if variables.get(name):
            return variables[name]
        if op == ":-":
            return arg
        assert op != ":?", f"${{{name}}} is required: {arg}"
        return variables.get(name, "")

    return VARIABLE.sub(value, text)


def port(text: str) -> Port:
    host_ip, host_port, container_port = text.split(":")
    return Port(host_ip, int(host_port), int(container_port))


def duration_s(text: str) -> float:
    parts = list(DURATION.finditer(text))
    assert parts and "".join(part[0] for part in parts) == text, f"not a duration: {text!r}"
    return sum(float(part["count"]) * DURATION_S[part["unit"]] for part in parts)


def run_arguments(service: Service, *, name: str, image: str, network: str, address: str,
                  hosts: Mapping[str, str], host_ports: Mapping[int, int],
                  volumes: Mapping[str, str], labels: Mapping[str, str]) -> list[str]:
    """`podman run -d` for `service`, as container `name` at `address` on `network`: every
    service's name resolving to its address (`hosts`), each published port at the host port
    `host_ports` gives for its container port, each named volume as `volumes` names it."""
    argv = ["run", "-d", "--name", name, "--network", network, "--ip", address,
            "--stop-timeout", str(round(service.stop_grace_s))]
    if service.hostname:
        argv += ["--hostname", service.hostname]
    for host, host_address in sorted(hosts.items()):
        argv += ["--add-host", f"{host}:{host_address}"]
    for key, value in labels.items():
        argv += ["--label", f"{key}={value}"]
    for key, value in service.environment.items():
        argv += ["--env", f"{key}={value}"]
    for item in service.ports:
        argv += ["--publish", f"{item.host_ip}:{host_ports[item.container_port]}:"
                 f"{item.container_port}"]
    for source, path in service.volumes.items():
        argv += ["--volume", f"{volumes[source]}:{path}"]
    return [*argv, image, *service.command]
