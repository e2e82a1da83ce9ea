"""`GET /openapi.json` is kept true by these tests.

The document lists exactly the routes the app registers, with the grants they need; every
request example in it matches its schema and is accepted by the server's own parser (and a
table of bodies is judged the same way by both); and a live node's answers on the main routes,
errors included, match the documented status codes, media types, headers and schemas.
"""

from __future__ import annotations

import ast
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from raftcron.cluster import config
from raftcron.cluster.http import app as http_app
from raftcron.cluster.http import bounds
from raftcron.cluster.http.bounds import BODY_BYTES_MAX
from raftcron.cluster.http.common import RETRY_AFTER_S, ROLE_GRANTS, Services
from raftcron.cluster.membership.book import Member
from raftcron.scheduler import limits, parse
from raftcron.scheduler.commands import (
    BackfillSchedule,
    CancelJob,
    ClaimJobs,
    CompleteJob,
    FailJob,
    Heartbeat,
    PauseSchedule,
    ResumeSchedule,
    RetryJob,
    SubmitJobs,
    TriggerSchedule,
)
from raftcron.scheduler.errors import STATUS_BY_CODE, Invalid
from raftcron.scheduler.flowcommands import BulkJobs, PauseQueue, ResumeQueue
from raftcron.scheduler.flowspecs import QueueSpec
from raftcron.scheduler.gate import RELEASE_LEVEL
from raftcron.scheduler.notifications import NotificationSpec
from raftcron.scheduler.schedulespec import ScheduleSpec
from raftcron.scheduler.search import JobFilter
from raftcron.scheduler.settings import (
    BUDGET_BYTES_DEFAULT,
    BUDGET_BYTES_MIN,
    ArchiveRetention,
    Budget,
    Retention,
    SearchAttributes,
)
from raftcron.scheduler.specs import JobSpec, WorkflowSpec

from . import apidoc
from .apidoc import assert_documented, assert_error, schema_errors
from .livenode import REPO, LiveNode, Reply, start_leaderless_node

# -- the document and the app's routes ------------------------------------------------------


def registered_routes() -> dict[tuple[str, str], str]:
    """(METHOD, path) -> grant, for every route of the app (HEAD is implied by GET)."""
    app = http_app.build_app(cast(Services, None))
    return {
        (route.method, route.resource.canonical): getattr(route.handler, "grant", "read")
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }


def test_the_document_is_valid_openapi_3_0() -> None:
    validator = pytest.importorskip("openapi_spec_validator", reason="pip install raftcron[test]")
    validator.validate(apidoc.document())
    assert apidoc.document()["openapi"].startswith("3.0.")


def test_the_document_lists_exactly_the_routes_the_app_serves() -> None:
    documented = {(method, path) for method, path, _ in apidoc.operations()}
    assert documented == set(registered_routes())


def test_only_the_open_paths_are_documented_without_a_token() -> None:
    open_operations = {path for _, path, op in apidoc.operations() if op.get("security") == []}
    served = {path for _, path in registered_routes()}
    open_paths = set(http_app.OPEN_PATHS) | {path for path in served if path.startswith("/ui/")}
    assert open_operations == open_paths & served
    assert apidoc.document()["security"] == [{"bearer": []}]


@pytest.mark.parametrize(("method", "path"), sorted(registered_routes()))
def test_a_route_documents_403_exactly_when_it_needs_more_than_read(method: str, path: str) -> None:
    grant = registered_routes()[(method, path)]
    responses = apidoc.operation(method, path)["responses"]
    # "status" (the cluster view) is a grant every user role has, as "read" is.
    needs_more = any(grant not in ROLE_GRANTS[role] for role in config.API_ROLES)
    assert ("403" in responses) == needs_more
    if needs_more:
        assert f"the {grant} grant" in apidoc.operation(method, path)["description"]


def test_every_operation_has_a_unique_id_and_an_error_shape_for_each_error_status() -> None:
    ids = [op["operationId"] for _, _, op in apidoc.operations()]
    assert len(ids) == len(set(ids))
    for method, path, op in apidoc.operations():
        for status, response in op["responses"].items():
            if status.startswith(("4", "5")) and path != "/readyz":
                name = OWN_ERROR_NAMES.get((method, path, status), ERROR_NAMES[status])
                assert response == {"$ref": f"#/components/responses/{name}"}, (
                    method,
                    path,
                    status,
                )


ERROR_NAMES = {
    "400": "Invalid",
    "401": "Unauthorized",
    "403": "Forbidden",
    "404": "NotFound",
    "409": "Conflict",
    "408": "Timeout",
    "413": "TooLarge",
    "421": "NotLeader",
    "503": "Unavailable",
    "507": "StateFull",
}
# A status that means something else on one route: an archive backup's 507 is this node's
# disk, not the cluster's state.
OWN_ERROR_NAMES = {("GET", "/v1/cluster/backup/archive", "507"): "NoSpace"}


def test_an_operation_documents_408_and_413_exactly_when_it_reads_a_body() -> None:
    """Every body is read through read_json, which answers 413 over 8 MiB and 408 when the
    body has not arrived within BODY_READ_S."""
    for method, path, op in apidoc.operations():
        has_body = "requestBody" in op
        assert ("408" in op["responses"]) == has_body, (method, path)
        assert ("413" in op["responses"]) == has_body, (method, path)


# What creates jobs (DESIGN.md §9.1), so may be refused 507 state_full. Never refused for
# space: claims, heartbeats, acks, cancels, deletes, settings; a bulk retry leaves a job the
# budget has no room for as it is (matched, not changed, counted in `state_full`) rather than
# failing the request.
CREATING_JOBS = {
    ("POST", "/v1/jobs"),
    ("POST", "/v1/jobs/batch"),
    ("POST", "/v1/workflows"),
    ("POST", "/v1/jobs/{id}/retry"),
    ("POST", "/v1/schedules/{name}/trigger"),
    ("POST", "/v1/schedules/{name}/backfill"),
}


def test_exactly_the_routes_that_create_jobs_document_507_state_full() -> None:
    documented = {(method, path) for method, path, op in apidoc.operations()
                  if "507" in op["responses"] and (method, path, "507") not in OWN_ERROR_NAMES}
    assert documented == CREATING_JOBS


# -- error codes: every code the product answers with is one the document lists --------------


def codes_written_in(directory: Path) -> set[str]:
    """The error codes written in place under `directory`: `HttpError(status, "code", ...)`,
    `Rejected("code", ...)` and `code="..."` (an Invalid's)."""
    codes: set[str] = set()
    for path in directory.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.id if isinstance(node.func, ast.Name) else None
            if isinstance(node.func, ast.Attribute):
                called = node.func.attr
            position = {"HttpError": 1, "Rejected": 0}.get(called or "")
            given = [node.args[position]] if position is not None and len(node.args) > position \
                else []
            given += [keyword.value for keyword in node.keywords if keyword.arg == "code"]
            codes.update(value.value for value in given
                         if isinstance(value, ast.Constant) and isinstance(value.value, str))
    return codes


def error_codes_listed() -> set[str]:
    error = apidoc.document()["components"]["schemas"]["Error"]["properties"]["error"]
    return set(error["properties"]["code"]["enum"])


def test_the_error_schema_lists_every_code_the_product_answers_with() -> None:
    written = codes_written_in(REPO / "cluster") | codes_written_in(REPO / "scheduler")
    assert {"state_full", "members_not_ready", "timeout"} <= written  # the scan sees them
    # internal: the 500 of an unexpected exception, a bug; the document promises no 500.
    assert (written | set(STATUS_BY_CODE)) - {"internal"} <= error_codes_listed()


