"""The OpenAPI document as tests read it: its operations, and validators for its schemas.

Validation uses openapi-schema-validator (OpenAPI 3.0 semantics: `nullable`, draft-4 types),
with `$ref`s resolved inside the document. `assert_documented` is the one check every live
response goes through: its status is documented for the route, its media type and body match,
and it carries the headers every answer carries.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from .livenode import Reply

DOCUMENT_PATH = Path(__file__).resolve().parents[2] / "cluster" / "http" / "openapi.json"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


@cache
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DOCUMENT_PATH.read_text())
    return loaded


def operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(METHOD, path template, operation) for every operation in the document."""
    for path, item in document()["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield method.upper(), path, operation


def operation(method: str, template: str) -> dict[str, Any]:
    found: dict[str, Any] = document()["paths"][template][method.lower()]
    return found


def by_operation_id(operation_id: str) -> tuple[str, str, dict[str, Any]]:
    for method, path, found in operations():
        if found["operationId"] == operation_id:
            return method, path, found
    raise KeyError(operation_id)


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    """Follow a local `$ref` (`#/components/...`) to what it names."""
    while "$ref" in node:
        target: Any = document()
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def request_schema(operation_id: str) -> dict[str, Any]:
    _, _, found = by_operation_id(operation_id)
    schema: dict[str, Any] = found["requestBody"]["content"]["application/json"]["schema"]
    return schema


def request_examples(operation_id: str) -> dict[str, Any]:
    _, _, found = by_operation_id(operation_id)
    media = found["requestBody"]["content"]["application/json"]
    return {name: example["value"] for name, example in media.get("examples", {}).items()}


def schema_errors(schema: dict[str, Any], instance: Any) -> list[str]:
    """Why `instance` does not match `schema` (a schema or a `$ref` into the document)."""
    validators = pytest.importorskip("openapi_schema_validator", reason="pip install .[test]")
    validator_class = validators.OAS30Validator
    rooted = {**schema, "components": document()["components"]}
    validator = validator_class(rooted, format_checker=validator_class.FORMAT_CHECKER)
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '(root)'}: {error.message}"
        for error in validator.iter_errors(instance)
    ]


def component(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def template_of(method: str, path: str) -> str:
    """The documented template a concrete request matches (`GET /v1/jobs/7` -> `/v1/jobs/{id}`),
    preferring a static path over a template, as aiohttp's router does."""
    bare = path.split("?")[0]
    paths = document()["paths"]
    if method.lower() in paths.get(bare, {}):
        return bare
    for template, item in paths.items():
        pattern = "^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$"
        if method.lower() in item and "{" in template and re.match(pattern, bare):
            return str(template)
    raise KeyError(f"no documented operation matches {method} {path}")


def documented_response(method: str, template: str, status: int) -> dict[str, Any]:
    responses = operation(method, template)["responses"]
    found = responses.get(str(status))
    assert found is not None, (
        f"{method} {template} answered {status}, which the document does not list "
        f"(it lists {', '.join(responses)})"
    )
    return resolve(found)


def assert_documented(method: str, path: str, reply: Reply) -> Any:
    """The reply is one the document promises for this route; returns the decoded body."""
    template = template_of(method, path)
    documented = documented_response(method, template, reply.status)
    assert "x-raftcron-node" in reply.headers and "x-raftcron-applied-index" in reply.headers
    for name, header in documented.get("headers", {}).items():
        if resolve(header).get("required") or name in ("Retry-After", "WWW-Authenticate"):
            assert name.lower() in reply.headers, f"{reply.status} without {name}"
    if "content" not in documented:
        assert reply.body == b"", f"{reply.status} has a body the document does not describe"
        return None
    media = documented["content"].get(reply.media_type)
    assert media is not None, f"{reply.media_type} is not one of {list(documented['content'])}"
    if reply.media_type != "application/json":
        return reply.body.decode(errors="replace")
    body = reply.json()
    problems = schema_errors(media["schema"], body)
    assert not problems, f"{method} {path} {reply.status} does not match the document: {problems}"
    return body


def assert_error(reply: Reply, status: int, code: str) -> dict[str, Any]:
    """An error answer outside any route (404, 405): the documented Error shape and code."""
    assert reply.status == status, reply
    assert reply.media_type == "application/json"
    body: dict[str, Any] = reply.json()
    assert schema_errors(component("Error"), body) == []
    assert body["error"]["code"] == code, body
    return body
