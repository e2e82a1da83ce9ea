"""Traces (docs/operations/monitor.md, DESIGN.md §9.5): OpenTelemetry spans of a job's life,
off unless an OTLP endpoint is configured.

Off, this module imports nothing of OpenTelemetry and every call is one test of a global: a
node or worker without the `otel` extra pays nothing. On (`start` with an endpoint: a node's
`[tracing] otlp_endpoint`, a worker's `OTEL_EXPORTER_OTLP_ENDPOINT`), spans go in batches to
the collector's OTLP/HTTP `/v1/traces`. Call sites stay one line: `with tracing.span(...)`
gives the span (None when off), and the helpers take None.

The spans: `submit` (the API's handler, a server span continuing the client's `traceparent`
header), `commit` (its Raft proposal), `claim` (the worker's call, a client span, and the
node's handler), `run` (one attempt of a job on a worker, its parent the job's traceparent:
the submitter's trace goes on), `complete` (the node's commit of an ack, in the job's trace).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"  # the worker's (OpenTelemetry's own variable)
INSTALL = "pip install 'raftcron[otel]'"
TRACER_NAME = "raftcron"
_OFF = contextlib.nullcontext()
SHUTDOWN_S = 2.0

_tracer: Any = None  # an OpenTelemetry Tracer while traces are on
_provider: Any = None  # the TracerProvider this module made (start), to flush at shutdown


class TracingUnavailable(RuntimeError):
    """An endpoint is configured but OpenTelemetry is not installed."""


def enabled() -> bool:
    return _tracer is not None


def start(endpoint: str | None, service: str, instance: str | None = None, *,
          where: str = ENDPOINT_ENV) -> bool:
    """Turn traces on when `endpoint` (an OTLP/HTTP collector's URL) is given; without one
    nothing is imported. `service` and `instance` name the process in its spans; `where`
    names the setting in the error when the extra is missing."""
    global _provider
    if not endpoint:
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as error:
        raise TracingUnavailable(
            f"{where} is set ({endpoint}), so traces are on, but OpenTelemetry is not "
            f"installed ({error.name} is missing): {INSTALL}, or unset {where}"
        ) from None
    resource = {"service.name": service}
    if instance is not None:
        resource["service.instance.id"] = instance
    provider = TracerProvider(resource=Resource.create(resource))
    url = endpoint.rstrip("/") + "/v1/traces"  # what OpenTelemetry does with ENDPOINT_ENV
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    # Also the process's provider, so a handler's own spans go out within its run span (a
    # provider the application set first stays: OpenTelemetry keeps the first).
    trace.set_tracer_provider(provider)
    _provider = provider
    use(provider)
    return True


def start_from_environment(service: str, instance: str | None = None) -> bool:
    """A worker's traces: on when OTEL_EXPORTER_OTLP_ENDPOINT is set."""
    return start(os.environ.get(ENDPOINT_ENV), service, instance)


def use(provider: Any) -> None:
    """Spans from `provider` (a test's, with an in-memory exporter); None: off."""
    global _tracer
    _tracer = None if provider is None else provider.get_tracer(TRACER_NAME)


def shutdown(timeout_s: float = SHUTDOWN_S) -> None:
    """Send what is still batched (a process that stops), waiting at most `timeout_s`: a
    collector that does not answer must not hold up a node's or a worker's stop."""
    global _provider
    provider, _provider = _provider, None
    use(None)
    if provider is not None:
        sender = threading.Thread(target=provider.shutdown, name="raftcron-traces", daemon=True)
        sender.start()
        sender.join(timeout_s)


def span(name: str, *, kind: str = "internal", traceparent: str | None = None,
         root: bool = False, attributes: Mapping[str, Any] | None = None) -> Any:
    """A context manager around a span made current (None when off); its parent is
    `traceparent` when given, else the current span (`root`: none). An exception that leaves
    it is recorded and marks the span an error."""
    if _tracer is None:
        return _OFF
    return _tracer.start_as_current_span(
        name, context=_parent(traceparent, root), kind=_kind(kind), attributes=attributes)


def start_span(name: str, *, kind: str = "internal", traceparent: str | None = None,
               root: bool = False, attributes: Mapping[str, Any] | None = None) -> Any:
    """A span not made current (None when off), ended by `end`: one that outlives a block."""
    if _tracer is None:
        return None
    return _tracer.start_span(
        name, context=_parent(traceparent, root), kind=_kind(kind), attributes=attributes)


def end(span_: Any, attributes: Mapping[str, Any] | None = None, *,
        error: BaseException | str | None = None) -> None:
    if span_ is None:
        return
    if attributes:
        span_.set_attributes(dict(attributes))
    if error is not None:
        failed(span_, error)
    span_.end()


def failed(span_: Any, error: BaseException | str) -> None:
    """Mark the span an error: an exception is recorded with its traceback."""
    if span_ is None:
        return
    from opentelemetry.trace import Status, StatusCode

    if isinstance(error, BaseException):
        span_.record_exception(error)
    span_.set_status(Status(StatusCode.ERROR, str(error)[:200]))


def set_attributes(span_: Any, attributes: Mapping[str, Any]) -> None:
    if span_ is not None:
        span_.set_attributes(dict(attributes))


def context_of(span_: Any) -> contextvars.Context | None:
    """A copy of the current context with `span_` current (None when off): code run in it
    (a handler: `ctx.run(...)`, and the tasks it starts, which copy it) makes its spans
    children of `span_`, and nothing is attached to the caller's context."""
    if span_ is None:
        return None
    from opentelemetry import context, trace

    copy = contextvars.copy_context()
    copy.run(context.attach, trace.set_span_in_context(span_))  # the copy is thrown away after
    return copy


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, if the process uses OpenTelemetry at all (the
    client sends it as a header). Reads only what the application imported already."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


# The blocking client's caller's traceparent, for its calls that run on the client's own
# event-loop thread, where the caller's context is not current (cluster/clients/client.py).
_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("raftcron_caller_trace",
                                                                    default=None)


def outgoing_traceparent() -> str | None:
    """The `traceparent` header of a request the client sends (None: none)."""
    return _CALLER.get() or current_traceparent()


async def carrying(traceparent: str, coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` (in a task of its own) sending `traceparent` with its requests."""
    _CALLER.set(traceparent)  # in this task's context only
    return await coroutine


def _parent(traceparent: str | None, root: bool) -> Any:
    if traceparent is None and not root:
        return None  # the current context
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if traceparent is None:
        return Context()
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


def _kind(kind: str) -> Any:
    from opentelemetry.trace import SpanKind

    return {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER,
            "client": SpanKind.CLIENT, "consumer": SpanKind.CONSUMER}[kind]
