"""The raftcron worker: run Python handlers and the built-in `shell` task for the cluster.

    from raftcron.cluster.worker import Worker, PermanentError

    worker = Worker(["http://127.0.0.1:8001", "http://127.0.0.1:8002"], queues=["default"])

    @worker.task("send-report")
    def send_report(ctx):
        if already_sent(ctx.key):
            return {"skipped": True}
        ...
        return {"sent": True}

    worker.run()   # until SIGTERM/SIGINT, then drains

Modules loaded by `raftcron worker --import myapp.tasks` register with `@task("name")` from
this package instead (the default registry). Module map: `tasks` (registry, errors), `context`
(what a handler gets), `upstream` (its parents' results), `execution` (one job's life), `acks`
(reports), `runtime` (the loop), `shell` (the built-in task), `cli` (the command).
"""

from raftcron.cluster.worker.context import JobContext
from raftcron.cluster.worker.runtime import Worker
from raftcron.cluster.worker.tasks import (
    JobError,
    LeaseLost,
    PermanentError,
    Task,
    TaskRegistry,
    default_registry,
    task,
)
from raftcron.cluster.worker.upstream import UpstreamUnavailable

__all__ = [
    "JobContext",
    "JobError",
    "LeaseLost",
    "PermanentError",
    "Task",
    "TaskRegistry",
    "UpstreamUnavailable",
    "Worker",
    "default_registry",
    "task",
]
