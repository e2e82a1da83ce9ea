"""The built-in `http` task: one HTTP request; its response is the job's result.

Payload (only `url` is required):
`{"method": "POST", "url": "https://api.example.com/hook", "headers": {"Authorization": "..."},
"body": "text" or any JSON value, "timeout_ms": 30000, "expect_status": 200 or [200, 204],
"follow_redirects": false, "tls_verify": true}`. A JSON body (object, array, number, boolean)
is sent as JSON (`Content-Type: application/json` unless the headers say otherwise), a string
as UTF-8 text. `expect_status` defaults to any 2xx. The request also carries the job's
`X-Raftcron-Job-Id`, `X-Raftcron-Job-Key` (percent-encoded), `X-Raftcron-Attempt` and
`X-Raftcron-Token` (its fencing token), so the receiver can deduplicate and fence; a payload
cannot set those.

Result: `{"status", "url", "content_type", "body", "body_truncated", "duration_ms"}`: the body
keeps its FIRST `RESPONSE_BYTES_MAX` bytes as UTF-8 text (bad bytes become U+FFFD) and the rest
is never read, so a huge answer costs neither memory nor the cluster's 64 KiB result limit.

What fails how (retrying must be able to help, else the job fails for good):
- a bad payload, a host not allowed, a redirect to one: `PermanentError`;
- no connection, a TLS failure, a timeout (`timeout_ms`, for the whole exchange): retryable;
- an unexpected status: retryable for 5xx, 408, 425 and 429, permanent for any other (a 404
  or a 400 will not change by asking again). The error names the status and the body's start.

Whoever may submit to a queue this task is served on makes the worker call URLs from inside
its network (SSRF), so a worker serves it only when asked (`raftcron worker --allow-http-task`)
and only for the hosts it was given (`--http-task-hosts`; `*` for any, knowingly). The list is
matched against the URL's host name (and every redirect's), not the address it resolves to.
Redirects are not followed unless the payload asks (`follow_redirects`, at most
`REDIRECTS_MAX`); TLS certificates are verified unless the payload says `tls_verify: false`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from yarl import URL

from raftcron.cluster.worker.context import JobContext
from raftcron.cluster.worker.tasks import JobError, PermanentError

HTTP_TASK = "http"
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
RESPONSE_BYTES_MAX = 32 * 1024  # of the body kept as the result (well under the 64 KiB limit)
ERROR_BODY_CHARS = 1_000  # of a failed answer's body quoted in the job's error
TIMEOUT_MS_DEFAULT = 30_000
TIMEOUT_MS_MAX = 3_600_000
URL_CHARS_MAX = 2_048
HEADERS_MAX = 64
HEADER_VALUE_CHARS_MAX = 8_192
BODY_BYTES_MAX = 48 * 1024  # a request body rides in the job's payload, itself <= 64 KiB
REDIRECTS_MAX = 5
RETRYABLE_STATUSES = frozenset({408, 425, 429})
_TOKEN_RE = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an HTTP header name (RFC 9110)
_HOST_RE = re.compile(r"^(\*|(\*\.)?[a-z0-9_.:\-\[\]]+)$")
_JOB_HEADER_PREFIX = "x-raftcron-"
_FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})
_FIELDS = frozenset({"method", "url", "headers", "body", "timeout_ms", "expect_status",
                     "follow_redirects", "tls_verify"})


class HttpFailed(JobError):
    """The request could not be made or was answered badly; retrying may help."""


class HostAllowList:
    """Host names the task may call: exact (`api.example.com`, `10.0.0.5`), every subdomain of
    one (`*.example.com`, not `example.com` itself), or `*` (any host)."""

    def __init__(self, hosts: Sequence[str]) -> None:
        cleaned = [host.strip().lower().strip("[]") for host in hosts if host.strip()]
        if not cleaned:
            raise ValueError(
                "--http-task-hosts: name the hosts the http task may call "
                "(api.example.com, *.example.com, or * for any host)"
            )
        for host in cleaned:
            if not _HOST_RE.match(host) or "/" in host:
                raise ValueError(f"--http-task-hosts: {host!r} is not a host name or *.domain")
        self.any = "*" in cleaned
        self.exact = frozenset(h for h in cleaned if not h.startswith("*"))
        self.suffixes = tuple(h[1:] for h in cleaned if h.startswith("*."))

    def allows(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return self.any or host in self.exact or host.endswith(self.suffixes)

    def __repr__(self) -> str:
        return "*" if self.any else ",".join(sorted(self.exact) + [f"*{s}" for s in self.suffixes])


@dataclass(frozen=True)
class HttpSpec:
    method: str
    url: URL
    headers: dict[str, str]
    body: bytes | None
    timeout_ms: int
    expect_status: frozenset[int] | None  # None: any 2xx
    follow_redirects: bool
    tls_verify: bool

    @classmethod
    def parse(cls, payload: Any) -> HttpSpec:
        if not isinstance(payload, dict):
            raise PermanentError('http: the payload must be an object with "url"')
        unknown = sorted(set(payload) - _FIELDS)
        if unknown:
            known = ", ".join(sorted(_FIELDS))
            raise PermanentError(f"http: unknown field {unknown[0]!r} (known: {known})")
        method = payload.get("method", "GET")
        if not isinstance(method, str) or method.upper() not in METHODS:
            raise PermanentError(f'http: "method" must be one of {", ".join(METHODS)}')
        headers = _headers(payload.get("headers"))
        body = _body(payload.get("body"), headers)
        return cls(
            method=method.upper(),
            url=_url(payload.get("url")),
            headers=headers,
            body=body,
            timeout_ms=_positive(payload.get("timeout_ms", TIMEOUT_MS_DEFAULT), "timeout_ms",
                                 TIMEOUT_MS_MAX),
            expect_status=_statuses(payload.get("expect_status")),
            follow_redirects=_flag(payload.get("follow_redirects", False), "follow_redirects"),
            tls_verify=_flag(payload.get("tls_verify", True), "tls_verify"),
        )

    def expects(self, status: int) -> bool:
        return 200 <= status < 300 if self.expect_status is None else status in self.expect_status


def _url(value: object) -> URL:
    if not isinstance(value, str) or not value or len(value) > URL_CHARS_MAX:
        raise PermanentError(f'http: "url" must be a string of 1-{URL_CHARS_MAX} characters')
    try:
        url = URL(value)
    except ValueError as error:
        raise PermanentError(f'http: "url" {value!r} is not a URL: {error}') from None
    if url.scheme not in ("http", "https") or not url.host:
        raise PermanentError(f'http: "url" {value!r} must be an http:// or https:// URL '
                             "with a host")
    if url.user is not None or url.password is not None:
        raise PermanentError('http: "url" must not hold credentials: send them in "headers"')
    return url


def _headers(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > HEADERS_MAX:
        raise PermanentError(f'http: "headers" must map at most {HEADERS_MAX} names to strings')
    for name, text in value.items():
        if not isinstance(name, str) or not _TOKEN_RE.match(name):
            raise PermanentError(f'http: header name {name!r} is not a valid HTTP header name')
        if not isinstance(text, str) or len(text) > HEADER_VALUE_CHARS_MAX or any(
            c in text for c in "\r\n\0"
        ):
            raise PermanentError(f"http: header {name!r} must be a string of at most "
                                 f"{HEADER_VALUE_CHARS_MAX} characters without CR, LF or NUL")
        lowered = name.lower()
        if lowered.startswith(_JOB_HEADER_PREFIX):
            raise PermanentError(f"http: header {name!r}: X-Raftcron-* headers are the job's own")
        if lowered in _FRAMING_HEADERS:
            raise PermanentError(f"http: header {name!r} is set by the worker, not the payload")
    return dict(value)


def _body(value: object, headers: dict[str, str]) -> bytes | None:
    if value is None:
        return None
    has_type = any(name.lower() == "content-type" for name in headers)
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        if not has_type:
            headers["Content-Type"] = "text/plain; charset=utf-8"
    else:
        data = json.dumps(value, separators=(",", ":")).encode()
        if not has_type:
            headers["Content-Type"] = "application/json"
    if len(data) > BODY_BYTES_MAX:
        raise PermanentError(f'http: "body" is over {BODY_BYTES_MAX} bytes')
    return data


def _positive(value: object, field: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise PermanentError(f'http: "{field}" must be an integer from 1 to {high}')
    return value


def _flag(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise PermanentError(f'http: "{field}" must be true or false')
    return value


def _statuses(value: object) -> frozenset[int] | None:
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    if not items or not all(
        isinstance(s, int) and not isinstance(s, bool) and 100 <= s <= 599 for s in items
    ):
        raise PermanentError('http: "expect_status" must be a status (100-599) or a list of them')
    return frozenset(items)


def first_text(data: bytes, bytes_max: int) -> str:
    """The start of a body as text of at most `bytes_max` bytes as UTF-8."""
    text = data[:bytes_max].decode("utf-8", errors="replace")
    encoded = text.encode("utf-8")
    return text if len(encoded) <= bytes_max else encoded[:bytes_max].decode("utf-8", "ignore")


def http_task(allowed: HostAllowList) -> Callable[[JobContext], Awaitable[Any]]:
    """The `http` handler of a worker that may call the hosts `allowed` lists."""

    async def http(ctx: JobContext) -> dict[str, Any]:
        return await run_http(ctx, allowed)

    return http


async def run_http(ctx: JobContext, allowed: HostAllowList) -> dict[str, Any]:
    spec = HttpSpec.parse(ctx.payload)
    headers = {**spec.headers, **_job_headers(ctx)}
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=spec.timeout_ms / 1000)
    connector = aiohttp.TCPConnector(ssl=spec.tls_verify)
    where = f"{spec.method} {spec.url.with_query(None)}"
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            status, url, content_type, data = await _exchange(session, spec, headers, allowed)
    except TimeoutError:
        raise HttpFailed(f"http: {where}: no answer within {spec.timeout_ms} ms") from None
    except aiohttp.ClientError as error:
        raise HttpFailed(f"http: {where}: {type(error).__name__}: {error}") from None
    body = first_text(data, RESPONSE_BYTES_MAX)
    if not spec.expects(status):
        expected = "2xx" if spec.expect_status is None else sorted(spec.expect_status)
        message = (f"http: {where} answered {status} (expected {expected})"
                   f"{': ' + body[:ERROR_BODY_CHARS] if body else ''}")
        if status >= 500 or status in RETRYABLE_STATUSES:
            raise HttpFailed(message)
        raise PermanentError(message)
    return {
        "status": status,
        "url": str(url),
        "content_type": content_type,
        "body": body,
        "body_truncated": len(data) > RESPONSE_BYTES_MAX,
        "duration_ms": int((time.monotonic() - started) * 1000),
    }


async def _exchange(
    session: aiohttp.ClientSession, spec: HttpSpec, headers: dict[str, str],
    allowed: HostAllowList,
) -> tuple[int, URL, str | None, bytes]:
    """The request, and the redirects it is allowed to follow: (status, final URL, content
    type, the first RESPONSE_BYTES_MAX + 1 bytes of the body)."""
    method, url, body = spec.method, spec.url, spec.body
    for _ in range(REDIRECTS_MAX + 1):
        if url.host is None or not allowed.allows(url.host):
            raise PermanentError(
                f"http: host {url.host!r} is not one this worker may call "
                f"(--http-task-hosts {allowed!r})"
            )
        async with session.request(method, url, headers=headers, data=body,
                                   allow_redirects=False) as response:
            target = response.headers.get("Location")
            if not (spec.follow_redirects and response.status in (301, 302, 303, 307, 308)
                    and target):
                # Read one byte past the bound to know it was cut; the rest is never read.
                data = await response.content.read(RESPONSE_BYTES_MAX + 1)
                return response.status, url, response.content_type, data
        next_url = url.join(URL(target))
        if response.status == 303 or (response.status in (301, 302) and method != "HEAD"):
            method, body = ("GET" if method != "HEAD" else "HEAD"), None
            headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
        if next_url.host != url.host:  # credentials meant for one host never go to another
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        url = next_url
    raise PermanentError(f"http: more than {REDIRECTS_MAX} redirects from {spec.url}")


def _job_headers(ctx: JobContext) -> dict[str, str]:
    headers = {
        "X-Raftcron-Job-Id": str(ctx.job_id),
        "X-Raftcron-Attempt": str(ctx.attempt),
        "X-Raftcron-Token": str(ctx.token),
    }
    if ctx.key:
        # Percent-encoded UTF-8 (a key may hold any text, a header value may not); an ASCII
        # key without '%' or control characters goes as it is.
        headers["X-Raftcron-Job-Key"] = quote(ctx.key, safe=_KEY_SAFE)
    return headers


_KEY_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")
