"""Routes of jobs and workflows: submit, batch, workflows, read, list, cancel, retry, and the
worker's per-job calls (heartbeat, complete, fail)."""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web

from raftcron.cluster.archive.fill import COMPLETE_HEADER, LOCAL_HEADER, forward_read
from raftcron.cluster.http import bounds, traces
from raftcron.cluster.http.common import (
    HttpError,
    commit,
    commit_result,
    json_response,
    maybe_consistent,
    object_body,
    only,
    parse_or_400,
    path_int,
    query_int,
    read_json,
    rejected,
    requires,
    services,
    take_request_id,
)
from raftcron.cluster.http.jobsearch import check_search, search_page
from raftcron.scheduler import views
from raftcron.scheduler.commands import (
    CancelJob,
    CompleteJob,
    FailJob,
    Heartbeat,
    RetryJob,
    SubmitJobs,
    SubmitWorkflow,
)
from raftcron.scheduler.errors import Invalid, Ok, Rejected
from raftcron.scheduler.search import JobFilter
from raftcron.scheduler.specs import JobSpec, WorkflowSpec
from raftcron.scheduler.state import SchedulerState


def render_jobs(
    request: web.Request, items: list[list[Any]], notes: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """[id, created] pairs from a submit result -> job views (with what `unique` and
    `debounce` did: the result's other keys)."""
    machine = services(request).node.machine
    return machine.read(lambda state: views.created_jobs(state, items, notes))


def _as_single_job(error: HttpError) -> HttpError:
    """A single submit is a batch of one inside; its errors name the fields the client sent."""
    if error.field and error.field.startswith("jobs[0]."):
        error.field = error.field.removeprefix("jobs[0].")
        error.message = error.message.removeprefix("jobs[0].")
    return error


@requires("submit")
async def submit_job(request: web.Request) -> web.Response:
    with traces.server_span(request, "submit") as span:
        body = object_body(await read_json(request))
        request_id = take_request_id(body, request)
        spec = parse_or_400(lambda: JobSpec.parse(body))
        traces.submitted(span, (spec,))
        try:
            value = await commit(request, SubmitJobs(request_id, traces.traced(request, (spec,))))
        except HttpError as error:
            raise _as_single_job(error) from None
        [view] = render_jobs(request, value["jobs"], value)
        return json_response(view, status=201 if view["created"] else 200)


@requires("submit")
async def submit_batch(request: web.Request) -> web.Response:
    with traces.server_span(request, "submit") as span:
        body = object_body(await read_json(request))
        request_id = take_request_id(body, request)
        if set(body) - {"jobs"}:
            raise HttpError(
                400,
                "invalid",
                "unknown field (known: jobs, request_id)",
                sorted(set(body) - {"jobs"})[0],
            )
        command = parse_or_400(lambda: SubmitJobs.from_wire({"jobs": body.get("jobs")}))
        traces.submitted(span, command.jobs)
        value = await commit(request, SubmitJobs(request_id, traces.traced(request, command.jobs)))
        jobs = render_jobs(request, value["jobs"], value)
        created = any(view["created"] for view in jobs)
        return json_response({"jobs": jobs}, status=201 if created else 200)


@requires("submit")
async def submit_workflow(request: web.Request) -> web.Response:
    with traces.server_span(request, "submit") as span:
        body = object_body(await read_json(request))
        request_id = take_request_id(body, request)
        spec = parse_or_400(lambda: WorkflowSpec.parse(body))
        traces.submitted(span, [node.job for node in spec.nodes])
        return await _submit_workflow(request, request_id, spec)


async def _submit_workflow(
    request: web.Request, request_id: str, spec: WorkflowSpec
) -> web.Response:
    jobs_traced = traces.traced(request, tuple(node.job for node in spec.nodes))
    if jobs_traced != tuple(node.job for node in spec.nodes):
        spec = dataclasses.replace(spec, nodes=tuple(
            dataclasses.replace(node, job=job) for node, job in zip(spec.nodes, jobs_traced,
                                                                   strict=True)))
    value = await commit(request, SubmitWorkflow(request_id, spec))
    names = {job_id: name for name, job_id in value["jobs"]}
    jobs = render_jobs(request, [[job_id, value["created"]] for job_id in names])
    for view in jobs:
        view["name"] = names[view["id"]]
    status = 201 if value["created"] else 200
    return json_response(
        {"workflow_id": value["workflow_id"], "created": value["created"], "jobs": jobs},
        status=status,
    )


async def get_job(request: web.Request) -> web.Response:
    job_id = path_int(request, "id")
    await maybe_consistent(request)
    node = services(request).node
    archive = node.archive

    def find(state: SchedulerState) -> dict[str, Any] | None:
        # The state and the archive's hand-over together, under the apply lock: a job in
        # neither is in the archive's file (it leaves the hand-over once written there).
        view = views.find_job(state, job_id)
        return view if view is not None or archive is None else archive.pending_view(job_id)

    view = node.machine.read(find)
    if view is None and archive is not None:  # left the state: archived, if still kept
        view = await archive.get(job_id)
        if view is None and not archive.whole:  # it may be in what this member misses
            view = await _from_a_peer(request, whole=False)
    if view is None:
        raise HttpError(404, "not_found", f"no job {job_id}", "id")
    return json_response(view)


PAGING = ("limit", "cursor", "consistent", "archived")


async def get_jobs(request: web.Request) -> web.Response:
    """Live and archived jobs alike (DESIGN.md §9.2), newest first, one id cursor: the state's
    (and the archive's hand-over) under the apply lock, a bounded number per read, then the
    archive's file over the same range of ids; merged, each job once."""
    try:
        query = JobFilter.parse(request.query.items(), ignore=PAGING)
    except Invalid as error:
        raise HttpError(400, error.code, error.message, error.field) from None
    limit = query_int(request, "limit", default=100, low=1, high=bounds.PAGE_MAX) or 100
    cursor = query_int(request, "cursor", default=None, low=1, high=bounds.CURSOR_MAX)
    sources = _sources(request.query.get("archived"))
    await maybe_consistent(request)
    node = services(request).node
    archive = node.archive if "archive" in sources else None
    if archive is not None and not archive.whole:  # a member whose archive is whole answers
        answer = await _from_a_peer(request, whole=True)
        if answer is not None:
            return json_response(answer)
    check_search(node, query, archive)
    jobs, next_cursor = await search_page(node, query, cursor=cursor, limit=limit,
                                          sources=sources)
    for view in jobs:
        view.pop("history", None)  # lists leave out the attempts, as they always did
    # Whether this answer misses nothing archived (a forwarding member asks: fill.py).
    missing = archive is not None and not archive.whole
    whole = not missing and (archive is not None or "archive" not in sources)
    return json_response(
        {
            "jobs": jobs,
            "next_cursor": next_cursor,
            "node": node.config.node_id,
            "applied_index": node.applied_index,
            **({"archive_incomplete": True} if missing else {}),
        },
        headers={COMPLETE_HEADER: "1" if whole else "0"},
    )


async def _from_a_peer(request: web.Request, *, whole: bool) -> dict[str, Any] | None:
    """The answer of a member (`whole`: one whose archive misses nothing) to this GET, for a
    member still filling its archive (cluster/archive/fill.py); None: none answered, or this
    request was itself forwarded."""
    svc = services(request)
    if LOCAL_HEADER in request.headers or svc.dialer is None:
        return None
    answer = await forward_read(svc.dialer, svc.node.peer_addresses(), request.path_qs,
                                request.headers.get("Authorization"), whole=whole)
    return None if answer is None else answer[1]


def _sources(archived: str | None) -> tuple[str, ...]:
    if archived in (None, ""):
        return ("state", "archive")
    if archived == "false":
        return ("state",)
    if archived == "true":
        return ("archive",)
    raise HttpError(400, "invalid", f"must be true or false, not {archived!r}", "archived")


async def _optional_body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    return object_body(await read_json(request))


@requires("submit", audited=True)
async def cancel_job(request: web.Request) -> web.Response:
    job_id = path_int(request, "id")
    body = only(await _optional_body(request), {"request_id", "reason"})
    request_id = take_request_id(body, request)
    command = parse_or_400(
        lambda: CancelJob.from_wire({**body, "job_id": job_id, "request_id": request_id})
    )
    value = await commit(request, command)
    return json_response({"id": job_id, **value})


@requires("submit", audited=True)
async def retry_job(request: web.Request) -> web.Response:
    job_id = path_int(request, "id")
    request_id = take_request_id(only(await _optional_body(request), {"request_id"}), request)
    command = parse_or_400(lambda: RetryJob.from_wire({"job_id": job_id, "request_id": request_id}))
    result = await commit_result(request, command)
    if isinstance(result, Rejected) and result.code == "not_found":
        archive = services(request).node.archive
        if archive is not None and await archive.holds(job_id):
            raise HttpError(409, "conflict", f"job {job_id} is archived: it left the state and "
                            "cannot run again; submit a new job", "id")
    if isinstance(result, Rejected):
        raise rejected(result)
    assert isinstance(result, Ok)
    return json_response({"id": job_id, **result.value})


@requires("work")
async def heartbeat(request: web.Request) -> web.Response:
    job_id = path_int(request, "id")
    body = only(
        object_body(await read_json(request)), {"request_id", "token", "lease_ms", "progress"}
    )
    request_id = take_request_id(body, request)
    command = parse_or_400(
        lambda: Heartbeat.from_wire({**body, "job_id": job_id, "request_id": request_id})
    )
    value = await commit(request, command)
    return json_response({"id": job_id, **value})


@requires("work")
async def complete(request: web.Request) -> web.Response:
    job_id = path_int(request, "id")
    body = only(object_body(await read_json(request)), {"request_id", "token", "result"})
    request_id = take_request_id(body, request)
    command = parse_or_400(
        lambda: CompleteJob.from_wire({**body, "job_id": job_id, "request_id": request_id})
    )
    value = await _commit_ack(request, command, job_id, "succeeded")
    return json_response({"id": job_id, **value})


@requires("work")
async def fail(request: web.Request) -> web.Response:
    job_id = path_int(request, "id")
    body = only(
        object_body(await read_json(request)), {"request_id", "token", "error", "retryable"}
    )
    request_id = take_request_id(body, request)
    command = parse_or_400(
        lambda: FailJob.from_wire({**body, "job_id": job_id, "request_id": request_id})
    )
    value = await _commit_ack(request, command, job_id, "failed")
    return json_response({"id": job_id, **value})


async def _commit_ack(
    request: web.Request, command: CompleteJob | FailJob, job_id: int, outcome: str
) -> dict[str, Any]:
    """`commit`, within the job's trace as its `complete` span when it has one."""
    spans = traces.ack_spans(request, [(job_id, outcome)])
    try:
        value = await commit(request, command)
    except BaseException as error:
        traces.acked(spans, (), error)
        raise
    traces.acked(spans, [(job_id, "ok")])
    return value


def routes() -> list[web.RouteDef]:
    return [
        web.post("/v1/jobs", submit_job),
        web.post("/v1/jobs/batch", submit_batch),
        web.post("/v1/workflows", submit_workflow),
        web.get("/v1/jobs", get_jobs),
        web.get("/v1/jobs/{id}", get_job),
        web.post("/v1/jobs/{id}/cancel", cancel_job),
        web.post("/v1/jobs/{id}/retry", retry_job),
        web.post("/v1/jobs/{id}/heartbeat", heartbeat),
        web.post("/v1/jobs/{id}/complete", complete),
        web.post("/v1/jobs/{id}/fail", fail),
    ]