@pytest.mark.parametrize(("code", "status"), sorted(STATUS_BY_CODE.items()))
def test_a_core_code_is_named_where_the_document_describes_its_status(
    code: str, status: int
) -> None:
    response = apidoc.document()["components"]["responses"][ERROR_NAMES[str(status)]]
    assert re.search(rf"\b{code}\b", response["description"]), response["description"]

# -- request bodies: the document and the server's parsers agree ----------------------------


def _without_request_id(body: dict[str, Any]) -> dict[str, Any]:
    """What a handler does first: take request_id out (1-200 characters when given)."""
    body = dict(body)
    request_id = body.pop("request_id", None)
    if request_id is not None:
        parse.text(request_id, "request_id", chars_max=bounds.REQUEST_ID_CHARS_MAX)
    return body


def _batch(body: dict[str, Any]) -> Any:
    body = _without_request_id(body)
    parse.reject_unknown(body, frozenset({"jobs"}))
    return SubmitJobs.from_wire(body)


def _claim(body: dict[str, Any]) -> Any:
    body = _without_request_id(body)
    parse.integer(body.pop("wait_ms", 0), "wait_ms", low=0, high=bounds.CLAIM_WAIT_MS_MAX)
    return ClaimJobs.from_wire({**body, "node": "n1"})


def _cancel(body: dict[str, Any]) -> Any:
    return CancelJob.from_wire({**_without_request_id(body), "job_id": 1})


def _heartbeat(body: dict[str, Any]) -> Any:
    return Heartbeat.from_wire({**_without_request_id(body), "job_id": 1})


