"""Routes of jobs and workflows: submit, batch, workflows, read, list, cancel, retry, and the
worker's per-job calls (heartbeat, complete, fail)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from raftcron.cluster.archive.paging import merge_page
from raftcron.cluster.archive.query import indexed
from raftcron.cluster.http import bounds
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
    body = object_body(await read_json(request))
    request_id = take_request_id(body, request)
    spec = parse_or_400(lambda: JobSpec.parse(body))
    try:
        value = await commit(request, SubmitJobs(request_id, (spec,)))
    except HttpError as error:
        raise _as_single_job(error) from None
    [view] = render_jobs(request, value["jobs"], value)
    return json_response(view, status=201 if view["created"] else 200)


@requires("submit")
async def submit_batch(request: web.Request) -> web.Response:
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
    value = await commit(request, SubmitJobs(request_id, command.jobs))
    jobs = render_jobs(request, value["jobs"], value)
    created = any(view["created"] for view in jobs)
    return json_response({"jobs": jobs}, status=201 if created else 200)


@requires("submit")
async def submit_workflow(request: web.Request) -> web.Response:
    body = object_body(await read_json(request))
    request_id = take_request_id(body, request)
    spec = parse_or_400(lambda: WorkflowSpec.parse(body))
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
    if query.payload and not query.has_time_range:
        attributes = node.machine.read(lambda state: state.settings.search_attributes.paths)
        check_indexed(query, attributes, None if archive is None else archive.writer.indexed)

    def live(state: SchedulerState) -> tuple[list[dict[str, Any]], int]:
        # The hand-over under the same lock as the state: a job is in one or the other.
        pending = () if archive is None else archive.writer.pending_jobs()
        return views.search_jobs(state, query, before_id=cursor, limit=limit, extra=pending,
                                 in_state="state" in sources)

    live_page, floor = node.machine.read(live)
    archived = [] if archive is None else await archive.search(
        query, before_id=cursor, limit=limit, min_id=floor)
    jobs, next_cursor = merge_page((live_page, archived), floor=floor, limit=limit)
    for view in jobs:
        view.pop("history", None)  # lists leave out the attempts, as they always did
    return json_response(
        {
            "jobs": jobs,
            "next_cursor": next_cursor,
            "node": node.config.node_id,
            "applied_index": node.applied_index,
        }
    )


def check_indexed(query: JobFilter, attributes: tuple[str, ...],
                  indexed_here: frozenset[str] | None) -> None:
    """A payload filter without a time range is answered only by a search attribute's index
    (DESIGN.md §9.2): 400 naming created_from_ms for one that is not; 503 while this node's
    archive (`indexed_here`, None: not searched) is still building it."""
    for wanted in query.payload:
        if not indexed(wanted, attributes):
            why = ("a filter on null is not indexed" if wanted.value is None and
                   ".".join(wanted.path) in attributes else
                   "not a search attribute: PUT /v1/settings/search_attributes")
            raise HttpError(400, "invalid", f"a filter on {wanted.name} ({why}) needs a "
                            "created or finished range: created_from_ms, created_to_ms, "
                            "finished_from_ms or finished_to_ms", "created_from_ms")
    for wanted in query.payload:
        if indexed_here is not None and ".".join(wanted.path) not in indexed_here:
            raise HttpError(503, "unavailable", f"{wanted.name} is a search attribute this "
                            "node's archive is still indexing: retry, ask another member, or "
                            "give a created or finished range", "created_from_ms",
                            headers={"Retry-After": "5"})


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
    body = only(object_body(await read_json(request)), {"request_id", "token", "lease_ms"})
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
    value = await commit(request, command)
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
    value = await commit(request, command)
    return json_response({"id": job_id, **value})


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
