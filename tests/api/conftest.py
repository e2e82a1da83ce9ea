"""Fixtures of the API tests: a live 1-node cluster per module, and throwaway ones.

A node is stopped at teardown whatever the test did, and its log tail is printed when it
logged an error, so a failure shows the server's side too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .livenode import LiveNode, start_node


def _stop(node: LiveNode) -> None:
    try:
        if node.errors_logged():
            print(f"\n--- {node.log_path} (tail) ---\n{node.log_tail()}")
    finally:
        node.stop()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveNode]:
    """One node shared by the tests of a module (they must not depend on each other's data)."""
    started = start_node(tmp_path_factory.mktemp("node"))
    try:
        yield started
    finally:
        _stop(started)


@pytest.fixture
def fresh_node(tmp_path: Path) -> Iterator[Callable[[], LiveNode]]:
    """Start a node of the test's own (for tests that may break it); all stop at teardown."""
    started: list[LiveNode] = []

    def start() -> LiveNode:
        node = start_node(tmp_path / f"node{len(started)}")
        started.append(node)
        return node

    try:
        yield start
    finally:
        for node in started:
            _stop(node)
