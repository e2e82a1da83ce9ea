"""The blocking Python client of the HTTP API v1, and the client's public import path.

What it owns: `Client`, which runs `AsyncClient`'s methods on a private event-loop thread for
blocking code (scripts, web apps, tests). Failover, retries and request ids are
`AsyncClient`'s (cluster/clients/asyncclient.py); the errors and the URL and request-id helpers are
cluster/clients/clientparts.py's. Both are re-exported here, so `raftcron.cluster.clients.client`
keeps naming everything a user of the client imports.

What it must not do: talk HTTP itself, or retry: every call is one `AsyncClient` call.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from raftcron.cluster.clients.asyncclient import (
    ATTEMPT_S_MIN,
    ATTEMPTS_MAX,
    BACKOFF_S_FIRST,
    BACKOFF_S_MAX,
    FINAL_STATUSES,
    LEADER_HEADER,
    RETRY_DEADLINE_S_MAX,
    RETRY_STATUSES,
    AsyncClient,
)
from raftcron.cluster.clients.clientparts import (
    ApiError,
    RaftcronError,
    StateFull,
    Unavailable,
    new_request_id,
    normalize_urls,
)
from raftcron.cluster.telemetry import tracing

__all__ = [
    "ATTEMPTS_MAX",
    "ATTEMPT_S_MIN",
    "BACKOFF_S_FIRST",
    "BACKOFF_S_MAX",
    "FINAL_STATUSES",
    "LEADER_HEADER",
    "RETRY_DEADLINE_S_MAX",
    "RETRY_STATUSES",
    "ApiError",
    "AsyncClient",
    "Client",
    "RaftcronError",
    "StateFull",
    "Unavailable",
    "new_request_id",
    "normalize_urls",
]

T = TypeVar("T")


class Client:
    """The blocking client: `AsyncClient`'s methods, run on a private event-loop thread.

    `Client(["http://127.0.0.1:8001", "http://127.0.0.1:8002"]).submit("shell", {"argv": [...]})`.
    Close it (or use `with`) to stop its thread; the thread is a daemon either way.
    """

    def __init__(self, urls: str | Sequence[str], **options: Any) -> None:
        self.aio = AsyncClient(urls, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="raftcron-client", daemon=True
        )
        self._thread.start()
        self._closed = False

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coroutine.close()
            raise RaftcronError("this Client is closed")
        traceparent = tracing.current_traceparent()  # the caller's span, if it has one
        if traceparent is not None:
            coroutine = tracing.carrying(traceparent, coroutine)
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except BaseException:
            # Interrupted here (Ctrl-C) while the call goes on in the loop's thread: end it
            # there too, or close() would close the session under it and it would fail over
            # to the next node, with a session of its own that nothing closes.
            future.cancel()
            raise

    def close(self) -> None:
        if self._closed:
            return
        self._run(self.aio.close())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def urls(self) -> list[str]:
        return self.aio.urls

    def request(self, method: str, path: str, body: Any = None, **options: Any) -> Any:
        return self._run(self.aio.request(method, path, body, **options))

    def submit(self, task: str, payload: Any = None, **fields: Any) -> dict[str, Any]:
        return self._run(self.aio.submit(task, payload, **fields))

    def submit_batch(self, jobs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        return self._run(self.aio.submit_batch(list(jobs)))

    def submit_workflow(
        self, jobs: Iterable[Mapping[str, Any]], *, key: str | None = None
    ) -> dict[str, Any]:
        return self._run(self.aio.submit_workflow(list(jobs), key=key))

    def job(self, job_id: int, *, consistent: bool = False) -> dict[str, Any]:
        return self._run(self.aio.job(job_id, consistent=consistent))

    def jobs(self, **filters: Any) -> dict[str, Any]:
        return self._run(self.aio.jobs(**filters))

    def cancel(self, job_id: int, reason: str | None = None) -> dict[str, Any]:
        return self._run(self.aio.cancel(job_id, reason))

    def retry(self, job_id: int) -> dict[str, Any]:
        return self._run(self.aio.retry(job_id))

    def wait(self, job_id: int, **options: Any) -> dict[str, Any]:
        return self._run(self.aio.wait(job_id, **options))

    def put_schedule(self, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        return self._run(self.aio.put_schedule(name, spec))

    def schedule(self, name: str) -> dict[str, Any]:
        return self._run(self.aio.schedule(name))

    def schedules(self) -> list[dict[str, Any]]:
        return self._run(self.aio.schedules())

    def delete_schedule(self, name: str) -> dict[str, Any]:
        return self._run(self.aio.delete_schedule(name))

    def pause_schedule(self, name: str) -> dict[str, Any]:
        return self._run(self.aio.pause_schedule(name))

    def resume_schedule(self, name: str) -> dict[str, Any]:
        return self._run(self.aio.resume_schedule(name))

    def trigger_schedule(self, name: str, *, force: bool = False) -> dict[str, Any]:
        return self._run(self.aio.trigger_schedule(name, force=force))

    def backfill_schedule(self, name: str, from_ms: int, to_ms: int) -> list[dict[str, Any]]:
        return self._run(self.aio.backfill_schedule(name, from_ms, to_ms))

    def preview_schedule(self, name: str | None = None, **options: Any) -> list[dict[str, Any]]:
        return self._run(self.aio.preview_schedule(name, **options))

    def cluster(self) -> dict[str, Any]:
        return self._run(self.aio.cluster())

    def events(self, cursor: int = 0, limit: int = 100) -> dict[str, Any]:
        return self._run(self.aio.events(cursor, limit))

    def download_backup(self, out_path: str, **options: Any) -> dict[str, str]:
        return self._run(self.aio.download_backup(out_path, **options))

    def download_archive(self, out_path: str, **options: Any) -> dict[str, str]:
        return self._run(self.aio.download_archive(out_path, **options))

    def ask_member(self, http_address: str, path: str, **options: Any) -> Any:
        return self._run(self.aio.ask_member(http_address, path, **options))

    def heartbeat(self, job_id: int, token: int, **options: Any) -> dict[str, Any]:
        return self._run(self.aio.heartbeat(job_id, token, **options))

    def complete(self, job_id: int, token: int, result: Any = None) -> dict[str, Any]:
        return self._run(self.aio.complete(job_id, token, result))

    def fail(
        self, job_id: int, token: int, error: str, *, retryable: bool = True
    ) -> dict[str, Any]:
        return self._run(self.aio.fail(job_id, token, error, retryable=retryable))
