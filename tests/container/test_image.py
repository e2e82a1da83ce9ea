"""The image built from the Dockerfile, run as compose.yaml runs it, with podman (root, runc):
three nodes form a cluster (one leader, `/readyz` ready on each, reached through the ports
compose.yaml publishes on 127.0.0.1), the worker container runs a job submitted to them, a
node stops cleanly on SIGTERM (`podman stop`) within a few seconds and starts again on its
volume, and a node stops as fast while it is still asking its peers at start (its SIGTERM
handler not yet installed: what tini as PID 1 is for).

What stands in, and why it is honest:
- the base image: no registry is reachable here, so `FROM debian:bookworm-slim` builds from a
  stand-in made by deploy/container/base-image.sh (debootstrap's minbase bookworm, imported),
  kept as an image for the next run; a real one is used when present;
- Compose: tests/container/compose.py turns each service into its `podman run` (a podman
  network per test; each service's name resolves to its container's address through the
  containers' hosts files, where Compose's network has DNS); host ports are free ones, not
  8001-8003, so a demo on this machine is not in the way;
- the build's downloads: pip reaches the index with the CA bundle the host trusts (given as
  the Dockerfile's `ca-certificates` build secret), and the build's steps use the host's
  network rather than a bridge.

Tools: podman, runc and debootstrap (apt-get install podman runc debootstrap) and root;
`.ci/run` installs them and writes /etc/containers/containers.conf. A missing one fails the
test, naming its package: a skip would hide that the image went untested.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from kubernetes.manifests import agreed_leader

from .compose import DOCKERFILE, REPO, Service, run_arguments, services

# A cold first test makes the base image and builds (2.5-5 min here; BUILD_TIMEOUT_S each at
# most): more than the suite's default timeout.
pytestmark = [pytest.mark.processes, pytest.mark.timeout(1800)]
TOOLS = {"podman": "podman", "runc": "runc", "debootstrap": "debootstrap"}  # command: package
BASE_IMAGE_SCRIPT = REPO / "deploy" / "container" / "base-image.sh"
RUNTIME = ["--runtime", "runc"]  # crun, Debian's default, cannot start a container on cgroups v1
BUILD_TIMEOUT_S = 600.0
# Held while the base image is made and the image built, here and by
# deploy/container/warm-build.sh (CI warms podman's cache with it while the unit tier runs).
IMAGE_LOCK = os.environ.get("RAFTCRON_IMAGE_LOCK", "/var/tmp/raftcron-image.lock")
TEST_PREFIX = "rctest"  # names of this test's containers, volumes, networks and image tags
FORM_TIMEOUT_S = 90.0
JOB_TIMEOUT_S = 60.0
STOP_S_MAX = 5.0  # a node stops in well under a second; the stop timeout is 30 s
NODES = ("n1", "n2", "n3")
T = TypeVar("T")


def podman(*argv: str, timeout_s: float = 120.0, check: bool = True
           ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *RUNTIME, *argv], capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    if check and done.returncode != 0:
        pytest.fail(f"podman {' '.join(argv[:3])} ... failed ({done.returncode}):\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}", pytrace=False)
    return done


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    """The image of this checkout, tagged for this run alone (its layers stay in podman's
    cache, so the next run rebuilds only what changed)."""
    if os.geteuid() != 0:
        pytest.fail("the image test runs podman as root (its network, debootstrap)",
                    pytrace=False)
    missing = sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        pytest.fail(f"the image test builds and runs the image with podman and runc, from a "
                    f"base image made with debootstrap; not installed: apt-get install "
                    f"{' '.join(missing)} (.ci/run installs them)", pytrace=False)
    tag = f"localhost/{TEST_PREFIX}:{os.getpid()}-{uuid.uuid4().hex[:6]}"
    with image_lock():
        made = subprocess.run([str(BASE_IMAGE_SCRIPT)], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S, check=False)
        assert made.returncode == 0, f"base-image.sh failed:\n{made.stdout}\n{made.stderr}"
        remove_leftovers()
        secret = []
        bundle = os.environ.get("PIP_CERT") or ssl.get_default_verify_paths().cafile
        if bundle and os.path.exists(bundle):
            secret = ["--secret", f"id=ca-certificates,src={bundle}"]
        # The same arguments as deploy/container/warm-build.sh's, so its layers are reused.
        podman("build", "--network", "host", *secret, "--file", str(DOCKERFILE), "--tag", tag,
               str(REPO), timeout_s=BUILD_TIMEOUT_S)
    try:
        yield tag
    finally:
        podman("image", "rm", tag, check=False)


@dataclass
class Project:
    """compose.yaml's services as containers of one test: names, network and volumes carry
    a prefix of this run, and all are removed at the end, whatever happened."""

    image: str
    prefix: str
    services: dict[str, Service]
    tokens: dict[str, str]
    addresses: dict[str, str] = field(default_factory=dict)
    host_ports: dict[str, int] = field(default_factory=dict)  # service -> its API on the host
    started: set[str] = field(default_factory=set)

    @property
    def network(self) -> str:
        return f"{self.prefix}-net"

    def container(self, service: str) -> str:
        return f"{self.prefix}-{service}"

    def create_network(self) -> None:
        podman("network", "create", "--label", f"raftcron-test={self.prefix}", self.network)
        (network,) = json.loads(podman("network", "inspect", self.network).stdout)
        subnet = ipaddress.ip_network(network["subnets"][0]["subnet"])
        for number, name in enumerate(self.services, start=10):
            self.addresses[name] = str(subnet[number])

    def start(self, service: str) -> None:
        spec = self.services[service]
        host_ports = {item.container_port: free_port() for item in spec.ports}
        for item in spec.ports:
            self.host_ports[service] = host_ports[item.container_port]
        argv = run_arguments(
            spec, name=self.container(service), image=self.image, network=self.network,
            address=self.addresses[service], hosts=self.addresses, host_ports=host_ports,
            volumes={source: f"{self.prefix}-{source}" for source in spec.volumes},
            labels={"raftcron-test": self.prefix})
        self.started.add(service)
        podman(*argv)

    def stop(self, service: str) -> tuple[float, int]:
        """`podman stop` (SIGTERM, SIGKILL after the service's stop timeout): how long it
        took, and the container's exit code."""
        started = time.monotonic()
        podman("stop", self.container(service), timeout_s=self.services[service].stop_grace_s
               + 30)
        took_s = time.monotonic() - started
        state = podman("inspect", "--format", "{{.State.ExitCode}}", self.container(service))
        return took_s, int(state.stdout.strip())

    def request(self, service: str, method: str, path: str, body: Any = None,
                token: str | None = None) -> tuple[int, Any]:
        """`path` on `service`'s published API port on 127.0.0.1, as a user on the host."""
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.host_ports[service]}{path}", data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            with error:
                return error.code, json.loads(error.read() or b"{}")
        except (OSError, ValueError) as error:
            return 0, {"error": str(error)}

    def logs(self, service: str, lines: int = 15) -> str:
        done = podman("logs", "--tail", str(lines), self.container(service), check=False)
        return done.stdout + done.stderr

    def actions(self, service: str) -> list[str]:
        found = []
        for line in self.logs(service, lines=100_000).splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and "action" in record:
                    found.append(record["action"])
        return found

    def remove(self) -> None:
        names = [self.container(service) for service in sorted(self.started)]
        if names:
            podman("rm", "--force", "--volumes", "--time", "0", *names, check=False)
        volumes = {f"{self.prefix}-{source}" for service in self.started
                   for source in self.services[service].volumes}
        if volumes:
            podman("volume", "rm", "--force", *sorted(volumes), check=False)
        podman("network", "rm", "--force", self.network, check=False)


