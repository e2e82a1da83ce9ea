"""raftcron: a distributed job scheduler that needs no external database.

The public API, for applications that run jobs or submit them:

    from raftcron import Worker, task, PermanentError

    @task("send-report")
    def send_report(ctx):
        ...

    Worker(["http://127.0.0.1:8001"], queues=["default"]).run()

`Client` and `AsyncClient` submit, read and control; `raftcron.testing` runs handlers against
an in-process core with no cluster. Everything else lives in the rooms below and may change
between releases: `raftcron.scheduler` (the pure core), `raftcron.cluster` (nodes, API, worker,
CLI), `raftcron.chaos` (the fault-injection suite).

The names are imported on first use, so `import raftcron.scheduler` (the pure core) does not
pull the worker's or the client's I/O libraries in.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raftcron.cluster.clients.client import (
        ApiError,
        AsyncClient,
        Client,
        RaftcronError,
        StateFull,
        Unavailable,
    )
    from raftcron.cluster.worker import JobContext, LeaseLost, PermanentError, Worker, task

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "JobContext",
    "LeaseLost",
    "PermanentError",
    "RaftcronError",
    "StateFull",
    "Unavailable",
    "Worker",
    "task",
]

_HOMES = {
    "ApiError": "raftcron.cluster.clients.client",
    "AsyncClient": "raftcron.cluster.clients.client",
    "Client": "raftcron.cluster.clients.client",
    "RaftcronError": "raftcron.cluster.clients.client",
    "StateFull": "raftcron.cluster.clients.client",
    "Unavailable": "raftcron.cluster.clients.client",
    "JobContext": "raftcron.cluster.worker",
    "LeaseLost": "raftcron.cluster.worker",
    "PermanentError": "raftcron.cluster.worker",
    "Worker": "raftcron.cluster.worker",
    "task": "raftcron.cluster.worker",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'raftcron' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
