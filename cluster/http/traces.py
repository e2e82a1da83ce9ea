"""The API's side of traces (cluster/telemetry/tracing.py): the client's `traceparent` header, the
server spans of a request, and the `complete` spans of acks in their jobs' traces.

The header's trace context is recorded with the jobs a submit creates (their `traceparent`,
unless the body gives one) once the cluster is finalized: before, the previous release would
refuse the field (DESIGN.md §9.0), so the header is then only the parent of this node's spans.
A malformed header is ignored, as W3C Trace Context asks: a proxy's bad header must not fail a
submit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from aiohttp import web

from raftcron.cluster.http.common import services
from raftcron.cluster.telemetry import tracing
from raftcron.scheduler import parse, views
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.specs import JobSpec

HEADER = "traceparent"
QUEUES_NAMED_MAX = 10  # a batch's span names at most this many of its queues


def incoming(request: web.Request) -> str | None:
    """The request's `traceparent` header, if it is a valid one."""
    header = request.headers.get(HEADER)
    if header is None:
        return None
    try:
        return parse.traceparent(header.strip(), HEADER)
    except Invalid:
        return None


def server_span(request: web.Request, name: str) -> Any:
    """The span of a request (None when off), continuing the client's trace."""
    if not tracing.enabled():
        return tracing.span(name)
    return tracing.span(name, kind="server", traceparent=incoming(request))


def submitted(span: Any, specs: Sequence[JobSpec]) -> None:
    """A submit span's attributes: how many jobs, and their queues."""
    if span is None:
        return
    queues = sorted({spec.queue for spec in specs})[:QUEUES_NAMED_MAX]
    only = queues[0] if queues and not queues[1:] else None  # one queue: named plainly
    tracing.set_attributes(span, {"raftcron.jobs": len(specs),
                                  "raftcron.queue": queues if only is None else only})


def traced(request: web.Request, specs: tuple[JobSpec, ...]) -> tuple[JobSpec, ...]:
    """`specs` with the header's traceparent on each that gives none, once finalized."""
    header = incoming(request)
    if header is None or all(spec.traceparent is not None for spec in specs):
        return specs
    if not services(request).node.machine.read(lambda state: state.finalized):
        return specs
    return tuple(spec if spec.traceparent is not None
                 else dataclasses.replace(spec, traceparent=header) for spec in specs)


def ack_spans(request: web.Request, acks: Iterable[tuple[int, str]]) -> dict[int, Any]:
    """For acks of (job id, outcome): a `complete` span per job that has a traceparent, in its
    job's trace, ended by `acked` once the ack is committed (nothing when off)."""
    if not tracing.enabled():
        return {}
    outcomes = dict(acks)
    if not outcomes:
        return {}
    ids = list(outcomes)
    found = services(request).node.machine.read(lambda state: views.traceparents(state, ids))
    return {job_id: tracing.start_span("complete", traceparent=traceparent, attributes={
                "raftcron.job_id": job_id, "raftcron.outcome": outcomes[job_id]})
            for job_id, traceparent in found.items()}


def acked(spans: dict[int, Any], answers: Iterable[Sequence[Any]],
          error: BaseException | None = None) -> None:
    """End the `complete` spans with what the cluster answered each ack (ok, or why not)."""
    if not spans:
        return
    answered = {job_id: answer for job_id, answer in answers}
    for job_id, span in spans.items():
        tracing.end(span, {"raftcron.ack": str(answered.get(job_id, "unknown"))}, error=error)
