"""Traces across processes (docs/operations/monitor.md): a client's span submits a job to a real
node, a real worker process runs it, and the spans of the node and the worker, sent over OTLP/HTTP
to a collector stub on loopback (decoded with opentelemetry-proto), continue the submitter's trace:
submit -> commit on the node, run -> the handler's own span on the worker, complete."""

from __future__ import annotations

import contextlib
import gzip
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import TracerProvider

from raftcron.cluster.clients.client import Client
from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster

from .conftest import HERE, REPO_ROOT, eventually

pytestmark = pytest.mark.processes  # starts processes: make integration

QUEUE = "traced"
# Spans go out 100 ms after they end, not 5 s: the test waits for them.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


class Collector:
    """An OTLP/HTTP receiver of traces: every span it was sent, decoded, with its service."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector.add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    with self.lock:
                        self.spans.append({
                            "name": span.name,
                            "service": resource.get("service.name"),
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_id": span.parent_span_id.hex(),
                            "kind": span.kind,
                            "status": span.status.code,
                            "events": [event.name for event in span.events],
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                        })

    def of_trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [span for span in self.spans if span["trace_id"] == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    stub = Collector()
    yield stub
    stub.close()


@pytest.fixture(scope="module")
def traced_cluster(tmp_path_factory: pytest.TempPathFactory,
                   collector: Collector) -> Iterator[LocalCluster]:
    env = {"RAFTCRON_TRACING_OTLP_ENDPOINT": collector.url, **FAST_EXPORT}
    with LocalCluster(tmp_path_factory.mktemp("traced"), nodes=1, raft=FAST_RAFT,
                      env=env) as local:
        local.start()
        local.wait_ready(30)
        yield local


@pytest.fixture(scope="module")
def traced_worker(traced_cluster: LocalCluster, collector: Collector,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    argv = [sys.executable, "-m", "raftcron.cluster.worker", "--connect",
            traced_cluster.nodes[0].url, "--queues", QUEUE, "--name", "tracer",
            "--import", "sample_tasks", "--path", str(HERE), "--wait-ms", "1000"]
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1",
               OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, **FAST_EXPORT)
    log_path = tmp_path_factory.mktemp("worker") / "tracer.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                                   stdout=log_file, stderr=log_file)
    yield process
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.wait(10)


def submitted_in_a_span(cluster: LocalCluster, task: str, **fields: Any
                        ) -> tuple[dict[str, Any], str, str]:
    """(the job, the submitter span's trace id and span id), submitted within that span."""
    tracer = TracerProvider().get_tracer("submitter")
    with Client([cluster.nodes[0].url], retry_deadline_s=20) as client, \
            tracer.start_as_current_span("submitter") as span:
        job = client.submit(task, {}, queue=QUEUE, **fields)
    context = span.get_span_context()
    return job, f"{context.trace_id:032x}", f"{context.span_id:016x}"


def spans_of(collector: Collector, trace_id: str, names: set[str]) -> dict[str, dict[str, Any]]:
    def found() -> dict[str, dict[str, Any]] | None:
        spans = {span["name"]: span for span in collector.of_trace(trace_id)}
        return spans if names <= set(spans) else None

    spans = eventually(found, 20, f"spans {sorted(names)} of trace {trace_id}")
    assert spans is not None
    return spans


def test_the_workers_run_span_continues_the_submitters_trace(
    traced_cluster: LocalCluster, traced_worker: subprocess.Popen[bytes],
    collector: Collector,
) -> None:
    job, trace_id, submitter_id = submitted_in_a_span(traced_cluster, "traced")
    assert job["traceparent"].startswith(f"00-{trace_id}-{submitter_id}-")
    spans = spans_of(collector, trace_id, {"submit", "commit", "run", "handler-work", "complete"})
    submit, commit, run = spans["submit"], spans["commit"], spans["run"]
    assert (submit["service"], submit["parent_id"]) == ("raftcron-node", submitter_id)
    assert submit["attributes"] == {"raftcron.jobs": 1, "raftcron.queue": QUEUE}
    assert commit["parent_id"] == submit["span_id"]
    assert (run["service"], run["parent_id"]) == ("raftcron-worker", submitter_id)
    assert run["attributes"] == {"raftcron.job_id": job["id"], "raftcron.task": "traced",
                                 "raftcron.queue": QUEUE, "raftcron.attempt": 1,
                                 "raftcron.outcome": "succeeded"}
    assert spans["handler-work"]["parent_id"] == run["span_id"]
    assert spans["complete"]["attributes"] == {"raftcron.job_id": job["id"],
                                               "raftcron.outcome": "succeeded",
                                               "raftcron.ack": "ok"}
    # The claim that leased it: the worker's client span, the node's handler its child.
    worker_claims = {span["span_id"] for span in collector.spans
                     if span["name"] == "claim" and span["service"] == "raftcron-worker"}
    node_claims = [span for span in collector.spans
                   if span["name"] == "claim" and span["service"] == "raftcron-node"
                   and span["attributes"].get("raftcron.jobs") == 1]
    assert any(span["parent_id"] in worker_claims for span in node_claims)


def test_a_failed_attempt_is_an_error_span_with_its_exception(
    traced_cluster: LocalCluster, traced_worker: subprocess.Popen[bytes],
    collector: Collector,
) -> None:
    _, trace_id, submitter_id = submitted_in_a_span(traced_cluster, "boom", max_attempts=1)
    run = spans_of(collector, trace_id, {"run"})["run"]
    assert run["parent_id"] == submitter_id
    assert run["attributes"]["raftcron.outcome"] == "failed"
    assert run["status"] == 2 and run["events"] == ["exception"]  # STATUS_CODE_ERROR


def test_a_job_submitted_outside_any_trace_has_none_and_runs_in_a_trace_of_its_own(
    traced_cluster: LocalCluster, traced_worker: subprocess.Popen[bytes],
    collector: Collector,
) -> None:
    with Client([traced_cluster.nodes[0].url], retry_deadline_s=20) as client:
        job = client.submit("echo", {}, queue=QUEUE)
        assert job["traceparent"] is None

        def run_span() -> dict[str, Any] | None:
            return next((span for span in list(collector.spans) if span["name"] == "run"
                         and span["attributes"].get("raftcron.job_id") == job["id"]), None)

        run = eventually(run_span, 20, "the run span of a job without a traceparent")
    assert run["parent_id"] == ""


def test_without_an_endpoint_nothing_imports_opentelemetry(tmp_path: Path) -> None:
    program = (
        "import sys\n"
        "import raftcron.cluster.node, raftcron.cluster.http.app, raftcron.cluster.clients.client\n"
        "import raftcron.cluster.worker.cli\n"
        "from raftcron.cluster.telemetry import tracing\n"
        "assert tracing.start_from_environment('raftcron-worker') is False\n"
        "with tracing.span('submit'):\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry'))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", program], cwd=REPO_ROOT, env=dict(
        env, PYTHONPATH=str(REPO_ROOT)), capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stderr