@contextlib.contextmanager
def image_lock() -> Iterator[None]:
    """The lock warm-build.sh holds while it warms the cache: waited for (up to its own 15
    minutes), so the build here reuses its layers instead of doing the same work beside it."""
    with open(IMAGE_LOCK, "w") as lock:
        deadline = time.monotonic() + 900
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"{IMAGE_LOCK} is still held after 15 minutes "
                                "(deploy/container/warm-build.sh stuck?)", pytrace=False)
                time.sleep(1.0)  # polled: flock has no timeout of its own
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def remove_leftovers() -> None:
    """What a run of this test that was killed left (its containers, volumes, network, image):
    every name carries the run's pid, so only those of runs whose process is gone."""
    def gone(pid: str) -> bool:
        if not pid.isdigit():
            return False
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, someone else's
            return False
        return False

    networks = podman("network", "ls", "--format", "{{.Name}}", "--filter",
                      "label=raftcron-test", check=False).stdout.split()
    for network in networks:
        prefix = network.removesuffix("-net")  # rctest-<pid>-<random>
        if not (prefix.startswith(f"{TEST_PREFIX}-") and gone(prefix.split("-")[1])):
            continue
        containers = podman("ps", "-a", "-q", "--filter", f"label=raftcron-test={prefix}",
                            check=False).stdout.split()
        if containers:
            podman("rm", "--force", "--volumes", "--time", "0", *containers, check=False)
        volumes = podman("volume", "ls", "-q", "--filter", f"name={prefix}-",
                         check=False).stdout.split()
        if volumes:
            podman("volume", "rm", "--force", *volumes, check=False)
        podman("network", "rm", "--force", network, check=False)
    tags = podman("images", "--format", "{{.Repository}}:{{.Tag}}", "--filter",
                  f"reference=localhost/{TEST_PREFIX}", check=False).stdout.split()
    for tag in tags:  # localhost/rctest:<pid>-<random>
        if gone(tag.rpartition(":")[2].split("-")[0]):
            podman("image", "rm", tag, check=False)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float,
             project: Project) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {service}:\n{project.logs(service)}"
                              for service in sorted(project.started))
            pytest.fail(f"not within {timeout_s:g} s: {what}\n{tails}", pytrace=False)
        time.sleep(0.2)  # polling a condition under a deadline, not a fixed wait