def _with_job_id(command: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda body: command.from_wire({**_without_request_id(body), "job_id": 1})


def _with_name(command: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda body: command.from_wire({**_without_request_id(body), "name": "s"})


def _settings_section(body: dict[str, Any]) -> Any:
    """cluster/http/settings.py's put: request_id out, then the section's own parser. The
    document cannot tie a body to the path's section, so it takes what any section takes."""
    body = _without_request_id(body)
    for section in (Retention, Budget, ArchiveRetention):
        try:
            return section.parse(body)
        except Invalid:
            pass
    return SearchAttributes.parse(body)


def _finalize(body: dict[str, Any]) -> Any:
    """cluster/http/settings.py's finalize reads request_id and nothing else."""
    return _without_request_id(body)


def _bulk(body: dict[str, Any]) -> Any:
    """cluster/http/flow.py's bulk: known fields only, dry_run a boolean, the rest the core's."""
    body = _without_request_id(body)
    parse.reject_unknown(body, frozenset({"action", "filter", "max", "cursor", "dry_run"}))
    parse.boolean(body.pop("dry_run", False), "dry_run")
    if body.get("action") == "purge":  # a search's filter, not empty
        query = JobFilter.from_object(body.get("filter", {}))
        if query == JobFilter():
            raise Invalid("filter", "a purge names what to purge")
        parse.integer(body.get("max", 1_000), "max", low=1, high=1_000)
        return parse.integer(body.get("cursor", 0), "cursor", low=0)
    return BulkJobs.from_wire(body)


# operationId -> how its handler parses the body (raises Invalid when it rejects it).
PARSERS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "submitJob": lambda body: JobSpec.parse(_without_request_id(body)),
    "submitJobs": _batch,
    "submitWorkflow": lambda body: WorkflowSpec.parse(_without_request_id(body)),
    "putSchedule": lambda body: ScheduleSpec.parse(_without_request_id(body)),
    "previewScheduleSpec": lambda body: ScheduleSpec.parse(
        {k: v for k, v in body.items() if k != "request_id"}
    ),
    "claimJobs": _claim,
    "heartbeat": _heartbeat,
    "completeJob": _with_job_id(CompleteJob),
    "failJob": _with_job_id(FailJob),
    "cancelJob": _cancel,
    "retryJob": _with_job_id(RetryJob),
    "pauseSchedule": _with_name(PauseSchedule),
    "resumeSchedule": _with_name(ResumeSchedule),
    "triggerSchedule": _with_name(TriggerSchedule),
    "backfillSchedule": _with_name(BackfillSchedule),
    "putNotification": lambda body: NotificationSpec.parse(_without_request_id(body)),
    "addMember": lambda body: Member.from_wire(body, "body"),
    "putQueue": lambda body: QueueSpec.parse(_without_request_id(body)),
    "pauseQueue": _with_name(PauseQueue),
    "resumeQueue": _with_name(ResumeQueue),
    "bulkJobs": _bulk,
    "putSettings": _settings_section,
    "finalizeCluster": _finalize,
}


def server_accepts(operation_id: str, body: Any) -> bool:
    try:
        PARSERS[operation_id](parse.as_mapping(body, "body"))  # type: ignore[arg-type]
    except Invalid:
        return False
    return True


def test_every_operation_with_a_body_has_a_parser_and_examples_here() -> None:
    with_body = {op["operationId"] for _, _, op in apidoc.operations() if "requestBody" in op}
    assert with_body == set(PARSERS)
    assert all(apidoc.request_examples(operation_id) for operation_id in with_body)


def all_examples() -> Iterator[Any]:
    for operation_id in sorted(PARSERS):
        for name, body in apidoc.request_examples(operation_id).items():
            yield pytest.param(operation_id, body, id=f"{operation_id}-{name}")


@pytest.mark.parametrize(("operation_id", "body"), list(all_examples()))
def test_a_documented_example_matches_its_schema_and_the_server_accepts_it(
    operation_id: str, body: Any
) -> None:
    assert schema_errors(apidoc.request_schema(operation_id), body) == []
    assert server_accepts(operation_id, body)


JOB = {"task": "t"}
EVERY = {"every": "5m", "job": JOB}
HOOK = {"url": "https://hooks.example.com/x", "events": ["misfire"], "secret": "s" * 16}
# (operationId, body, whether the document and the server both accept it)
AGREEMENT = [
    ("submitJob", {"task": "t", "key": None, "backoff": None, "run_at_ms": None}, True),
    ("submitJob", {"task": "t", "payload": None, "request_id": None}, True),
    ("submitJob", {"task": "a.b:c-d_e", "priority": -1_000_000, "max_attempts": 100}, True),
    ("submitJob", {"task": "t", "backoff": {"factor": 1, "jitter": 1, "max_ms": 86_400_000}}, True),
    ("submitJob", {"task": "t", "colour": "red"}, False),
    ("submitJob", {"task": ""}, False),
    ("submitJob", {"task": "has space"}, False),
    ("submitJob", {"task": "-leading-dash"}, False),
    ("submitJob", {"task": "t" * 129}, False),
    ("submitJob", {"payload": {}}, False),
    ("submitJob", {"task": "t", "priority": 1_000_001}, False),
    ("submitJob", {"task": "t", "priority": True}, False),
    ("submitJob", {"task": "t", "max_attempts": 0}, False),
    ("submitJob", {"task": "t", "queue": None}, False),
    ("submitJob", {"task": "t", "key": ""}, False),
    ("submitJob", {"task": "t", "key": "k" * 513}, False),
    ("submitJob", {"task": "t", "delay_ms": -1}, False),
    ("submitJob", {"task": "t", "timeout_ms": 0}, False),
    ("submitJob", {"task": "t", "backoff": {"factor": 0.5}}, False),
    ("submitJob", {"task": "t", "backoff": {"base": 1}}, False),
    ("submitJob", {"task": "t", "depends_on": [1, 1]}, False),
    ("submitJob", {"task": "t", "depends_on": [0]}, False),
    ("submitJob", {"task": "t", "depends_on": None}, False),
    ("submitJob", {"task": "t", "request_id": ""}, False),
    ("submitJob", {"task": "t", "request_id": "r" * 201}, False),
    ("submitJobs", {"jobs": []}, False),
    ("submitJobs", {"jobs": [JOB], "extra": 1}, False),
    ("submitJobs", {"jobs": [{**JOB, "request_id": "x"}]}, False),
    ("submitWorkflow", {"jobs": [{"name": "a", "task": "t", "key": "k"}]}, False),
    ("submitWorkflow", {"jobs": [{"name": "a", "task": "t", "depends_on": [1]}]}, False),
    ("submitWorkflow", {"jobs": [{"name": "a", "task": "t", "after": ["b", "b"]}]}, False),
    ("submitWorkflow", {"jobs": [{"task": "t"}]}, False),
    ("submitWorkflow", {"jobs": [{"name": "a", "task": "t", "delay_ms": 5}], "key": None}, True),
    ("putSchedule", {"cron": None, "every": "1h 30m", "job": JOB, "workflow": None}, True),
    ("putSchedule", {"at": 0, "job": JOB, "start_at": None, "end_at": None}, True),
    ("putSchedule", {"every": 315_360_000_000, "job": JOB, "description": None}, True),
    ("putSchedule", {"cron": "* * * * *", "every": "5m", "job": JOB}, False),
    ("putSchedule", {"cron": None, "job": JOB}, False),
    ("putSchedule", {"every": "5m"}, False),
    (
        "putSchedule",
        {"every": "5m", "job": JOB, "workflow": {"jobs": [{"name": "a", **JOB}]}},
        False,
    ),
    ("putSchedule", {**EVERY, "job": {**JOB, "key": "k"}}, False),
    ("putSchedule", {**EVERY, "job": {**JOB, "delay_ms": 5}}, False),
    ("putSchedule", {**EVERY, "workflow": {"jobs": [{"name": "a", **JOB}], "key": "k"}}, False),
    ("putSchedule", {**EVERY, "misfire": "sometimes"}, False),
    ("putSchedule", {**EVERY, "overlap": "never"}, False),
    ("putSchedule", {**EVERY, "misfire_grace_ms": 999}, False),
    ("putSchedule", {**EVERY, "max_catchup": 1_001}, False),
    ("putSchedule", {**EVERY, "retain": 0}, False),
    ("putSchedule", {**EVERY, "jitter_ms": 86_400_001}, False),
    ("putSchedule", {**EVERY, "paused": None}, False),
    ("putSchedule", {**EVERY, "tz": None}, False),
    ("putSchedule", {**EVERY, "every": 0}, False),
    ("putSchedule", {**EVERY, "every": 999}, False),
    ("putSchedule", {**EVERY, "every": "1s"}, True),
    ("putSchedule", {**EVERY, "every": 315_360_000_001}, False),
    ("putSchedule", {**EVERY, "every": True}, False),
    ("putSchedule", {**EVERY, "every": "5 minutes"}, False),
    ("putSchedule", {**EVERY, "at": -1, "every": None}, False),
    ("putSchedule", {**EVERY, "schedule": "x"}, False),
    ("claimJobs", {"worker": "w", "queues": ["a", "b"], "max": 0, "acks": []}, True),
    ("claimJobs", {"worker": "w", "lease_ms": 100, "wait_ms": 30_000, "max": 1_000}, True),
    ("claimJobs", {"worker": "w", "acks": [{"id": 1, "token": 2, "outcome": "failed"}]}, True),
    ("claimJobs", {"worker": "w", "acks": [{"id": 1, "token": 2, "outcome": "done"}]}, False),
    ("claimJobs", {"worker": "w", "acks": [{"id": 1, "token": 2}]}, False),
    (
        "claimJobs",
        {"worker": "w", "acks": [{"id": 1, "token": 2, "outcome": "failed", "x": 1}]},
        False,
    ),
    ("claimJobs", {"queues": ["default"]}, False),
    ("claimJobs", {"worker": "w", "queues": []}, False),
    ("claimJobs", {"worker": "w", "queues": ["a", "a"]}, False),
    ("claimJobs", {"worker": "w", "queues": [f"q{n}" for n in range(65)]}, False),
    ("claimJobs", {"worker": "w", "max": 1_001}, False),
    ("claimJobs", {"worker": "w", "lease_ms": 99}, False),
    ("claimJobs", {"worker": "w", "wait_ms": 30_001}, False),
    ("heartbeat", {"token": 1, "lease_ms": None}, True),
    ("heartbeat", {"token": 1, "lease_ms": limits.LEASE_MS_MAX + 1}, False),
    ("heartbeat", {"token": 0}, False),
    ("heartbeat", {"lease_ms": 1_000}, False),
    ("heartbeat", {"token": 1, "progress": {"value": 0}}, True),
    ("heartbeat", {"token": 1, "progress": {"value": {"done": 0, "total": 1}, "data": None}}, True),
    ("heartbeat", {"token": 1, "progress": None}, True),
    ("heartbeat", {"token": 1, "progress": {"value": 1.01}}, False),
    ("heartbeat", {"token": 1, "progress": {"value": {"done": 1}}}, False),
    ("heartbeat", {"token": 1, "progress": {"value": 0.5, "message": "m" * 201}}, False),
    ("heartbeat", {"token": 1, "progress": {"value": 0.5, "colour": "red"}}, False),
    ("heartbeat", {"token": 1, "progress": {"message": "no value"}}, False),
    ("completeJob", {"token": 3, "result": [1, {"a": None}]}, True),
    ("completeJob", {"token": "3"}, False),
    ("failJob", {"token": 3, "error": None, "retryable": False}, True),
    ("failJob", {"token": 3, "error": "x" * 10_000}, True),
    ("failJob", {"token": 3, "retryable": "no"}, False),
    ("cancelJob", {"reason": None}, True),
    ("cancelJob", {"reason": ""}, False),
    ("cancelJob", {"reason": "r" * limits.ERROR_CHARS_MAX}, True),
    ("cancelJob", {"reason": "r" * (limits.ERROR_CHARS_MAX + 1)}, False),
    ("triggerSchedule", {"force": None}, False),
    ("backfillSchedule", {"from_ms": 0, "to_ms": 1}, True),
    ("backfillSchedule", {"from_ms": -1, "to_ms": 1}, False),
    ("backfillSchedule", {"from_ms": 0}, False),
    ("putNotification", {**HOOK, "events": ["misfire", "misfire"]}, True),
    ("putNotification", {**HOOK, "url": "http://[::1]:9000/x?y=#"}, False),
    ("putNotification", {**HOOK, "url": "https://u:p@h.example.com/"}, False),
    ("putNotification", {**HOOK, "url": "https://h.example.com"}, True),
    ("putNotification", {**HOOK, "url": "https://h.example.com/ a"}, False),
    ("putNotification", {**HOOK, "events": []}, False),
    ("putNotification", {**HOOK, "events": ["fired"]}, False),
    ("putNotification", {**HOOK, "secret": "s" * 15}, False),
    ("putNotification", {**HOOK, "secret": "s" * 257}, False),
    ("putNotification", {**HOOK, "headers": {}}, False),
    ("putNotification", {"url": HOOK["url"], "events": ["misfire"]}, False),
    ("submitJob", {"task": "t", "concurrency": {"key": "acct-42"}}, True),
    ("submitJob", {"task": "t", "concurrency": {"key": "a", "max": 100_000}, "unique": None}, True),
    ("submitJob", {"task": "t", "concurrency": {"key": "", "max": 1}}, False),
    ("submitJob", {"task": "t", "concurrency": {"key": "a", "max": 0}}, False),
    ("submitJob", {"task": "t", "concurrency": {"max": 2}}, False),
    ("submitJob", {"task": "t", "concurrency": {"key": "a", "lanes": 2}}, False),
    ("submitJob", {"task": "t", "key": "k", "unique": {}}, True),
    ("submitJob", {"task": "t", "key": "k", "unique": {"states": ["queued", "running"],
                                                      "period_ms": 3_600_000,
                                                      "on_conflict": "replace"}}, True),
    ("submitJob", {"task": "t", "key": "k", "unique": {"states": []}}, False),
    ("submitJob", {"task": "t", "key": "k", "unique": {"states": ["queued", "queued"]}}, False),
    ("submitJob", {"task": "t", "key": "k", "unique": {"states": ["done"]}}, False),
    ("submitJob", {"task": "t", "key": "k", "unique": {"period_ms": 0}}, False),
    ("submitJob", {"task": "t", "key": "k", "unique": {"period_ms": 2_592_000_000}}, True),
    ("submitJob", {"task": "t", "key": "k", "unique": {"period_ms": 2_592_000_001}}, False),
    ("submitJob", {"task": "t", "key": "k", "unique": {"on_conflict": "keep"}}, False),
    ("submitJob", {"task": "t", "key": "k", "debounce_ms": 1, "debounce_max_ms": None}, True),
    ("submitJob", {"task": "t", "key": "k", "debounce_ms": 0}, False),
    ("submitJob", {"task": "t", "key": "k", "debounce_ms": 31_622_400_001}, False),
    ("putSchedule", {**EVERY, "job": {**JOB, "concurrency": {"key": "s"}}}, True),
    ("putSchedule", {**EVERY, "job": {**JOB, "unique": {}}}, False),
    ("putSchedule", {**EVERY, "job": {**JOB, "debounce_ms": 5}}, False),
    ("submitWorkflow", {"jobs": [{"name": "a", "task": "t", "concurrency": {"key": "w"}}]}, True),
    ("submitWorkflow", {"jobs": [{"name": "a", "task": "t", "debounce_ms": 5}]}, False),
    ("putQueue", {"paused": True, "concurrency_max": None, "rate_limit": None}, True),
    ("putQueue", {"concurrency_max": 100_000, "rate_limit": {"max": 1, "per_ms": 86_400_000}},
     True),
    ("putQueue", {"concurrency_max": 0}, False),
    ("putQueue", {"concurrency_max": 100_001}, False),
    ("putQueue", {"paused": None}, False),
    ("putQueue", {"rate_limit": {"max": 5}}, False),
    ("putQueue", {"rate_limit": {"max": 0, "per_ms": 1}}, False),
    ("putQueue", {"rate_limit": {"max": 1_000_001, "per_ms": 1}}, False),
    ("putQueue", {"rate_limit": {"max": 1, "per_ms": 86_400_001}}, False),
    ("putQueue", {"rate_limit": {"max": 1, "per_ms": 1, "burst": 2}}, True),
    ("putQueue", {"rate_limit": {"max": 1, "per_ms": 1, "burst": 0}}, False),
    ("putQueue", {"rate_limit": {"max": 1, "per_ms": 1, "tokens": 2}}, False),
    ("putQueue", {"limit": 3}, False),
    ("bulkJobs", {"action": "cancel"}, True),
    ("bulkJobs", {"action": "retry", "filter": {"status": None, "queue": None, "task": "t"},
                  "max": 1_000, "cursor": 0, "dry_run": True}, True),
    ("bulkJobs", {"action": "delete", "filter": {"created_from_ms": 0, "created_to_ms": 1}}, True),
    ("bulkJobs", {"filter": {}}, False),
    ("bulkJobs", {"action": "purge"}, False),
    ("bulkJobs", {"action": "purge", "filter": {"payload": {"customer.id": 42},
                                                "created_from_ms": 0, "task": "t"},
                  "max": 10, "cursor": 7}, True),
    ("bulkJobs", {"action": "purge", "filter": {"owner": "me"}}, False),
    ("bulkJobs", {"action": "purge", "filter": {"task": 5}}, False),
    ("bulkJobs", {"action": "purge", "filter": {"key": "k"}, "max": 1_001}, False),
    ("bulkJobs", {"action": "purge", "filter": {"payload.customer.id": 1}}, False),
    ("bulkJobs", {"action": "purge", "filter": {"payload": [1]}}, False),
    ("bulkJobs", {"action": "cancel", "max": 0}, False),
    ("bulkJobs", {"action": "cancel", "max": 1_001}, False),
    ("bulkJobs", {"action": "cancel", "cursor": -1}, False),
    ("bulkJobs", {"action": "cancel", "dry_run": "yes"}, False),
    ("bulkJobs", {"action": "cancel", "filter": {"status": "done"}}, False),
    ("bulkJobs", {"action": "cancel", "filter": {"queue": "has space"}}, False),
    ("bulkJobs", {"action": "cancel", "filter": {"owner": "me"}}, False),
    ("bulkJobs", {"action": "cancel", "everything": True}, False),
    ("putSettings", {}, True),
    ("putSettings", {"succeeded": {"max_age_ms": 0, "max_count": 0}, "request_id": None}, True),
    ("putSettings", {"failed": {"max_age_ms": 2_592_000_000, "max_count": 100_000_000}}, True),
    ("putSettings", {"cancelled": {}, "queues": {"reports": {"cancelled": {}}}}, True),
    ("putSettings", {"queues": {f"q{n}": {"failed": {"max_count": n}} for n in range(1_000)}},
     True),
    ("putSettings", {"bytes": 1_048_576}, True),
    ("putSettings", {"bytes": 1_099_511_627_776, "request_id": "b-1"}, True),
    ("putSettings", {"succeeded": {"max_age_ms": -1}}, False),
    ("putSettings", {"succeeded": {"max_age_ms": 2_592_000_001}}, False),
    ("putSettings", {"failed": {"max_count": 100_000_001}}, False),
    ("putSettings", {"cancelled": {"max_count": 1.5}}, False),
    ("putSettings", {"succeeded": {"keep": 5}}, False),
    ("putSettings", {"succeeded": None}, False),
    ("putSettings", {"queues": {"reports": {}}}, False),
    ("putSettings", {"queues": {"reports": {"done": {}}}}, False),
    ("putSettings", {"queues": {f"q{n}": {"failed": {}} for n in range(1_001)}}, False),
    ("putSettings", {"bytes": 1_048_575}, False),
    ("putSettings", {"bytes": 1_099_511_627_777}, False),
    ("putSettings", {"max_age_ms": 3_600_000, "max_bytes": 1_048_576}, True),
    ("putSettings", {"max_bytes": 70_368_744_177_664, "request_id": "a-1"}, True),
    ("putSettings", {"max_age_ms": 3_599_999}, False),
    ("putSettings", {"max_bytes": 70_368_744_177_665}, False),
    ("putSettings", {"max_age_ms": 3_600_000, "max_rows": 5}, False),
    ("putSettings", {"bytes": True}, False),
    ("putSettings", {"bytes": None}, False),
    ("putSettings", {"bytes": 1_048_576, "succeeded": {}}, False),
    ("putSettings", {"retention": {}}, False),
    ("putSettings", {"bytes": 1_048_576, "request_id": ""}, False),
    ("putSettings", {"paths": ["customer.id", "a-b.c_D.9"], "request_id": "s-1"}, True),
    ("putSettings", {"paths": []}, True),
    ("putSettings", {"paths": ["customer id"]}, False),
    ("putSettings", {"paths": ["a..b"]}, False),
    ("putSettings", {"paths": ["a", "a"]}, False),
    ("putSettings", {"paths": [f"p{n}" for n in range(17)]}, False),
    ("putSettings", {"paths": ["x" * 65]}, False),
    ("putSettings", {"paths": "customer.id"}, False),
    ("finalizeCluster", {}, True),
    ("finalizeCluster", {"request_id": "f-1"}, True),
    ("finalizeCluster", {"request_id": "r" * 201}, False),
]


@pytest.mark.parametrize(("operation_id", "body", "accepted"), AGREEMENT)
def test_the_document_and_the_server_judge_a_body_alike(
    operation_id: str, body: Any, accepted: bool
) -> None:
    assert server_accepts(operation_id, body) is accepted
    problems = schema_errors(apidoc.request_schema(operation_id), body)
    assert (problems == []) is accepted, problems


# -- a live node's answers ------------------------------------------------------------------


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def call(node: LiveNode, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
    """A request whose answer must be a documented one; returns the decoded body."""
    reply = send(node, method, path, body, **kwargs)
    return reply.status, assert_documented(method, path, reply)


def send(node: LiveNode, method: str, path: str, body: Any = None, **kwargs: Any) -> Reply:
    """`body` None sends no body at all."""
    if body is None:
        return node.request(method, path, **kwargs)
    return node.request(method, path, body, **kwargs)


def claim_all(node: LiveNode, queue: str, count: int) -> list[dict[str, Any]]:
    status, body = call(
        node, "POST", "/v1/claims", {"worker": "w1", "queues": [queue], "max": count}
    )
    assert status == 200 and len(body["jobs"]) == count, body
    return list(body["jobs"])


def test_the_node_serves_this_very_document(node: LiveNode) -> None:
    reply = node.request("GET", "/openapi.json", role=None)
    assert reply.status == 200 and reply.media_type == "application/json"
    assert reply.json() == apidoc.document()


def test_a_submitted_job_and_its_duplicate_match_the_document(node: LiveNode) -> None:
    body = {"task": "shell", "payload": {"argv": ["true"]}, "key": unique("key")}
    status, created = call(node, "POST", "/v1/jobs", body)
    assert (status, created["created"], created["status"]) == (201, True, "queued")
    status, again = call(node, "POST", "/v1/jobs", body)
    assert (status, again["created"], again["id"]) == (200, False, created["id"])


def test_a_job_read_back_has_its_history_as_documented(node: LiveNode) -> None:
    queue = unique("q")
    _, job = call(node, "POST", "/v1/jobs", {"task": "t", "queue": queue, "timeout_ms": 5_000})
    [claimed] = claim_all(node, queue, 1)
    call(node, "POST", f"/v1/jobs/{job['id']}/complete", {"token": claimed["token"]})
    status, read = call(node, "GET", f"/v1/jobs/{job['id']}?consistent=1")
    assert (status, read["status"], len(read["history"])) == (200, "succeeded", 1)
    assert read["history"][0]["outcome"] == "succeeded"


def test_pages_of_jobs_match_the_document(node: LiveNode) -> None:
    queue = unique("q")
    jobs = [{"task": "t", "queue": queue} for _ in range(5)]
    status, batch = call(node, "POST", "/v1/jobs/batch", {"jobs": jobs})
    assert status == 201 and all(job["created"] for job in batch["jobs"])
    path = f"/v1/jobs?queue={queue}&status=queued&limit=2&consistent=1"
    seen: list[int] = []
    while True:
        _, page = call(node, "GET", path)
        seen += [job["id"] for job in page["jobs"]]
        if page["next_cursor"] is None:
            break
        path = f"/v1/jobs?queue={queue}&limit=2&cursor={page['next_cursor']}"
    assert seen == sorted((job["id"] for job in batch["jobs"]), reverse=True)


def test_a_workflow_answer_matches_the_document(node: LiveNode) -> None:
    body = apidoc.request_examples("submitWorkflow")["etl"] | {"key": unique("etl")}
    status, workflow = call(node, "POST", "/v1/workflows", body)
    assert status == 201 and [job["name"] for job in workflow["jobs"]] == [
        "extract",
        "transform",
        "load",
    ]
    status, again = call(node, "POST", "/v1/workflows", body)
    assert (status, again["workflow_id"]) == (200, workflow["workflow_id"])


def test_claims_acks_and_the_worker_calls_match_the_document(node: LiveNode) -> None:
    queue = unique("q")
    call(node, "POST", "/v1/jobs/batch", {"jobs": [{"task": "t", "queue": queue}] * 4})
    first, second, third, fourth = claim_all(node, queue, 4)
    _, beat = call(node, "POST", f"/v1/jobs/{first['id']}/heartbeat", {"token": first["token"]})
    assert beat["lease_until_ms"] >= first["lease_until_ms"]
    _, done = call(node, "POST", f"/v1/jobs/{first['id']}/complete", {"token": first["token"]})
    assert done["status"] == "succeeded"
    failed = {"token": second["token"], "error": "boom", "retryable": False}
    _, answer = call(node, "POST", f"/v1/jobs/{second['id']}/fail", failed)
    assert answer["status"] == "failed"
    status, stale = call(node, "POST", f"/v1/jobs/{first['id']}/complete", {"token": 10**12})
    assert (status, stale["error"]["code"]) == (409, "stale_token")
    acks = [
        {"id": third["id"], "token": third["token"], "outcome": "succeeded", "result": [1]},
        {"id": fourth["id"], "token": fourth["token"] + 10**9, "outcome": "failed"},
    ]
    _, claimed = call(node, "POST", "/v1/claims", {"worker": "w1", "queues": [queue], "acks": acks})
    assert claimed == {
        "jobs": [],
        "acks": [
            {"id": third["id"], "outcome": "ok"},
            {"id": fourth["id"], "outcome": "stale_token"},
        ],
    }


def test_a_progress_report_is_shown_on_the_job_as_documented(node: LiveNode) -> None:
    queue = unique("q")
    call(node, "POST", "/v1/jobs", {"task": "t", "queue": queue})
    [job] = claim_all(node, queue, 1)
    report = {"value": {"done": 4, "total": 10}, "message": "rows", "data": {"table": "t"}}
    status, beat = call(node, "POST", f"/v1/jobs/{job['id']}/heartbeat",
                        {"token": job["token"], "progress": report})
    assert status == 200 and beat["lease_until_ms"] >= job["lease_until_ms"]
    _, read = call(node, "GET", f"/v1/jobs/{job['id']}?consistent=1")
    assert {k: read["progress"][k] for k in report} == report
    assert read["progress"]["attempt"] == 1 and read["progress"]["at_ms"] > 0
    status, refused = call(node, "POST", f"/v1/jobs/{job['id']}/heartbeat",
                           {"token": job["token"], "progress": {"value": 2}})
    assert (status, refused["error"]["field"]) == (400, "progress.value")
    status, refused = call(node, "POST", f"/v1/jobs/{job['id']}/heartbeat",
                           {"token": job["token"], "progress": {"value": 1, "data": "d" * 2_000}})
    assert (status, refused["error"]["field"]) == (413, "progress.data")


def test_cancel_and_retry_answers_match_the_document(node: LiveNode) -> None:
    _, job = call(node, "POST", "/v1/jobs", {"task": "t", "delay_ms": 3_600_000})
    assert job["status"] == "scheduled"
    _, cancelled = call(node, "POST", f"/v1/jobs/{job['id']}/cancel", {"reason": "not today"})
    assert (cancelled["status"], cancelled["cancelled_descendants"]) == ("cancelled", 0)
    status, again = call(node, "POST", f"/v1/jobs/{job['id']}/cancel")
    assert (status, again["error"]["code"]) == (409, "conflict")
    _, retried = call(node, "POST", f"/v1/jobs/{job['id']}/retry")
    assert retried["status"] == "scheduled"
    # The route takes the reason as the core does (it once refused over 1,000 characters).
    _, other = call(node, "POST", "/v1/jobs", {"task": "t", "delay_ms": 3_600_000})
    long_reason = "r" * limits.ERROR_CHARS_MAX
    status, cut = call(node, "POST", f"/v1/jobs/{other['id']}/cancel", {"reason": long_reason})
    assert (status, cut["status"]) == (200, "cancelled"), cut
    status, refused = call(node, "POST", f"/v1/jobs/{job['id']}/retry", {})
    assert (status, refused["error"]["code"]) == (409, "not_retryable")


def test_schedule_answers_match_the_document(node: LiveNode) -> None:
    name = unique("nightly")
    body = {
        "cron": "30 2 * * *",
        "tz": "America/New_York",
        "job": {"task": "t"},
        "overlap": "forbid",
    }
    assert call(node, "PUT", f"/v1/schedules/{name}", body)[0] == 201
    status, replaced = call(node, "PUT", f"/v1/schedules/{name}", {**body, "retain": 5})
    assert (status, replaced["spec"]["retain"]) == (200, 5)
    assert call(node, "GET", f"/v1/schedules/{name}?consistent=true")[1]["name"] == name
    assert name in [s["name"] for s in call(node, "GET", "/v1/schedules")[1]["schedules"]]
    _, fires = call(node, "GET", f"/v1/schedules/{name}/preview?count=2&from_ms=1772900000000")
    assert fires["fires"][0] == {
        "fire_time_ms": 1772953200000,
        "local": "2026-03-08T03:00:00-04:00",
        "note": "moved to the end of the DST gap",
    }
    status, triggered = call(node, "POST", f"/v1/schedules/{name}/trigger")
    assert (status, triggered["job"]["schedule"]) == (201, name)
    status, refused = call(node, "POST", f"/v1/schedules/{name}/trigger", {})
    assert (status, refused["error"]["code"]) == (409, "overlap")
    assert call(node, "POST", f"/v1/schedules/{name}/pause")[1]["paused"] is True
    assert call(node, "POST", f"/v1/schedules/{name}/resume", {})[1]["paused"] is False
    # The last six whole UTC days: inside the 7 days a backfill may reach back.
    today_ms = int(time.time() // 86_400) * 86_400_000
    days = {"from_ms": today_ms - 6 * 86_400_000, "to_ms": today_ms}
    _, backfilled = call(node, "POST", f"/v1/schedules/{name}/backfill", days)
    assert len(backfilled["jobs"]) == 6 and all(job["created"] for job in backfilled["jobs"])
    assert call(node, "DELETE", f"/v1/schedules/{name}")[1] == {"name": name, "deleted": True}
    assert call(node, "GET", f"/v1/schedules/{name}")[0] == 404


def test_a_buffered_trigger_answer_matches_the_document(node: LiveNode) -> None:
    name = unique("buffered")
    body = {"every": "1d", "job": {"task": "t"}, "overlap": "buffer_one"}
    call(node, "PUT", f"/v1/schedules/{name}", body)
    assert call(node, "POST", f"/v1/schedules/{name}/trigger")[0] == 201
    status, buffered = call(node, "POST", f"/v1/schedules/{name}/trigger")
    assert (status, buffered["buffered"], buffered["job"]) == (202, True, None)
    assert call(node, "GET", f"/v1/schedules/{name}")[1]["buffered_fire_ms"] is not None


def test_a_spec_preview_answer_matches_the_document(node: LiveNode) -> None:
    for name, body in apidoc.request_examples("previewScheduleSpec").items():
        status, preview = call(node, "POST", "/v1/schedules/preview?count=3&from_ms=0", body)
        assert status == 200 and preview["fires"], name


def test_cluster_events_audits_and_health_answers_match_the_document(node: LiveNode) -> None:
    _, cluster = call(node, "GET", "/v1/cluster")
    assert (cluster["role"], cluster["leader"], cluster["ready"]) == ("leader", "n1", True)
    assert cluster["cluster_name"] == "raftcron"  # the default: its config names none
    assert call(node, "GET", "/v1/events?cursor=0&limit=5")[0] == 200
    status, audit = call(node, "POST", "/v1/cluster/audits")
    assert status == 201
    assert call(node, "GET", f"/v1/cluster/audits/{audit['id']}")[1] == audit
    assert call(node, "GET", "/v1/cluster/audits/nothing")[0] == 404
    assert call(node, "GET", "/healthz", role=None)[1]["ok"] is True
    assert call(node, "GET", "/readyz", role=None)[1]["ready"] is True
    assert "raftcron_raft_term" in call(node, "GET", "/metrics", role="read")[1]


def test_backup_answers_match_the_document(node: LiveNode) -> None:
    reply = send(node, "GET", "/v1/cluster/backup")
    assert reply.status == 200 and assert_documented("GET", "/v1/cluster/backup", reply)
    reply = send(node, "GET", "/v1/cluster/backup/archive?min_index=1")
    assert reply.status == 200 and assert_documented("GET", "/v1/cluster/backup/archive", reply)
    assert reply.headers["x-raftcron-archive-bytes"] == str(len(reply.body))
    assert int(reply.headers["x-raftcron-archive-index"]) >= 1
    assert reply.body.startswith(b"SQLite format 3\x00")
    assert call(node, "GET", "/v1/cluster/backup/archive?min_index=-1")[0] == 400


def test_settings_and_finalize_answers_match_the_document(node: LiveNode) -> None:
    status, settings = call(node, "GET", "/v1/settings?consistent=1")
    # A new cluster starts finalized, with the defaults (the node's config has no [settings]).
    assert (status, settings["finalized"], settings["level"]) == (200, True, RELEASE_LEVEL)
    assert settings["budget"] == {"bytes": BUDGET_BYTES_DEFAULT}
    assert settings["retention"] == Retention().to_wire()
    usage = settings["usage"]
    assert sum(usage["parts"].values()) == usage["state_bytes"] < usage["budget_bytes"]
    status, finalized = call(node, "POST", "/v1/cluster/finalize")
    assert (status, finalized["finalized_now"], finalized["level"]) == (200, False, RELEASE_LEVEL)
    assert finalized["members"] == []  # finalized already: no member is asked
    assert call(node, "POST", "/v1/cluster/finalize", {"request_id": unique("fin")})[0] == 200
    _, cluster = call(node, "GET", "/v1/cluster")
    assert (cluster["release_level"], cluster["state"]["finalized"]) == (RELEASE_LEVEL, True)
    assert cluster["state"]["budget_bytes"] == BUDGET_BYTES_DEFAULT
    assert call(node, "GET", "/healthz", role=None)[1]["release_level"] == RELEASE_LEVEL


def test_a_full_state_answers_507_as_documented(fresh_node: Callable[[], LiveNode]) -> None:
    """What creates jobs is refused 507 once nothing finished can be evicted to make room.

    The budget is set just above the state (never below it, or the failed job would be
    evicted for space), so its retry finds no room either."""
    node = fresh_node()
    status, refused = call(node, "PUT", "/v1/settings/retention", {"failed": {"max_age_ms": -1}})
    assert (status, refused["error"]["field"]) == (400, "retention.failed.max_age_ms")
    queue = unique("full")
    call(node, "POST", "/v1/jobs", {"task": "t", "queue": queue})
    [failing] = claim_all(node, queue, 1)
    call(node, "POST", f"/v1/jobs/{failing['id']}/fail",
         {"token": failing["token"], "retryable": False})
    big = {"task": "t", "queue": queue, "payload": "x" * 60_000}
    filled: list[dict[str, Any]] = []  # past the least budget, in batches an entry can carry
    while len(filled) * 60_000 <= BUDGET_BYTES_MIN:
        status, batch = call(node, "POST", "/v1/jobs/batch", {"jobs": [big] * 6})
        assert status == 201, batch
        filled += batch["jobs"]
    name = unique("daily")
    call(node, "PUT", f"/v1/schedules/{name}", {"cron": "0 0 * * *", "job": big})

    def state_bytes() -> int:
        return int(call(node, "GET", "/v1/settings?consistent=1")[1]["usage"]["state_bytes"])

    # What a PUT of the budget adds (its answer remembered for its request_id), measured.
    before = state_bytes()
    call(node, "PUT", "/v1/settings/budget", {"bytes": BUDGET_BYTES_DEFAULT})
    added = state_bytes() - before
    budget = state_bytes() + added + 300  # room left: 300 bytes, less than any job takes
    status, settings = call(node, "PUT", "/v1/settings/budget", {"bytes": budget})
    assert (status, settings["budget"], settings["usage"]["budget_bytes"]) == (
        200, {"bytes": budget}, budget)
    assert settings["usage"]["kept"]["failed"] == 1  # nothing was evicted
    today_ms = int(time.time() // 86_400) * 86_400_000
    for method, path, body in [
        ("POST", "/v1/jobs", big),
        ("POST", "/v1/jobs/batch", {"jobs": [{"task": "t"}, big]}),
        ("POST", "/v1/workflows", {"jobs": [{"name": "a", **big}]}),
        ("POST", f"/v1/jobs/{failing['id']}/retry", None),
        ("POST", f"/v1/schedules/{name}/trigger", None),
        ("POST", f"/v1/schedules/{name}/backfill",
         {"from_ms": today_ms - 2 * 86_400_000, "to_ms": today_ms}),
    ]:
        reply = send(node, method, path, body)
        error = assert_documented(method, path, reply)["error"]
        assert (reply.status, error["code"]) == (507, "state_full"), (path, reply)
        assert reply.headers["retry-after"] == RETRY_AFTER_S[507]
        assert error["budget_bytes"] == budget
        assert error["state_bytes"] + error["needed_bytes"] > budget >= error["state_bytes"]
        assert sum(error["parts"].values()) == error["state_bytes"]
        assert error["queues"][0]["queue"] == queue
    # A bulk retry is not refused whole: the job it has no room for matches, stays failed,
    # and is counted as refused for space.
    _, bulk = call(node, "POST", "/v1/jobs/bulk", {"action": "retry", "filter": {"queue": queue}})
    assert (bulk["matched"], bulk["changed"], bulk["state_full"]) == (1, 0, 1)
    assert call(node, "GET", f"/v1/jobs/{failing['id']}")[1]["status"] == "failed"
    # Claims and cancels are never refused for space.
    assert len(claim_all(node, queue, 1)) == 1
    assert call(node, "POST", f"/v1/jobs/{filled[-1]['id']}/cancel")[0] == 200


def test_notification_answers_match_the_document_and_never_show_the_secret(
    node: LiveNode,
) -> None:
    name = unique("hook")
    body = apidoc.request_examples("putNotification")["alerts"]
    status, created = call(node, "PUT", f"/v1/notifications/{name}", body)
    assert (status, created["name"], created["pending"]) == (201, name, 0)
    status, replaced = call(node, "PUT", f"/v1/notifications/{name}", {**body, "url": HOOK["url"]})
    assert (status, replaced["url"]) == (200, HOOK["url"])
    assert call(node, "GET", f"/v1/notifications/{name}")[1] == replaced
    status, listed = call(node, "GET", "/v1/notifications?consistent=1")
    assert status == 200 and name in [n["name"] for n in listed["notifications"]]
    assert body["secret"] not in json.dumps(listed) + json.dumps(replaced)
    assert call(node, "PUT", f"/v1/notifications/{name}", {**body, "secret": "short"})[0] == 400
    assert call(node, "GET", f"/v1/notifications/{name}", role="read")[0] == 403
    assert call(node, "DELETE", f"/v1/notifications/{name}")[1] == {"name": name, "deleted": True}
    assert call(node, "GET", f"/v1/notifications/{name}")[0] == 404
    assert call(node, "DELETE", f"/v1/notifications/{name}")[0] == 404


def test_the_dashboard_answers_match_the_document(node: LiveNode) -> None:
    status, page = call(node, "GET", "/", role=None)
    assert status == 200 and "<html" in page.lower()
    [asset] = re.findall(r"/ui/([\w.-]+)\?v=(\w+)", page)[:1]
    reply = node.request("GET", f"/ui/{asset[0]}?v={asset[1]}", role=None)
    assert_documented("GET", f"/ui/{asset[0]}", reply)
    assert "immutable" in reply.headers["cache-control"]
    etag = {"If-None-Match": reply.headers["etag"]}
    assert call(node, "GET", f"/ui/{asset[0]}", role=None, headers=etag)[0] == 304
    assert call(node, "GET", "/ui/nothing.js", role=None)[0] == 404


def test_queue_answers_match_the_document(node: LiveNode) -> None:
    queue = unique("q")
    limits_body = {"concurrency_max": 1, "rate_limit": {"max": 5, "per_ms": 1_000}}
    status, view = call(node, "PUT", f"/v1/queues/{queue}", limits_body)
    assert (status, view["concurrency_max"], view["tokens"]) == (200, 1, 5)
    call(node, "POST", "/v1/jobs/batch", {"jobs": [{"task": "t", "queue": queue}] * 3})
    claim_all(node, queue, 1)
    _, view = call(node, "GET", f"/v1/queues/{queue}?consistent=1")
    assert (view["running"], view["queued"], view["held"]["queue_concurrency"]) == (1, 2, 2)
    assert call(node, "POST", f"/v1/queues/{queue}/pause")[1]["paused"] is True
    assert call(node, "POST", f"/v1/queues/{queue}/resume", {})[1]["paused"] is False
    _, listing = call(node, "GET", "/v1/queues")
    assert queue in [found["name"] for found in listing["queues"]]
    _, reset = call(node, "PUT", f"/v1/queues/{queue}", {})
    assert (reset["concurrency_max"], reset["updated_ms"]) == (None, None)


def test_jobs_held_for_a_full_key_show_in_each_queue_s_view_and_metrics(node: LiveNode) -> None:
    queue, other = unique("q"), unique("q")
    keyed = {"task": "t", "concurrency": {"key": unique("acct"), "max": 1}}
    jobs = [{**keyed, "queue": queue}] * 3 + [{**keyed, "queue": other}]
    assert call(node, "POST", "/v1/jobs/batch", {"jobs": jobs})[0] == 201
    claim_all(node, queue, 1)
    _, view = call(node, "GET", f"/v1/queues/{queue}?consistent=1")
    assert (view["queued"], view["running"]) == (2, 1)
    assert view["held"] == {"paused": 0, "queue_concurrency": 0, "queue_rate": 0,
                            "key_concurrency": 2, "key_rate": 0}
    _, elsewhere = call(node, "GET", f"/v1/queues/{other}")  # no limits of its own
    assert (elsewhere["queued"], elsewhere["held"]["key_concurrency"]) == (1, 1)
    metrics = call(node, "GET", "/metrics", role="read")[1].splitlines()
    for name, count in ((queue, 2), (other, 1)):
        assert f'raftcron_queue_held_jobs{{queue="{name}",reason="key_concurrency"}} {count}' \
            in metrics
        assert f'raftcron_queue_held_jobs{{queue="{name}",reason="paused"}} 0' in metrics


def test_bulk_answers_match_the_document(node: LiveNode) -> None:
    queue = unique("q")
    call(node, "POST", "/v1/jobs/batch", {"jobs": [{"task": "t", "queue": queue}] * 3})
    body = {"action": "cancel", "filter": {"queue": queue, "status": "queued"}, "max": 2}
    _, dry = call(node, "POST", "/v1/jobs/bulk", {**body, "dry_run": True})
    assert (dry["matched"], dry["changed"], dry["dry_run"]) == (2, 0, True)
    _, first = call(node, "POST", "/v1/jobs/bulk", body)
    assert (first["matched"], first["changed"], first["more"]) == (2, 2, True)
    _, rest = call(node, "POST", "/v1/jobs/bulk", {**body, "cursor": first["next_cursor"]})
    assert (rest["matched"], rest["changed"]) == (1, 1)


def test_unique_and_debounced_submits_match_the_document(node: LiveNode) -> None:
    body = {"task": "t", "key": unique("k"), "unique": {"on_conflict": "replace"},
            "queue": unique("q")}
    _, first = call(node, "POST", "/v1/jobs", body)
    status, second = call(node, "POST", "/v1/jobs", body)
    assert (status, second["created"], second["replaced_job_id"]) == (201, True, first["id"])
    debounced = {"task": "t", "key": unique("d"), "debounce_ms": 60_000, "payload": 1}
    _, waiting = call(node, "POST", "/v1/jobs", debounced)
    status, moved = call(node, "POST", "/v1/jobs", {**debounced, "payload": 2})
    assert (status, moved["id"], moved["debounced"], moved["payload"]) == (
        200, waiting["id"], True, 2
    )


ERRORS = [
    ("PUT", "/v1/queues/q", {"paused": True}, None, "worker", 403, "forbidden"),
    ("POST", "/v1/jobs/bulk", {"action": "cancel"}, None, "submit", 403, "forbidden"),
    ("GET", "/v1/queues/bad%20name", None, None, "read", 400, "invalid"),
    ("POST", "/v1/jobs", {"task": "t", "unique": {}}, None, "admin", 400, "invalid"),
    ("POST", "/v1/jobs", None, b"{not json", "admin", 400, "invalid"),
    ("POST", "/v1/jobs", None, None, "admin", 400, "invalid"),
    ("POST", "/v1/jobs", {"payload": 1}, None, "admin", 400, "invalid"),
    ("POST", "/v1/jobs", {"task": "t", "payload": "x" * 70_000}, None, "admin", 413, "too_large"),
    ("POST", "/v1/jobs", None, b" " * (BODY_BYTES_MAX + 1), "admin", 413, "too_large"),
    ("POST", "/v1/jobs", {"task": "t"}, None, None, 401, "unauthorized"),
    ("POST", "/v1/jobs", {"task": "t"}, None, "read", 403, "forbidden"),
    ("POST", "/v1/claims", {"worker": "w"}, None, "submit", 403, "forbidden"),
    (
        "PUT",
        "/v1/schedules/s",
        {"every": "1h", "job": {"task": "t"}},
        None,
        "worker",
        403,
        "forbidden",
    ),
    ("GET", "/v1/jobs/123456789", None, None, "read", 404, "not_found"),
    ("GET", "/v1/jobs/x1", None, None, "read", 400, "invalid"),
    ("GET", "/v1/jobs?limit=0", None, None, "read", 400, "invalid"),
    ("GET", "/v1/jobs?status=done", None, None, "read", 400, "invalid"),
    ("GET", "/v1/schedules/bad%20name", None, None, "read", 400, "invalid"),
    ("GET", "/v1/schedules/s/preview?count=1001", None, None, "read", 400, "invalid"),
    ("POST", "/v1/jobs/123456789/complete", {"token": 1}, None, "worker", 404, "not_found"),
    ("POST", "/v1/schedules/nothing-here/trigger", None, None, "admin", 404, "not_found"),
    (
        "POST",
        "/v1/workflows",
        {
            "jobs": [
                {"name": "a", "task": "t", "after": ["b"]},
                {"name": "b", "task": "t", "after": ["a"]},
            ]
        },
        None,
        "admin",
        400,
        "cycle",
    ),
    ("POST", "/v1/jobs", {"task": "t", "depends_on": [123456789]}, None, "admin", 400, "invalid"),
    ("PUT", "/v1/settings/archives", {}, None, "admin", 404, "not_found"),
    ("PUT", "/v1/settings/budget", {"bytes": 1}, None, "admin", 400, "invalid"),
    ("PUT", "/v1/settings/budget", None, None, "admin", 400, "invalid"),
    ("PUT", "/v1/settings/retention", {"queues": {"a b": {"failed": {}}}}, None, "admin", 400,
     "invalid"),
    ("PUT", "/v1/settings/retention", {}, None, "submit", 403, "forbidden"),
    ("POST", "/v1/cluster/finalize", None, None, "read", 403, "forbidden"),
    ("POST", "/v1/cluster/finalize", {"request_id": ""}, None, "admin", 400, "invalid"),
]


@pytest.mark.parametrize(("method", "path", "body", "raw", "role", "status", "code"), ERRORS)
def test_an_error_answer_matches_the_document(
    node: LiveNode,
    method: str,
    path: str,
    body: Any,
    raw: bytes | None,
    role: str | None,
    status: int,
    code: str,
) -> None:
    reply = send(node, method, path, body, role=role, raw=raw)
    answer = assert_documented(method, path, reply)
    assert (reply.status, answer["error"]["code"]) == (status, code), answer
    if status == 401:
        assert reply.headers["www-authenticate"] == "Bearer"


def test_a_reused_request_id_for_another_command_is_a_documented_409(node: LiveNode) -> None:
    request_id = unique("rid")
    call(node, "POST", "/v1/jobs", {"task": "t", "request_id": request_id})
    status, answer = call(
        node,
        "POST",
        "/v1/claims",
        {"worker": "w", "queues": [unique("q")]},
        headers={"X-Request-Id": request_id},
    )
    assert (status, answer["error"]["code"]) == (409, "request_id_reused")


def test_unknown_routes_and_methods_answer_with_the_error_shape(node: LiveNode) -> None:
    assert_error(node.request("GET", "/v1/nowhere"), 404, "not_found")
    assert_error(node.request("DELETE", "/v1/jobs"), 405, "method_not_allowed")
    assert_error(node.request("GET", "/v1/jobs", role=None), 401, "unauthorized")
    wrong = {"Authorization": "Bearer not-a-known-token"}
    assert_error(node.request("GET", "/v1/jobs", role=None, headers=wrong), 401, "unauthorized")


@pytest.fixture
def leaderless_node(tmp_path: Path) -> Iterator[LiveNode]:
    node = start_leaderless_node(tmp_path / "leaderless")
    try:
        yield node
    finally:
        node.stop()


@pytest.mark.processes
def test_a_node_without_a_leader_answers_503_as_documented(leaderless_node: LiveNode) -> None:
    status, readiness = call(leaderless_node, "GET", "/readyz", role=None)
    assert (status, readiness["ready"], readiness["leader"]) == (503, False, None)
    for method, path, body in [
        ("POST", "/v1/jobs", {"task": "t"}),
        ("GET", "/v1/jobs?consistent=1", None),
        ("POST", "/v1/claims", {"worker": "w"}),
    ]:
        reply = send(leaderless_node, method, path, body)
        answer = assert_documented(method, path, reply)
        assert (reply.status, answer["error"]["code"]) == (503, "unavailable"), reply
        assert reply.headers["retry-after"] == "1"
    assert call(leaderless_node, "GET", "/v1/cluster")[1]["leader"] is None


@pytest.mark.parametrize(
    ("key", "reserved"),
    [("s@1800000000000", True), ("s@manual-3", True), ("s@manual", False),
     ("user@example.com", False), ("a@b@5", False)],
)
def test_a_key_shaped_like_a_fire_key_is_refused_by_schema_and_server_alike(
    key: str, reserved: bool
) -> None:
    body = {"task": "t", "key": key}
    assert bool(schema_errors(apidoc.component("JobSubmit"), body)) is reserved
    try:
        JobSpec.parse(body)
    except Invalid as invalid:
        assert reserved and invalid.field == "key", invalid
    else:
        assert not reserved
    assert schema_errors(apidoc.component("JobSubmit"), {"task": "t", "key": None}) == []
