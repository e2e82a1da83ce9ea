"""HTTPS on real nodes with a test CA (cluster/dev/certs.py runs `openssl`; DESIGN.md §8.3):
the client, the CLI and the nodes verify the server, plain HTTP gets nothing from a TLS port,
a SIGHUP re-reads the certificate, and mutual TLS refuses a client without a certificate.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raftcron.cluster.clients.client import Client, Unavailable
from raftcron.cluster.dev.certs import LocalCA
from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster
from raftcron.cluster.dev.nodeprocesses import REPO_ROOT


@pytest.fixture(autouse=True, scope="module")
def _openssl() -> None:
    """The test CA is made by the openssl command: without it these tests fail, naming the
    package, on a developer's machine as in CI (a skip would hide that HTTPS went untested)."""
    if shutil.which("openssl") is None:
        pytest.fail("the TLS tests make their test CA with the openssl command, which is not "
                    "installed: apt-get install openssl (.ci/run installs it)", pytrace=False)


def peers_clocks_read(cluster: LocalCluster, token: str | None = None) -> bool:
    """Every node has read every peer's clock (cluster/clock/clockpoll.py dials them like a
    client)."""
    for node in cluster.nodes:
        status, view, _ = cluster.request(node, "GET", "/v1/cluster", token=token)
        if status != 200 or any(m["clock_offset_ms"] is None for m in view["members"]):
            return False
    return True


def served_certificate(address: str, context: ssl.SSLContext) -> str:
    """A digest of the certificate a new connection to the node is shown."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


def test_https_with_a_test_ca(cluster_factory: Any, tmp_path: Path) -> None:
    ca = LocalCA(tmp_path / "ca")
    cert, key = ca.issue("node", server=True)
    cluster = LocalCluster(
        tmp_path / "tls", nodes=3, raft=FAST_RAFT,
        api={"tls_cert_file": str(cert), "tls_key_file": str(key)},
        tokens={"admin-token-0123": "admin"},
        env={"RAFTCRON_CA_FILE": str(ca.cert)},  # how the nodes verify each other
    )
    cluster.client_tls = ca.context()
    cluster_factory.clusters.append(cluster)
    cluster.start()
    cluster.wait_ready()
    node = cluster.nodes[0]
    urls = [n.url for n in cluster.nodes]
    assert all(url.startswith("https://") for url in urls)

    with Client(urls, token="admin-token-0123", ca_file=str(ca.cert)) as client:
        job = client.submit("t", {"n": 1})
        assert client.job(job["id"])["id"] == job["id"]
    # Without the CA the server cannot be verified: nothing is sent.
    with Client(urls, token="admin-token-0123", retry_deadline_s=1.0) as client, \
            pytest.raises(Unavailable, match="certificate"):
        client.submit("t", {"n": 2})
    # Plain HTTP on the TLS port gets no HTTP answer.
    host, port = node.http_address.rsplit(":", 1)
    plain = http.client.HTTPConnection(host, int(port), timeout=10)
    with pytest.raises((http.client.HTTPException, OSError)):
        plain.request("GET", "/healthz")
        plain.getresponse().read()
    plain.close()
    # The nodes ask each other over HTTPS, verifying with the CA.
    status, view, _ = cluster.request(node, "GET", "/v1/cluster?members=1",
                                      token="admin-token-0123")
    assert status == 200 and all(m["reachable"] for m in view["members"]), view
    cluster.wait_for(lambda: peers_clocks_read(cluster, "admin-token-0123"), 20,
                     "every node read its peers' clocks over HTTPS")
    # The CLI verifies too.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAFTCRON_API_TOKEN": "admin-token-0123"}
    command = [sys.executable, "-m", "raftcron.cluster.commandline", "jobs", "show", str(job["id"]),
               "--connect", ",".join(urls), "--deadline", "5"]
    ok = subprocess.run([*command, "--ca-file", str(ca.cert)], env=env, capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "certificate" in refused.stderr.lower()
    # `cluster status` asks every member for its own view: over HTTPS too (it once asked
    # http:// and called every member of a TLS cluster unreachable).
    status_command = [sys.executable, "-m", "raftcron.cluster.commandline", "cluster", "status",
                      "--connect", ",".join(urls), "--ca-file", str(ca.cert)]
    shown = subprocess.run(status_command, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "unreachable" not in shown.stdout and shown.stdout.count("127.0.0.1:") == 3, shown.stdout

    # SIGHUP: the node serves the new certificate to new connections.
    before = served_certificate(node.http_address, ca.context())
    new_cert, new_key = ca.issue("node-renewed", server=True)
    shutil.copyfile(new_cert, cert)
    shutil.copyfile(new_key, key)
    cluster.send_signal(node, signal.SIGHUP)
    cluster.wait_for(lambda: served_certificate(node.http_address, ca.context()) != before, 20,
                     "the renewed certificate served")


def test_mutual_tls_refuses_a_client_without_a_certificate(
        cluster_factory: Any, tmp_path: Path) -> None:
    ca = LocalCA(tmp_path / "ca")
    cert, key = ca.issue("node", server=True, client=True)
    worker_cert = ca.issue("worker", server=False, client=True)
    cluster = LocalCluster(
        tmp_path / "mtls", nodes=3, raft=FAST_RAFT,
        api={"tls_cert_file": str(cert), "tls_key_file": str(key),
             "tls_client_ca_file": str(ca.cert)})
    cluster.client_tls = ca.context(worker_cert)
    cluster_factory.clusters.append(cluster)
    cluster.start()
    node = cluster.nodes[0]
    cluster.wait_ready()
    assert cluster.request(node, "GET", "/healthz")[0] == 200
    # The nodes show each other their own certificate: clocks and members are read.
    cluster.wait_for(lambda: peers_clocks_read(cluster), 20,
                     "every node read its peers' clocks over mutual TLS")
    status, view, _ = cluster.request(node, "GET", "/v1/cluster?members=1")
    assert status == 200 and all(m["reachable"] for m in view["members"]), view
    with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
        host, port = node.http_address.rsplit(":", 1)
        anonymous = http.client.HTTPSConnection(host, int(port), timeout=10,
                                                context=ca.context())
        anonymous.request("GET", "/healthz")
        anonymous.getresponse().read()
    with Client([node.url], ca_file=str(ca.cert), cert_file=str(worker_cert[0]),
                key_file=str(worker_cert[1])) as client:
        assert client.submit("t", {})["id"] >= 1
        # A worker process shows its certificate, claims and reports over mutual TLS.
        job = client.submit("shell", {"argv": ["sh", "-c", "echo over-mtls"]}, queue="mtls")
        log = (tmp_path / "worker.log").open("wb")
        worker = subprocess.Popen(
            [sys.executable, "-m", "raftcron.cluster.commandline", "worker", "--allow-shell",
             "--connect", ",".join(n.url for n in cluster.nodes), "--queues", "mtls",
             "--name", "mtls-worker", "--ca-file", str(ca.cert),
             "--cert-file", str(worker_cert[0]), "--key-file", str(worker_cert[1])],
            cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, start_new_session=True)
        try:
            done = client.wait(job["id"], timeout_s=60)
        finally:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
            log.close()
        assert done["status"] == "succeeded", (done, (tmp_path / "worker.log").read_text()[-2000:])
        assert "over-mtls" in str(done["result"])
