"""Fixtures of the chaos suite's tests: a powerfs mount for one test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from raftcron.chaos.powerfs.harness import PowerFS, fuse_unavailable_reason, mounted


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[PowerFS]:
    """A powerfs mount under the test's folder, stopped and checked afterwards (unmounted, no
    powerfs bug in its log), whatever the test did."""
    reason = fuse_unavailable_reason()
    if reason is not None:
        pytest.skip(f"FUSE cannot be mounted here: {reason}")
    (tmp_path / "disk").mkdir()
    (tmp_path / "mnt").mkdir()
    power = PowerFS(tmp_path / "disk", tmp_path / "mnt", log_path=tmp_path / "powerfs.log")
    try:
        power.start()
        yield power
    finally:
        power.stop()
        assert not mounted(power.mountpoint)
    log = power.log_tail(100_000)
    assert "powerfs bug" not in log and "Traceback" not in log, log
