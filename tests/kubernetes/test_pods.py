"""The StatefulSet's pods started as Kubernetes would start them, without Kubernetes: each
pod's command and environment rendered from deploy/kubernetes/ for ordinals 0-2 (the
downward API's name and namespace, the Secret's values), run in a network namespace of its
own (the chaos suite's, chaos/tier2/netns.py) where the members' DNS names resolve to the
pods' addresses. The cluster forms; /readyz answers as the probes expect; pod 0 is deleted
(SIGTERM, as the kubelet stops a container) and its volume with it, and it comes back
through the start step, which finds the cluster and rejoins it.

What stands in for Kubernetes, and why it is honest:
- DNS: `ip netns exec` mounts /etc/netns/<namespace>/hosts over /etc/hosts for the process
  it runs (iproute2's convention), so each node resolves raftcron-N.raftcron.<ns>.svc.
  cluster.local through the system's resolver, as a pod resolves the headless Service's
  names (published before the pods are ready) and its own (its /etc/hosts);
- the volume: a folder per pod where the pod mounts one (RAFTCRON_DATA_DIR is the mount
  path, which is that folder here), emptied to lose it, with the `lost+found` a new ext4
  volume holds;
- the probes: the test asks each pod's address at the probe's port, as the kubelet does;
- the image's `raftcron` is `python -m raftcron.cluster.commandline.main` of this checkout.
The test itself talks to the pods from a namespace of its own, by address.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from raftcron.chaos.tier2.netns import Namespaces, _setns, run

from .manifests import REPO, Pod, agreed_leader, one, pod, rendered

pytestmark = pytest.mark.processes
NAMESPACE = "prod"  # the Kubernetes namespace the pods think they are in
HOSTS = {0: "n1", 1: "n2", 2: "n3"}  # ordinal -> the chaos suite's host (its address plan)
SCALED = {**HOSTS, 3: "n4"}  # and the pod that scaling up to 4 adds
FORM_TIMEOUT_S = 60.0
REJOIN_TIMEOUT_S = 60.0
NEW_ADDRESS = "198.18.0.40"  # in the chaos suite's subnet, outside its address plan
T = TypeVar("T")


@dataclass
class Pods:
    net: Namespaces
    folder: Path
    objects: list[dict[str, Any]]
    client: concurrent.futures.ThreadPoolExecutor  # one thread, in the test's namespace
    addresses: dict[int, str]  # ordinal -> the pod's IP address now
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def spec(self, ordinal: int) -> Pod:
        return pod(self.objects, ordinal, NAMESPACE)

    def volume(self, ordinal: int) -> Path:
        return self.folder / f"volume-{ordinal}"

    def start(self, ordinal: int) -> None:
        spec = self.spec(ordinal)
        assert spec.command[0] == "raftcron"
        environment = {**spec.environment, "PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)}
        assert environment["RAFTCRON_DATA_DIR"] == spec.data_dir
        environment["RAFTCRON_DATA_DIR"] = str(self.volume(ordinal))
        self.volume(ordinal).mkdir(exist_ok=True)
        log = self.log(ordinal).open("ab")
        self.processes[ordinal] = subprocess.Popen(
            [*self.net.exec_prefix(SCALED[ordinal]), "env", "-i",
             *(f"{name}={value}" for name, value in environment.items()),
             sys.executable, "-m", "raftcron.cluster.commandline", *spec.command[1:]],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.folder)
        log.close()

    def log(self, ordinal: int) -> Path:
        return self.folder / f"raftcron-{ordinal}.log"

    def stop(self, ordinal: int, grace_s: float) -> int:
        """SIGTERM, as the kubelet stops a container; SIGKILL after the grace period."""
        process = self.processes.pop(ordinal)
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise

    def get(self, ordinal: int, path: str, port: int, token: str | None = None
            ) -> tuple[int, dict[str, Any]]:
        """GET a pod's address at `port`, as a probe or a client in the cluster would."""
        url = f"http://{self.addresses[ordinal]}:{port}{path}"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return self.client.submit(_get, url, headers).result()

    def post(self, ordinal: int, path: str, port: int, token: str, body: dict[str, Any] | None,
             *, method: str = "POST", timeout_s: float = 2.0) -> tuple[int, dict[str, Any]]:
        url = f"http://{self.addresses[ordinal]}:{port}{path}"
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        data = None if body is None else json.dumps(body).encode()
        return self.client.submit(_get, url, headers, data, method, timeout_s).result()

    def publish(self) -> None:
        """Every pod's hosts file: each member's names (FQDN and short) to its address."""
        lines = ["127.0.0.1 localhost"]
        for ordinal, address in sorted(self.addresses.items()):
            name = f"raftcron-{ordinal}"
            lines.append(f"{address} {name}.raftcron.{NAMESPACE}.svc.cluster.local {name}")
        for host in SCALED.values():
            folder = Path("/etc/netns") / self.net.namespace(host)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text("\n".join(lines) + "\n")

    def readdress(self, ordinal: int, address: str) -> None:
        """A new pod gets a new IP address; its DNS names follow."""
        namespace = self.net.namespace(SCALED[ordinal])
        run(["ip", "-n", namespace, "addr", "del", f"{self.addresses[ordinal]}/24", "dev", "eth0"])
        run(["ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0"])
        self.addresses[ordinal] = address
        self.publish()

    def lines(self, ordinal: int, action: str) -> list[dict[str, Any]]:
        found = []
        for line in self.log(ordinal).read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("action") == action:
                    found.append(record)
        return found


