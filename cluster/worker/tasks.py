"""Task registration: names -> handlers, and the errors a handler may raise on purpose.

A handler takes one argument, the job's `JobContext`, and returns a JSON value (the job's
result, at most 64 KiB as msgpack). It may be a plain function (run in the worker's thread
pool) or a coroutine function (run on the worker's event loop). Raising fails the attempt,
retryable (with the job's backoff) unless the exception is a `PermanentError`; the error text
is the exception's type, message and traceback, or just the message for a `JobError`.

This module only records handlers; running them is `cluster.worker.execution`'s job.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from raftcron.scheduler import limits, parse

Handler = Callable[[Any], Any]


class JobError(Exception):
    """Raise it from a handler to fail the attempt with exactly its message (no traceback);
    the job is retried with its backoff while it has attempts left."""


class PermanentError(JobError):
    """Raise it from a handler to fail the job without further attempts (dead letter now)."""


class LeaseLost(Exception):
    """The job's lease is gone (stale token, cancelled or expired): stop, report nothing."""


@dataclass(frozen=True)
class Task:
    name: str
    handler: Handler
    timeout_ms: int | None = None  # used when the job itself has no timeout_ms
    # Whether the handler is a coroutine function: asked for every job, found out once.
    is_async: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.handler))


class TaskRegistry:
    """Task name -> `Task`. `registry.task("name")` is the decorator."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}

    def task(
        self, name: str | None = None, *, timeout_ms: int | None = None
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function under `name` (default: the function's name)."""

        def register(handler: Handler) -> Handler:
            self.add(name or handler.__name__, handler, timeout_ms=timeout_ms)
            return handler

        return register

    def add(self, name: str, handler: Handler, *, timeout_ms: int | None = None) -> Task:
        task_name = parse.name(name, "task", chars_max=limits.NAME_CHARS_MAX)
        if not callable(handler):
            raise TypeError(f"task {name!r}: the handler must be callable")
        if timeout_ms is not None and timeout_ms < 1:
            raise ValueError(f"task {name!r}: timeout_ms must be positive")
        task = Task(task_name, handler, timeout_ms)
        self._tasks[task_name] = task
        return task

    def update(self, other: TaskRegistry) -> None:
        """Add every task of `other` (a task registered here already keeps its handler)."""
        for name, task in other._tasks.items():
            self._tasks.setdefault(name, task)

    def get(self, name: str) -> Task | None:
        return self._tasks.get(name)

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)


# The registry that `raftcron worker --import module` serves: modules register with the
# module-level `task` decorator (`from raftcron import task`).
default_registry = TaskRegistry()


def task(name: str | None = None, *, timeout_ms: int | None = None) -> Callable[[Handler], Handler]:
    """Register a handler in the default registry: `@task("send-report")`."""
    return default_registry.task(name, timeout_ms=timeout_ms)
