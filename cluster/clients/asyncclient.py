"""The asynchronous Python client of the HTTP API v1 (DESIGN.md section 4), over aiohttp.

What it owns: one method per route, failover between the nodes it was given, and retries. A
request that cannot reach a node, or that a node answers with 502/503/504 (no leader, commit
timeout), goes to the next node after a short backoff, until a deadline; a write is retried
with the SAME `request_id` (sent as `X-Request-Id`), which the cluster answers with the first
result, so a retried write is never applied twice. Any other error answer is raised at once as
an `ApiError` carrying the status and the API's error code.

What it must not do: interpret answers beyond that (the worker runtime decides what a 409 on a
heartbeat means), or retry a 4xx.

The errors and the URL and request-id helpers are cluster/clients/clientparts.py's; the blocking
`Client` that runs this one on a thread is cluster/clients/client.py's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from raftcron.cluster.clients import tls
from raftcron.cluster.clients.clientparts import (
    ApiError,
    RaftcronError,
    Unavailable,
    new_request_id,
    normalize_urls,
)
from raftcron.cluster.telemetry import tracing
from raftcron.scheduler import limits

log = logging.getLogger("raftcron.client")

LEADER_HEADER = "X-Raftcron-Leader"  # the leader's URL as the answering node knows it
RETRY_STATUSES = frozenset({502, 503, 504})
RETRY_DEADLINE_S_MAX = limits.REQUEST_RETRY_MS / 1000  # how long the cluster remembers an id
FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
BACKOFF_S_FIRST = 0.05
BACKOFF_S_MAX = 1.0
ATTEMPT_S_MIN = 0.5  # never give one attempt less than this, even close to the deadline
ATTEMPTS_MAX = 10_000  # a bound on the retry loop; the deadline ends it long before
# The reads that take `?consistent=1` (the replicated state's collections).
CONSISTENT_READS = ("/v1/jobs", "/v1/schedules", "/v1/queues", "/v1/notifications")


def _drop_none(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


def _encode(body: Any, plain: bool) -> bytes:
    """A request body. orjson only for plain values (a worker's claims, up to 1,000 acks each:
    a worker's CPU in a 100k drain fell 15% with it): it writes NaN as null where json writes
    NaN, which the API refuses naming the field, and a user's payload must not change."""
    if plain:
        try:
            return orjson.dumps(body)
        except TypeError:  # a non-string key, an integer past 64 bits: json's rules then
            pass
    return json.dumps(body, separators=(",", ":")).encode()


def _decode(raw: bytes) -> Any:
    """An answer: the nodes write it with orjson, which orjson reads fastest; json reads what
    orjson refuses (an answer from something else than a node)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


class AsyncClient:
    """The API v1 over aiohttp, failing over between `urls`. Use one per event loop."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        token: str | None = None,
        request_timeout_s: float = 10.0,
        retry_deadline_s: float = 30.0,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        consistent_reads: bool = False,
    ) -> None:
        self.urls = normalize_urls(urls)
        # A node answers a read from its own state, which can lag the leader's by a round
        # trip: a read right after this client's own write, sent to a follower, may not see
        # it. consistent_reads sends every read of jobs, schedules, queues and notifications
        # with `?consistent=1` (one no-op through the log first), as the CLI does: each of its
        # commands is a new client, so the write before it was another process's.
        self.consistent_reads = consistent_reads
        self.token = token
        # https:// nodes are verified against ca_file (or RAFTCRON_CA_FILE, or the system
        # store); cert_file/key_file answer a node that asks for client certificates.
        self.tls = tls.client_context(ca_file, cert_file, key_file)
        self.request_timeout_s = request_timeout_s
        if not 0 < retry_deadline_s <= RETRY_DEADLINE_S_MAX:
            # Past it the cluster may have forgotten the request id: a retry would apply twice.
            raise ValueError(f"retry_deadline_s must be more than 0 and at most "
                             f"{RETRY_DEADLINE_S_MAX:g}, not {retry_deadline_s!r}")
        self.retry_deadline_s = retry_deadline_s
        self.current = 0  # index of the node tried first
        self.failovers = 0
        self._session: aiohttp.ClientSession | None = None

    @property
    def current_url(self) -> str:
        return self.urls[self.current]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            connector = aiohttp.TCPConnector(ssl=self.tls) if self.tls is not None else None
            self._session = aiohttp.ClientSession(headers=headers, connector=connector)
        return self._session

    def _fail_over(self, index: int, reason: str) -> None:
        # Concurrent calls fail together: move on once, not once per caller.
        if self.current == index and len(self.urls) > 1:
            self.current = (index + 1) % len(self.urls)
            self.failovers += 1
            log.warning(
                f"{self.urls[index]} failed ({reason}); trying {self.urls[self.current]}",
                extra={
                    "action": "node_failover",
                    "from_url": self.urls[index],
                    "to_url": self.urls[self.current],
                },
            )

    # -- the one place that talks HTTP -----------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        write: bool = False,
        request_id: str | None = None,
        timeout_s: float | None = None,
        deadline_s: float | None = None,
        plain_json: bool = False,
    ) -> Any:
        """Send one logical request, retrying on other nodes until `deadline_s` (seconds from
        now); the parsed JSON answer. A write carries `request_id` (a fresh one if None).
        `plain_json`: the body holds only what orjson encodes as json does (no NaN, no
        integer past 64 bits, string keys), as the worker's own claims do; encoded by orjson."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        data = None if body is None else _encode(body, plain_json)  # once, not per attempt
        if write or request_id is not None:
            headers["X-Request-Id"] = request_id or new_request_id()
        # The caller's trace, if any (cluster/telemetry/tracing.py).
        if (traceparent := tracing.outgoing_traceparent()) is not None:
            headers["traceparent"] = traceparent
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        if self.consistent_reads and method == "GET" and path.startswith(CONSISTENT_READS):
            query.setdefault("consistent", "1")
        per_attempt_s = timeout_s if timeout_s is not None else self.request_timeout_s
        deadline = time.monotonic() + (
            deadline_s if deadline_s is not None else self.retry_deadline_s
        )
        backoff_s = BACKOFF_S_FIRST
        last = "no attempt made"
        for attempt in range(ATTEMPTS_MAX):
            index = self.current
            url = self.urls[index] + path
            budget_s = max(ATTEMPT_S_MIN, min(per_attempt_s, deadline - time.monotonic()))
            try:
                status, answer, leader = await self._send(
                    method, url, data, query, headers, budget_s
                )
            except (aiohttp.ClientError, TimeoutError, OSError) as error:
                last = f"{url}: {type(error).__name__}: {error}"
            else:
                self._follow(leader)
                if status < 400:
                    return answer
                if status not in RETRY_STATUSES:
                    raise ApiError.from_answer(status, answer)
                last = f"{url}: {ApiError.from_answer(status, answer)}"
            self._fail_over(index, last)
            if (attempt + 1) % len(self.urls) == 0:
                if time.monotonic() + backoff_s >= deadline:
                    break
                await asyncio.sleep(backoff_s)
                backoff_s = min(2 * backoff_s, BACKOFF_S_MAX)
            elif time.monotonic() >= deadline:
                break
        raise Unavailable(f"{method} {path}: no node answered in time; last: {last}")

    async def _object(
        self, method: str, path: str, body: Any = None, **options: Any
    ) -> dict[str, Any]:
        """`request`, for routes that answer a JSON object."""
        answer = await self.request(method, path, body, **options)
        if not isinstance(answer, dict):
            raise RaftcronError(f"{method} {path}: expected a JSON object, not {answer!r:.200}")
        return answer

    async def _send(
        self,
        method: str,
        url: str,
        data: bytes | None,
        query: dict[str, str],
        headers: dict[str, str],
        timeout_s: float,
    ) -> tuple[int, Any, str | None]:
        session = self._session_now()
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.request(
            method, url, data=data, params=query, headers=headers, timeout=timeout
        ) as response:
            raw = await response.read()
        leader = response.headers.get(LEADER_HEADER)
        if response.content_type == "application/json":
            try:
                return response.status, _decode(raw), leader
            except ValueError:
                raise aiohttp.ClientPayloadError(f"{url}: the answer is not JSON") from None
        return response.status, raw.decode(response.charset or "utf-8", "replace"), leader

    def _follow(self, leader: str | None) -> None:
        """Send to the leader from now on, if a node named it and it is one of our URLs.

        A request a follower takes is forwarded to the leader inside the cluster, which costs
        more (CPU on both nodes, a hop of latency) than the leader taking it itself. Only a
        URL this client was given is ever followed: a node cannot send it elsewhere."""
        if leader is None:
            return
        leader = leader.rstrip("/")
        if leader != self.urls[self.current] and leader in self.urls:
            self.current = self.urls.index(leader)

    # -- jobs and workflows -----------------------------------------------------------------

    async def submit(self, task: str, payload: Any = None, **fields: Any) -> dict[str, Any]:
        """Submit one job; `fields` are the API's (queue, key, priority, delay_ms, run_at_ms,
        max_attempts, backoff, timeout_ms, depends_on). The job, with `created` False when
        its `key` matched an earlier job."""
        body = _drop_none({"task": task, "payload": payload, **fields})
        return await self._object("POST", "/v1/jobs", body, write=True)

    async def submit_batch(self, jobs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Submit up to 1,000 jobs (each a submit body) in one command."""
        answer = await self.request("POST", "/v1/jobs/batch", {"jobs": list(jobs)}, write=True)
        return list(answer["jobs"])

    async def submit_workflow(
        self, jobs: Iterable[Mapping[str, Any]], *, key: str | None = None
    ) -> dict[str, Any]:
        """Submit a DAG: each job has a `name` and optional `after` (names of its parents)."""
        body = _drop_none({"jobs": list(jobs), "key": key})
        return await self._object("POST", "/v1/workflows", body, write=True)

    async def job(self, job_id: int, *, consistent: bool = False) -> dict[str, Any]:
        params = {"consistent": 1} if consistent else None
        return await self._object("GET", f"/v1/jobs/{int(job_id)}", params=params)

    async def jobs(
        self,
        *,
        status: str | None = None,
        queue: str | None = None,
        schedule: str | None = None,
        limit: int | None = None,
        cursor: int | None = None,
        consistent: bool = False,
        archived: bool | None = None,
        payload: Mapping[str, Any] | None = None,
        **filters: str | int | None,
    ) -> dict[str, Any]:
        """One page of a search over live and archived jobs: `{"jobs": [...], "next_cursor":
        id or None, "node", "applied_index"}`. `filters`: task, key, worker, error,
        created_from_ms, created_to_ms, finished_from_ms, finished_to_ms. `payload`: a path
        (`"customer.id"`, `"total.gte"`) -> the value it must have, JSON-typed (42 matches
        the number, "42" the string). `archived`: True only archived jobs, False only live."""
        params: dict[str, Any] = {
            "status": status,
            "queue": queue,
            "schedule": schedule,
            "limit": limit,
            "cursor": cursor,
            "consistent": 1 if consistent else None,
            "archived": None if archived is None else str(archived).lower(),
            **filters,
        }
        for path, value in (payload or {}).items():
            params[f"payload.{path}"] = json.dumps(value)
        return await self._object("GET", "/v1/jobs", params=params)

    async def cancel(self, job_id: int, reason: str | None = None) -> dict[str, Any]:
        body = _drop_none({"reason": reason})
        return await self._object(
            "POST", f"/v1/jobs/{int(job_id)}/cancel", body or None, write=True
        )

    async def retry(self, job_id: int) -> dict[str, Any]:
        """Bring a failed (dead-lettered) or cancelled job back."""
        return await self._object("POST", f"/v1/jobs/{int(job_id)}/retry", write=True)

    async def wait(
        self,
        job_id: int,
        *,
        statuses: Iterable[str] = FINAL_STATUSES,
        timeout_s: float = 60.0,
        poll_s: float = 0.1,
    ) -> dict[str, Any]:
        """Poll a job until its status is one of `statuses`; TimeoutError after timeout_s."""
        wanted = frozenset(statuses)
        deadline = time.monotonic() + timeout_s
        while True:
            job = await self.job(job_id)
            if job["status"] in wanted:
                return job
            if time.monotonic() + poll_s > deadline:
                raise TimeoutError(
                    f"job {job_id} is still {job['status']} after {timeout_s:g} s "
                    f"(waited for {', '.join(sorted(wanted))})"
                )
            await asyncio.sleep(poll_s)

    # -- schedules --------------------------------------------------------------------------

    async def put_schedule(self, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace a schedule (`cron`/`every`/`at`, `job` or `workflow`, policies)."""
        return await self._object("PUT", _schedule_path(name), dict(spec), write=True)

    async def schedule(self, name: str) -> dict[str, Any]:
        return await self._object("GET", _schedule_path(name))

    async def schedules(self) -> list[dict[str, Any]]:
        answer = await self.request("GET", "/v1/schedules")
        return list(answer["schedules"])

    async def delete_schedule(self, name: str) -> dict[str, Any]:
        return await self._object("DELETE", _schedule_path(name), write=True)

    async def pause_schedule(self, name: str) -> dict[str, Any]:
        return await self._object("POST", _schedule_path(name, "pause"), write=True)

    async def resume_schedule(self, name: str) -> dict[str, Any]:
        return await self._object("POST", _schedule_path(name, "resume"), write=True)

    async def trigger_schedule(self, name: str, *, force: bool = False) -> dict[str, Any]:
        """Fire now: `{"name", "buffered", "job"}` (`job` None when overlap held it back)."""
        body = {"force": True} if force else None
        return await self._object("POST", _schedule_path(name, "trigger"), body, write=True)

    async def backfill_schedule(self, name: str, from_ms: int, to_ms: int) -> list[dict[str, Any]]:
        """One job per nominal fire time in [from_ms, to_ms) that has none yet."""
        answer = await self.request(
            "POST",
            _schedule_path(name, "backfill"),
            {"from_ms": from_ms, "to_ms": to_ms},
            write=True,
        )
        return list(answer["jobs"])

    async def preview_schedule(
        self,
        name: str | None = None,
        *,
        spec: Mapping[str, Any] | None = None,
        count: int = 10,
        from_ms: int | None = None,
    ) -> list[dict[str, Any]]:
        """The next `count` fire times of a saved schedule (by name) or of an unsaved spec."""
        params = {"count": count, "from_ms": from_ms}
        if spec is not None:
            answer = await self.request("POST", "/v1/schedules/preview", dict(spec), params=params)
        elif name is not None:
            answer = await self.request("GET", _schedule_path(name, "preview"), params=params)
        else:
            raise ValueError("preview_schedule needs a name or a spec")
        return list(answer["fires"])

    # -- operations -------------------------------------------------------------------------

    async def cluster(self) -> dict[str, Any]:
        """The answering node's view: role, leader, term, indexes, members."""
        return await self._object("GET", "/v1/cluster")

    async def events(self, cursor: int = 0, limit: int = 100) -> dict[str, Any]:
        return await self._object("GET", "/v1/events", params={"cursor": cursor, "limit": limit})

    async def download_backup(self, out_path: str, *, timeout_s: float = 600.0) -> dict[str, str]:
        """Stream `GET /v1/cluster/backup` into out_path (made durable), from the first node
        that answers; the snapshot's index, term, cluster name, the node and its URL from the
        answer. The caller checks the file (`raftcron.cluster.ops.backup.check`) before trusting
        it."""
        url, headers = await self._download_from_any(
            "/v1/cluster/backup", {}, out_path, self.urls, RETRY_STATUSES, timeout_s)
        return {"node": headers.get("x-raftcron-node", ""), "url": url,
                "index": headers.get("x-raftcron-snapshot-index", ""),
                "term": headers.get("x-raftcron-snapshot-term", ""),
                "cluster_name": headers.get("x-raftcron-cluster-name", "unknown")}

    async def download_archive(self, out_path: str, *, min_index: int = 0,
                               prefer_url: str | None = None,
                               timeout_s: float = 3_600.0) -> dict[str, str]:
        """Stream `GET /v1/cluster/backup/archive` into out_path (made durable): a node's
        archive holding every job the entries up to `min_index` removed. From `prefer_url`
        first (the node that gave the snapshot holds that already), then the others: an answer
        about the node itself (404 it keeps no archive, 409 it is making one, 507 no room)
        moves on to the next node too. The node, the index the archive covers, its rows and
        bytes from the answer; the caller checks the file
        (`raftcron.cluster.archive.copies.check_file`)."""
        urls = sorted(self.urls, key=lambda url: url != prefer_url)
        _, headers = await self._download_from_any(
            "/v1/cluster/backup/archive", {"min_index": str(min_index)}, out_path, urls,
            RETRY_STATUSES | {404, 409, 507}, timeout_s)
        return {"node": headers.get("x-raftcron-node", ""),
                "index": headers.get("x-raftcron-archive-index", ""),
                "rows": headers.get("x-raftcron-archive-rows", ""),
                "bytes": headers.get("x-raftcron-archive-bytes", "")}

    async def _download_from_any(self, path: str, params: dict[str, str], out_path: str,
                                 urls: Sequence[str], next_on: frozenset[int],
                                 timeout_s: float) -> tuple[str, dict[str, str]]:
        """The first node's answer that is whole, into out_path: its URL and headers (names
        in lower case). An answer with a status in `next_on`, or none, moves on; when every
        node did, the last refusal is raised (Unavailable when none answered at all)."""
        last = "no attempt made"
        refused: ApiError | None = None
        with open(out_path, "wb") as out:  # a file we cannot write fails here, on no node
            for url in urls:
                out.seek(0)
                out.truncate()
                try:
                    headers = await self._download(url + path, params, out, timeout_s)
                except ApiError as error:
                    if error.status not in next_on:
                        raise
                    last, refused = f"{url}: {error}", error
                except (aiohttp.ClientError, TimeoutError, ConnectionError) as error:
                    last = f"{url}: {type(error).__name__}: {error}"
                else:
                    out.flush()
                    os.fsync(out.fileno())
                    return url, headers
        if refused is not None and refused.status not in RETRY_STATUSES:
            raise refused
        raise Unavailable(f"GET {path}: no node gave it; last: {last}")

    async def _download(self, url: str, params: dict[str, str], out: Any,
                        timeout_s: float) -> dict[str, str]:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self._session_now().get(url, params=params, timeout=timeout) as response:
            if response.status >= 400:
                body = await response.text()
                try:
                    answer: Any = json.loads(body)
                except ValueError:
                    answer = body
                raise ApiError.from_answer(response.status, answer)
            async for chunk in response.content.iter_chunked(256 * 1024):
                out.write(chunk)
            return {name.lower(): value for name, value in response.headers.items()}

    async def ask_member(
        self,
        http_address: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        timeout_s: float = 2.0,
    ) -> Any:
        """One GET to the member at `http_address` (host:port, as `cluster()` lists members),
        with no failover: for what each node answers for itself (its own view, its audit
        trail). Its scheme and TLS settings are this client's; ApiError, or Unavailable when
        it does not answer."""
        scheme = self.urls[0].split("://", 1)[0]
        url = f"{scheme}://{http_address}{path}"
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        try:
            status, answer, _ = await self._send("GET", url, None, query, {}, timeout_s)
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise Unavailable(f"{url}: {type(error).__name__}: {error}") from None
        if status >= 400:
            raise ApiError.from_answer(status, answer)
        return answer

    # -- the worker's calls -------------------------------------------------------------------

    async def claim(
        self,
        worker: str,
        queues: Sequence[str],
        *,
        max: int,
        lease_ms: int,
        wait_ms: int = 0,
        acks: Sequence[Mapping[str, Any]] = (),
        request_id: str | None = None,
        deadline_s: float | None = None,
    ) -> dict[str, Any]:
        """Ack finished jobs and claim up to `max` (long-polling up to `wait_ms`):
        `{"jobs": [claimed jobs], "acks": [{"id", "outcome": "ok" or a code}]}`."""
        body = {
            "worker": worker,
            "queues": list(queues),
            "max": max,
            "lease_ms": lease_ms,
            "wait_ms": wait_ms,
            "acks": list(acks),
        }
        return await self._object(
            "POST",
            "/v1/claims",
            body,
            write=True,
            request_id=request_id,
            timeout_s=wait_ms / 1000 + self.request_timeout_s,
            deadline_s=deadline_s,
            plain_json=True,  # acks' results were checked as JSON values (worker/acks.py)
        )

    async def heartbeat(
        self,
        job_id: int,
        token: int,
        *,
        lease_ms: int | None = None,
        progress: Mapping[str, Any] | None = None,
        deadline_s: float | None = None,
    ) -> dict[str, Any]:
        """Extend a lease: `{"id", "lease_until_ms"}`; ApiError 409 when it is lost.
        `progress`: the handler's newest report, `{"value", "message", "data"}` (the job view
        shows it as `progress`)."""
        body = _drop_none({"token": token, "lease_ms": lease_ms,
                           "progress": None if progress is None else dict(progress)})
        return await self._object(
            "POST",
            f"/v1/jobs/{int(job_id)}/heartbeat",
            body,
            write=True,
            timeout_s=deadline_s,
            deadline_s=deadline_s,
        )

    async def complete(self, job_id: int, token: int, result: Any = None) -> dict[str, Any]:
        return await self._object(
            "POST",
            f"/v1/jobs/{int(job_id)}/complete",
            {"token": token, "result": result},
            write=True,
        )

    async def fail(
        self, job_id: int, token: int, error: str, *, retryable: bool = True
    ) -> dict[str, Any]:
        return await self._object(
            "POST",
            f"/v1/jobs/{int(job_id)}/fail",
            {"token": token, "error": error, "retryable": retryable},
            write=True,
        )


def _schedule_path(name: str, action: str | None = None) -> str:
    path = f"/v1/schedules/{quote(name, safe='')}"
    return f"{path}/{action}" if action else path