def _get(url: str, headers: dict[str, str], data: bytes | None = None, method: str | None = None,
         timeout_s: float = 2.0) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read() or b"{}")
    except (OSError, ValueError) as error:
        return 0, {"error": str(error)}


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float,
             pods: Pods | None = None) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            tails = "" if pods is None else "\n".join(
                f"--- raftcron-{n}:\n" + "\n".join(
                    pods.log(n).read_text(errors="replace").splitlines()[-15:])
                for n in SCALED if pods.log(n).exists())
            pytest.fail(f"not within {timeout_s:g} s: {what}\n{tails}")
        time.sleep(0.2)  # polling a condition under a deadline, not a fixed wait


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Pods]:
    if os.geteuid() != 0:
        pytest.fail("the pods run in network namespaces, which need root", pytrace=False)
    if shutil.which("ip") is None:
        pytest.fail("the pods run in network namespaces made with `ip`, which is not "
                    "installed: apt-get install iproute2", pytrace=False)
    net = Namespaces([*SCALED.values(), "ctl"])
    etc = [Path("/etc/netns") / net.namespace(host) for host in SCALED.values()]
    client = concurrent.futures.ThreadPoolExecutor(
        1, initializer=_setns, initargs=(f"/run/netns/{net.namespace('ctl')}",))
    made = Pods(net, tmp_path, rendered(), client,
                {ordinal: net.address(host) for ordinal, host in SCALED.items()})
    try:
        net.create()
        made.publish()
        yield made
    finally:
        for ordinal in list(made.processes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                made.stop(ordinal, grace_s=10.0)
        client.shutdown()
        net.close()
        for folder in etc:
            shutil.rmtree(folder, ignore_errors=True)


def probe_port(pods: Pods, probe: str) -> int:
    (container,) = one(pods.objects, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    port = container[probe]["httpGet"]["port"]
    named = {item["name"]: item["containerPort"] for item in container["ports"]}
    return int(named.get(port, port))


def ready_with_leader(pods: Pods, ordinals: list[int], port: int) -> str | None:
    """The leader every one of `ordinals` names while ready, or None."""
    return agreed_leader(pods.get(ordinal, "/readyz", port) for ordinal in ordinals)


def test_the_statefulset_forms_a_cluster_and_a_pod_that_lost_its_volume_rejoins(
        pods: Pods) -> None:
    ready_port, startup_port = probe_port(pods, "readinessProbe"), probe_port(pods, "startupProbe")
    admin = pods.spec(0).environment["RAFTCRON_API_TOKENS"].split(",")[0].split(":")[2]
    grace_s = one(pods.objects, "StatefulSet")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]
    for ordinal in HOSTS:  # Parallel: all at once
        pods.start(ordinal)

    leader = wait_for("three ready pods naming one leader",
                      lambda: ready_with_leader(pods, list(HOSTS), ready_port),
                      FORM_TIMEOUT_S, pods)
    assert leader in {f"raftcron-{ordinal}" for ordinal in HOSTS}
    # A majority decided a first start (two can elect a leader); a pod that decided later
    # may have heard that leader and rejoined, which an empty node may always do.
    modes = {ordinal: pods.lines(ordinal, "start_mode") for ordinal in HOSTS}
    assert all(len(decided) == 1 for decided in modes.values()), modes
    firsts = [n for n, (decided,) in modes.items() if decided["mode"] == "first_start"]
    assert len(firsts) >= 2, modes
    for ordinal in set(HOSTS) - set(firsts):
        assert modes[ordinal][0]["mode"] == "rejoin", modes
        assert "leader raftcron-" in modes[ordinal][0]["msg"], modes
    for ordinal in HOSTS:
        assert pods.get(ordinal, "/healthz", startup_port)[0] == 200
        # A client's view: the member knows who the members are, by their DNS names.
        status, view = pods.get(ordinal, "/v1/cluster", ready_port, admin)
        assert status == 200
        assert {member["http_address"] for member in view["members"]} == {
            f"raftcron-{n}.raftcron.{NAMESPACE}.svc.cluster.local:8080" for n in HOSTS}

    for number in range(5):
        status, job = pods.post(1, "/v1/jobs", ready_port, admin,
                                {"queue": "k8s", "task": "k8s.noop", "payload": {"n": number}})
        assert status == 201, job

    # Pod 0 deleted: stopped by SIGTERM within its grace period, its volume gone with it.
    assert pods.stop(0, grace_s=grace_s) == 0
    shutil.rmtree(pods.volume(0))
    (pods.volume(0) / "lost+found").mkdir(parents=True)
    pods.readdress(0, NEW_ADDRESS)  # the new pod 0 is another pod, with another address
    wait_for("two pods ready under one leader without pod 0",
             lambda: ready_with_leader(pods, [1, 2], ready_port), FORM_TIMEOUT_S, pods)
    for number in range(5, 8):  # the two others commit without it
        status, job = pods.post(2, "/v1/jobs", ready_port, admin,
                                {"queue": "k8s", "task": "k8s.noop", "payload": {"n": number}})
        assert status == 201, job

    status, view = pods.get(1, "/v1/cluster", ready_port, admin)
    committed = view["commit_index"]
    caught_up_before = len(pods.lines(0, "rejoin_caught_up"))  # its log goes on from before
    pods.start(0)
    decided = wait_for("pod 0's start step decides",
                       lambda: pods.lines(0, "start_mode")[1:], REJOIN_TIMEOUT_S, pods)
    assert decided[0]["mode"] == "rejoin", decided
    assert sorted(decided[0]["answers"]) == ["raftcron-1", "raftcron-2"]  # the record
    wait_for("pod 0 rejoined, caught up and ready", lambda: ready_with_leader(
        pods, list(HOSTS), ready_port), REJOIN_TIMEOUT_S, pods)
    status, body = pods.get(0, "/readyz", ready_port)
    assert body["member"] is True and body["applied_index"] >= committed
    assert len(pods.lines(0, "rejoin_caught_up")) > caught_up_before, "pod 0 caught up"
    status, listed = pods.get(0, "/v1/jobs?queue=k8s", ready_port, admin)
    assert status == 200 and len(listed["jobs"]) == 8, listed


def test_scaling_up_adds_a_pod_that_waits_to_be_added_and_scaling_down_removes_it(
        pods: Pods) -> None:
    """docs/operations/kubernetes.md: `kubectl scale --replicas=4`, then `raftcron cluster add`; and
    `raftcron cluster remove`, then `--replicas=3` (and the volume deleted)."""
    ready_port = probe_port(pods, "readinessProbe")
    admin = pods.spec(0).environment["RAFTCRON_API_TOKENS"].split(",")[0].split(":")[2]
    for ordinal in HOSTS:
        pods.start(ordinal)
    wait_for("three ready pods naming one leader",
             lambda: ready_with_leader(pods, list(HOSTS), ready_port), FORM_TIMEOUT_S, pods)

    pods.start(3)  # the StatefulSet's fourth pod, from the same template
    (decided,) = wait_for("pod 3's start step decides", lambda: pods.lines(3, "start_mode"),
                          REJOIN_TIMEOUT_S, pods)
    assert decided["mode"] == "join", decided

    def serving() -> tuple[int, dict[str, Any]] | None:
        answer = pods.get(3, "/readyz", ready_port)
        return answer if answer[0] else None

    status, body = wait_for("pod 3 serves, not yet a member", serving, REJOIN_TIMEOUT_S, pods)
    assert (status, body["ready"], body["member"]) == (503, False, False)
    fqdn = f"raftcron-3.raftcron.{NAMESPACE}.svc.cluster.local"
    status, added = pods.post(1, "/v1/cluster/members", ready_port, admin, {
        "node_id": "raftcron-3", "raft_address": f"{fqdn}:7000",
        "http_address": f"{fqdn}:8080"}, timeout_s=REJOIN_TIMEOUT_S)
    assert status == 201, added
    wait_for("four ready pods naming one leader",
             lambda: ready_with_leader(pods, list(SCALED), ready_port), REJOIN_TIMEOUT_S, pods)

    status, removed = pods.post(2, "/v1/cluster/members/raftcron-3", ready_port, admin, None,
                                method="DELETE", timeout_s=REJOIN_TIMEOUT_S)
    assert status == 200, removed
    assert pods.stop(3, grace_s=30.0) == 0
    status, view = pods.get(0, "/v1/cluster", ready_port, admin)
    assert sorted(member["node_id"] for member in view["members"]) == [
        "raftcron-0", "raftcron-1", "raftcron-2"]
    wait_for("the three pods ready", lambda: ready_with_leader(pods, list(HOSTS), ready_port),
             FORM_TIMEOUT_S, pods)
