"""cluster/telemetry/tracing.py (docs/operations/monitor.md): off, nothing of OpenTelemetry is
imported and no span is made; on, spans are named and nested as a job's trace needs; an endpoint
configured without the `otel` extra is refused at start, naming the install command."""

from __future__ import annotations

import asyncio
import importlib.abc
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from raftcron.cluster import config, node
from raftcron.cluster.telemetry import tracing
from raftcron.cluster.worker.runtime import Worker
from raftcron.scheduler import parse

SUBMITTER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class _NoOpenTelemetry(importlib.abc.MetaPathFinder):
    """Makes every import of opentelemetry fail, as in a process without the extra."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"No module named {name!r}", name=name)
        return None


@pytest.fixture
def without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [n for n in sys.modules if n.split(".")[0] == "opentelemetry"]:
        monkeypatch.delitem(sys.modules, name)
    blocker = _NoOpenTelemetry()
    sys.meta_path.insert(0, blocker)
    try:
        yield
    finally:
        sys.meta_path.remove(blocker)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        yield exporter
    finally:
        tracing.use(None)


def test_off_nothing_is_imported_and_no_span_is_made(without_opentelemetry: None) -> None:
    assert not tracing.enabled()
    assert tracing.start(None, "raftcron-node") is False
    with tracing.span("submit", kind="server", traceparent=SUBMITTER) as span:
        assert span is None
    run = tracing.start_span("run", traceparent=SUBMITTER)
    assert run is None and tracing.context_of(run) is None
    tracing.set_attributes(run, {"a": 1})
    tracing.end(run, {"raftcron.outcome": "succeeded"}, error="boom")
    assert tracing.outgoing_traceparent() is None
    assert not [n for n in sys.modules if n.split(".")[0] == "opentelemetry"]


def test_an_endpoint_without_the_extra_is_refused_naming_the_install(
    without_opentelemetry: None,
) -> None:
    with pytest.raises(tracing.TracingUnavailable) as refused:
        tracing.start("http://127.0.0.1:4318", "raftcron-node", where="tracing.otlp_endpoint")
    assert "pip install 'raftcron[otel]'" in str(refused.value)
    assert "tracing.otlp_endpoint" in str(refused.value)
    assert not tracing.enabled()


def test_a_node_configured_for_traces_without_the_extra_does_not_start(
    without_opentelemetry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "node.toml"
    path.write_text('node_id = "n1"\nraft_address = "127.0.0.1:17001"\n'
                    'http_address = "127.0.0.1:18001"\n'
                    '[tracing]\notlp_endpoint = "http://127.0.0.1:4318"\n')
    assert node.run(str(path)) == 2
    assert "pip install 'raftcron[otel]'" in capsys.readouterr().err


def test_a_worker_with_an_endpoint_in_its_environment_needs_the_extra(
    without_opentelemetry: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(tracing.ENDPOINT_ENV, "http://127.0.0.1:4318")
    worker = Worker("http://127.0.0.1:1", name="w")
    with pytest.raises(tracing.TracingUnavailable, match=r"OTEL_EXPORTER_OTLP_ENDPOINT"):
        asyncio.run(worker.serve())


def test_the_config_key_and_its_environment_form(tmp_path: Path) -> None:
    base = {"node_id": "n1", "raft_address": "127.0.0.1:7001",
            "http_address": "127.0.0.1:8001"}
    assert config.parse(base, base_dir=tmp_path).tracing.otlp_endpoint is None
    loaded = config.load(None, {**{f"RAFTCRON_{k.upper()}": v for k, v in base.items()},
                                "RAFTCRON_TRACING_OTLP_ENDPOINT": "http://collector:4318"})
    assert loaded.tracing.otlp_endpoint == "http://collector:4318"
    with pytest.raises(config.ConfigError) as error:
        config.parse({**base, "tracing": {"otlp_endpoint": "collector:4318"}}, base_dir=tmp_path)
    assert error.value.key == "tracing.otlp_endpoint"
    with pytest.raises(config.ConfigError) as error:
        config.parse({**base, "tracing": {"endpoint": "http://c:4318"}}, base_dir=tmp_path)
    assert error.value.key == "tracing.endpoint"


def test_on_spans_are_named_and_nested_and_continue_the_given_trace(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.span("submit", kind="server", traceparent=SUBMITTER,
                      attributes={"raftcron.jobs": 1}) as submit:
        assert submit is not None
        with tracing.span("commit"):
            pass
    submit_span, commit_span = (
        {s.name: s for s in spans.get_finished_spans()}[name] for name in ("submit", "commit"))
    trace_id, parent_id = int(SUBMITTER[3:35], 16), int(SUBMITTER[36:52], 16)
    assert submit_span.context.trace_id == commit_span.context.trace_id == trace_id
    assert submit_span.parent is not None and submit_span.parent.span_id == parent_id
    assert commit_span.parent is not None
    assert commit_span.parent.span_id == submit_span.context.span_id
    assert submit_span.kind == SpanKind.SERVER and submit_span.attributes == {"raftcron.jobs": 1}


def test_a_run_span_is_the_parent_of_the_handlers_spans_and_records_its_failure(
    spans: InMemorySpanExporter,
) -> None:
    run = tracing.start_span("run", kind="consumer", traceparent=SUBMITTER, root=True)
    within = tracing.context_of(run)
    assert within is not None

    def handler() -> str | None:
        with tracing.span("inside"):
            return tracing.outgoing_traceparent()

    inside_traceparent = within.run(handler)
    assert tracing.outgoing_traceparent() is None  # the caller's context is untouched
    run.record_exception(ValueError("bad input"))
    tracing.end(run, {"raftcron.outcome": "failed"}, error="ValueError: bad input")
    found = {s.name: s for s in spans.get_finished_spans()}
    inside, run_span = found["inside"], found["run"]
    assert inside.parent is not None and run_span.parent is not None
    assert run_span.context is not None and run_span.attributes is not None
    assert inside.parent.span_id == run_span.context.span_id
    assert run_span.parent.span_id == int(SUBMITTER[36:52], 16)
    assert run_span.status.status_code == StatusCode.ERROR
    assert run_span.attributes["raftcron.outcome"] == "failed"
    assert [e.name for e in found["run"].events] == ["exception"]
    # What a client sends from within a span is a traceparent the API takes.
    assert parse.traceparent(inside_traceparent, "traceparent") == inside_traceparent
    assert inside_traceparent.split("-")[1] == SUBMITTER.split("-")[1]


def test_a_root_span_starts_a_trace_of_its_own_and_an_exception_marks_it(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.span("outer"), pytest.raises(RuntimeError):  # noqa: SIM117
        with tracing.span("claim", kind="client", root=True):
            raise RuntimeError("node gone")
    found = {s.name: s for s in spans.get_finished_spans()}
    assert found["claim"].parent is None
    assert found["claim"].context.trace_id != found["outer"].context.trace_id
    assert found["claim"].status.status_code == StatusCode.ERROR


def test_the_blocking_client_carries_its_callers_trace_to_its_loop(
    spans: InMemorySpanExporter,
) -> None:
    async def sent() -> str | None:
        return tracing.outgoing_traceparent()

    with tracing.span("submitter") as submitter:
        traceparent = tracing.current_traceparent()
    assert traceparent is not None
    assert int(traceparent.split("-")[2], 16) == submitter.get_span_context().span_id
    assert asyncio.run(tracing.carrying(traceparent, sent())) == traceparent
    assert asyncio.run(sent()) is None
