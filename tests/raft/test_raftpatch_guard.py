"""The guard around cluster/consensus/raftpatch.py: the fix only runs on the library it was reviewed
for.

An upgrade of pysyncobj (or an edited copy) must fail here and make install() refuse, so the
fix gets a new review instead of silently patching code it was not written for; installing
twice must be a no-op, and a handler somebody else replaced must not be stacked on.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import tomllib
from collections.abc import Iterator
from typing import Any

import pysyncobj.version
import pytest
from pysyncobj import SyncObj

from raftcron.cluster.consensus import raftpatch

HANDLER = "_SyncObj__onMessageReceived"
PATCHED = [HANDLER, "_SyncObj__deleteEntriesTo"]
PYPROJECT = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"


@pytest.fixture(autouse=True)
def _installed_afterwards() -> Iterator[None]:
    raftpatch.install()
    yield
    raftpatch.install()


def test_the_installed_pysyncobj_is_the_reviewed_version() -> None:
    assert importlib.metadata.version("pysyncobj") == raftpatch.PYSYNCOBJ_VERSION
    assert pysyncobj.version.VERSION == raftpatch.PYSYNCOBJ_VERSION


def test_pyproject_pins_exactly_the_reviewed_version() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    pins = [dep for dep in dependencies if re.match(r"pysyncobj\b", dep)]
    assert pins == [f"pysyncobj=={raftpatch.PYSYNCOBJ_VERSION}"]


def test_the_patched_and_relied_on_functions_match_the_reviewed_source() -> None:
    assert raftpatch.library_mismatches() == []


def test_a_changed_library_function_is_reported_and_install_refuses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def get_entries(self: Any, fromIDx: Any, count: Any = None, maxSizeBytes: Any = None) -> Any:
        return []  # an "upstream change" to a function the fix relies on

    raftpatch.uninstall()
    monkeypatch.setattr(SyncObj, "_SyncObj__getEntries", get_entries)
    problems = raftpatch.library_mismatches()
    assert any("_SyncObj__getEntries" in problem for problem in problems)
    with pytest.raises(raftpatch.RaftPatchError, match="_SyncObj__getEntries"):
        raftpatch.install()
    assert not raftpatch.is_installed()


def test_another_version_is_reported_and_install_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    raftpatch.uninstall()
    monkeypatch.setattr(pysyncobj.version, "VERSION", "0.3.18")
    with pytest.raises(raftpatch.RaftPatchError, match=r"0\.3\.18"):
        raftpatch.install()


@pytest.mark.parametrize("name", PATCHED)
def test_install_twice_wraps_once(name: str) -> None:
    raftpatch.install()
    wrapper = getattr(SyncObj, name)
    raftpatch.install()
    assert getattr(SyncObj, name) is wrapper
    wrapped = wrapper.__wrapped__
    assert wrapped is raftpatch.original(name)
    assert wrapped.__module__ == "pysyncobj.syncobj"
    assert not hasattr(wrapped, "__raftpatch_original__")  # not a wrapper of a wrapper
    assert raftpatch.source_sha256(wrapped) == raftpatch.REVIEWED_SOURCE_SHA256[name]


@pytest.mark.parametrize("name", PATCHED)
def test_install_refuses_to_stack_on_a_foreign_wrapper(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    raftpatch.uninstall()
    library = getattr(SyncObj, name)

    def someone_elses_patch(self: Any, *args: Any) -> None:
        library(self, *args)

    monkeypatch.setattr(SyncObj, name, someone_elses_patch)
    with pytest.raises(raftpatch.RaftPatchError, match="not stacking"):
        raftpatch.install()


def test_uninstalled_restores_the_library_and_reinstalls_on_exit() -> None:
    with raftpatch.uninstalled():
        assert not raftpatch.is_installed()
        raftpatch.install()  # what a node's __init__ does: suppressed here
        assert not raftpatch.is_installed()
        assert all(getattr(SyncObj, name) is raftpatch.original(name) for name in PATCHED)
    assert raftpatch.is_installed()


def test_uninstalled_leaves_an_uninstalled_library_uninstalled() -> None:
    raftpatch.uninstall()
    with raftpatch.uninstalled():
        pass
    assert not raftpatch.is_installed()
