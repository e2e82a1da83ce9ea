"""Fixtures of the storage tests: a `Lab` that opens local clusters for one test and, whatever
the test did, kills every node it started and every orphaned snapshot writer it watched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Lab


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    opened = Lab(tmp_path)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def needs_fuse() -> None:
    """Skips a test that mounts powerfs where FUSE cannot be mounted, naming why."""
    from raftcron.chaos.powerfs.harness import fuse_unavailable_reason

    reason = fuse_unavailable_reason()
    if reason is not None:
        pytest.skip(f"FUSE cannot be mounted here: {reason}")