@pytest.fixture
def project(image: str) -> Iterator[Project]:
    tokens = {name: uuid.uuid4().hex for name in ("CLUSTER_PASSWORD", "ADMIN_TOKEN",
                                                  "WORKER_TOKEN")}
    made = Project(image, f"{TEST_PREFIX}-{os.getpid()}-{uuid.uuid4().hex[:6]}", services(tokens),
                   tokens)
    try:
        made.create_network()
        yield made
    finally:
        made.remove()


def ready_with_leader(project: Project, nodes: tuple[str, ...]) -> str | None:
    """The leader every one of `nodes` names while ready, or None."""
    return agreed_leader(project.request(node, "GET", "/readyz") for node in nodes)


def test_three_nodes_form_a_cluster_the_worker_runs_a_job_and_a_node_stops_on_sigterm(
        project: Project) -> None:
    admin = project.tokens["ADMIN_TOKEN"]
    for node in NODES:
        project.start(node)
    leader = wait_for("three ready nodes naming one leader",
                      lambda: ready_with_leader(project, NODES), FORM_TIMEOUT_S, project)
    assert leader in NODES
    status, view = project.request("n2", "GET", "/v1/cluster", token=admin)
    assert status == 200, view
    assert {member["http_address"] for member in view["members"]} == {
        f"{node}:8080" for node in NODES}

    # The ways in of docs/operations/containers.md: the CLI on the host through the published
    # ports, and the image's own CLI inside a node's container.
    connect = ",".join(f"http://127.0.0.1:{project.host_ports[node]}" for node in NODES)
    on_host = subprocess.run(
        [sys.executable, "-m", "raftcron.cluster.commandline", "cluster", "status", "--json",
         "--connect", connect], env={**os.environ, "RAFTCRON_API_TOKEN": admin},
        capture_output=True, text=True, timeout=60, check=False)
    assert on_host.returncode == 0, on_host.stdout + on_host.stderr
    assert json.loads(on_host.stdout)["leader"] == leader, on_host.stdout
    inside = podman("exec", "--env", f"RAFTCRON_API_TOKEN={admin}", project.container("n3"),
                    "raftcron", "cluster", "status", "--json", "--connect", "http://n3:8080")
    assert json.loads(inside.stdout)["leader"] == leader, inside.stdout

    project.start("worker")
    script = 'echo "hello from $RAFTCRON_JOB_ID"; id -u'
    status, job = project.request("n2", "POST", "/v1/jobs", {
        "queue": "default", "task": "shell", "payload": {"argv": ["sh", "-c", script]}},
        token=admin)
    assert status == 201, job

    def finished() -> dict[str, Any] | None:
        status, body = project.request("n2", "GET", f"/v1/jobs/{job['id']}", token=admin)
        return body if status == 200 and body["status"] in ("succeeded", "failed",
                                                             "dead") else None

    done = wait_for(f"job {job['id']} run by the worker", finished, JOB_TIMEOUT_S, project)
    assert done["status"] == "succeeded", done
    # The worker container ran it, as the image's user (uid 10001), not as root.
    assert done["result"]["stdout"] == f"hello from {job['id']}\n10001\n", done
    assert "compose-worker" in json.dumps(done), done

    took_s, code = project.stop(leader)
    assert took_s < STOP_S_MAX and code == 0, (took_s, code, project.logs(leader))
    assert "node_stopped" in project.actions(leader)
    others = tuple(node for node in NODES if node != leader)
    wait_for("the two others ready under a new leader",
             lambda: ready_with_leader(project, others), FORM_TIMEOUT_S, project)

    podman("start", project.container(leader))  # its volume kept its data: it asks nobody
    wait_for("the stopped node back and ready", lambda: ready_with_leader(project, NODES),
             FORM_TIMEOUT_S, project)
    assert project.actions(leader).count("start_mode_asking") == 1
    status, again = project.request(leader, "GET", f"/v1/jobs/{job['id']}", token=admin)
    assert status == 200 and again["status"] == "succeeded", again

    took_s, code = project.stop("worker")  # it drains: nothing is running
    assert took_s < STOP_S_MAX and code == 0, (took_s, code, project.logs("worker"))


def test_a_node_stops_on_sigterm_while_it_still_asks_its_peers(project: Project) -> None:
    """Before a node installs its SIGTERM handler (the start step asks the peers for up to
    --ask-peers-s, 20 s), the signal's default action must stop it. As PID 1 a process gets
    no default action, so `podman stop` would wait out the stop timeout and SIGKILL it; tini
    is PID 1 in the image, and the node its child."""
    project.start("n1")  # alone: n2 and n3 never answer
    wait_for("n1 asking its peers", lambda: "start_mode_asking" in project.actions("n1"),
             FORM_TIMEOUT_S, project)
    took_s, code = project.stop("n1")
    assert took_s < STOP_S_MAX, (took_s, project.logs("n1"))
    assert code == 128 + 15, (code, project.logs("n1"))  # SIGTERM's, as tini reports it
