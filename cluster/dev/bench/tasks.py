"""The benchmark's worker tasks: `noop` does nothing, so a drain measures the queue itself."""

from __future__ import annotations

from typing import Any

from raftcron.cluster.worker import JobContext, task


@task("noop")
async def noop(ctx: JobContext) -> Any:
    return None
