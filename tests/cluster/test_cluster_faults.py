"""Faults a real cluster must shrug off: a leader paused with SIGSTOP while a client writes to
it (its write must not come back as a phantom or a duplicate when it wakes), and garbage sent
to the Raft ports (random bytes, a huge length prefix, a pickle that would run code)."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import threading
import uuid
import zlib
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

# -- a paused leader --------------------------------------------------------------------------


class BackgroundRequest(threading.Thread):
    """One HTTP request in a thread: `answer` is (status, body) or the exception it raised."""

    def __init__(self, cluster: LocalCluster, node: LocalNode, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.cluster, self.node, self.body = cluster, node, body
        self.answer: tuple[int, Any] | Exception | None = None

    def run(self) -> None:
        try:
            status, body, _ = self.cluster.request(
                self.node, "POST", "/v1/jobs", self.body, timeout_s=20
            )
            self.answer = (status, body)
        except Exception as error:
            self.answer = error


def jobs_with_marker(cluster: LocalCluster, node: LocalNode, marker: str) -> list[int]:
    jobs = cluster.list_jobs(node, consistent=1)
    return [job["id"] for job in jobs if (job["payload"] or {}).get("marker") == marker]


def assert_failed_or_applied_once(
    name: str, answer: tuple[int, Any] | Exception | None, found: list[int]
) -> None:
    assert len(found) <= 1, f"{name}: the write was applied {len(found)} times: jobs {found}"
    if isinstance(answer, tuple) and answer[0] in (200, 201):
        assert found == [answer[1]["id"]], f"{name}: acknowledged as {answer}, found {found}"


def test_a_paused_leaders_writes_never_come_back_as_phantoms_or_duplicates(
    cluster: LocalCluster,
) -> None:
    old_leader = cluster.leader()
    markers = {name: uuid.uuid4().hex for name in ("racing", "keyed", "unkeyed")}
    writes = {
        name: BackgroundRequest(
            cluster,
            old_leader,
            {"task": "t", "payload": {"marker": marker}}
            | ({} if name == "unkeyed" else {"key": marker}),
        )
        for name, marker in markers.items()
    }
    writes["racing"].start()  # may land just before the pause: committed, in flight, or not
    cluster.pause(old_leader)
    writes["keyed"].start()
    writes["unkeyed"].start()

    new_leader = cluster.leader(timeout_s=15)
    progress = [
        cluster.call("POST", "/v1/jobs", {"task": "t", "request_id": f"progress-{i}"})
        for i in range(5)
    ]
    cluster.resume(old_leader)
    reads_on_waking = [
        cluster.request(old_leader, "GET", f"/v1/jobs/{body['id']}?consistent=1", timeout_s=20)[0]
        for _, body, _ in progress
    ]
    for write in writes.values():
        write.join(30)
    cluster.wait_ready(timeout_s=15)
    digests = cluster.audit()

    assert new_leader is not old_leader
    assert [status for status, _, _ in progress] == [201] * 5
    assert len(set(digests.values())) == 1, f"replicas diverged: {digests}"
    assert reads_on_waking == [200] * 5, "a consistent read on the woken leader was stale"
    progress_ids = {body["id"] for _, body, _ in progress}
    for node in cluster.nodes:
        held = {job["id"] for job in cluster.list_jobs(node, consistent=1)}
        assert progress_ids <= held, f"{node.node_id} misses jobs committed while it slept"
        for name, marker in markers.items():
            found = jobs_with_marker(cluster, node, marker)
            assert_failed_or_applied_once(name, writes[name].answer, found)


# -- garbage on the Raft port -----------------------------------------------------------------


class CodeExecution:
    """Unpickling this runs `touch <path>`: the file must never appear."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.path}",)


def framed(data: bytes) -> bytes:
    """PySyncObj's wire framing: a native 4-byte signed length, then the message."""
    return struct.pack("i", len(data)) + data


def garbage_messages(evidence: Path) -> list[bytes]:
    payload = pickle.dumps(CodeExecution(evidence))
    return [
        os.urandom(64 * 1024),
        struct.pack("i", 2**31 - 1) + os.urandom(2 * 1024 * 1024),  # a length never reached
        struct.pack("i", -16) + os.urandom(64),
        framed(payload),  # a bare pickle
        framed(zlib.compress(payload)),  # what PySyncObj unpickles when it has no password
        framed(b"\x00" * 32),
        b"GET / HTTP/1.1\r\nHost: raft\r\n\r\n",
    ]


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def send_and_close(address: str, data: bytes) -> None:
    with connect(address) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            sock.recv(1024)  # until the node drops us (or the timeout)
        except OSError:
            pass  # the node hung up on us mid-send: that is fine


def assert_member_with_a_leader(cluster: LocalCluster, node: LocalNode) -> None:
    status, view, _ = cluster.request(node, "GET", "/v1/cluster")
    assert status == 200, view
    assert view["role"] in ("leader", "follower") and view["leader"], view
    assert {member["node_id"] for member in view["members"]} == {"n1", "n2", "n3"}


def test_garbage_on_the_raft_ports_neither_crashes_nor_wedges_the_cluster(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    evidence = tmp_path / "unpickled"
    targets = [cluster.leader(), cluster.followers()[0]]
    with ExitStack() as held_open:
        # Idle and half-sent connections stay open while the cluster has to keep working.
        for target in targets:
            for _ in range(10):
                held_open.enter_context(connect(target.raft_address))
            partial = held_open.enter_context(connect(target.raft_address))
            partial.sendall(struct.pack("i", 10**9) + b"x" * 1000)
        for target in targets:
            for message in garbage_messages(evidence):
                send_and_close(target.raft_address, message)

        acknowledged = [
            cluster.request(node, "POST", "/v1/jobs", {"task": "t"})[0]
            for node in cluster.nodes * 3
        ]
        for node in cluster.nodes:
            assert_member_with_a_leader(cluster, node)
        digests = cluster.audit()

    assert not cluster.crashed_nodes()
    assert acknowledged == [201] * 9
    assert len(set(digests.values())) == 1 and len(digests) == 3, digests
    assert not evidence.exists(), "a pickle sent to the Raft port was executed"
    leader_view = cluster.request(cluster.leader(), "GET", "/v1/cluster")[1]
    assert all(member["reachable"] for member in leader_view["members"]), leader_view
