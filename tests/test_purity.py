"""The core stays pure: scheduler/ imports no I/O, clock, thread, randomness or cluster code."""

import ast
from pathlib import Path

import pytest

SCHEDULER = Path(__file__).resolve().parent.parent / "scheduler"
FORBIDDEN = {
    "asyncio",
    "aiohttp",
    "pysyncobj",
    "threading",
    "socket",
    "time",
    "random",
    "uuid",
    "os",
    "cluster",
    "chaos",
    "subprocess",
    "multiprocessing",
    "secrets",
    "pickle",
    "datetime.now",
    "sys",
    "signal",
    "select",
    "selectors",
    "http",
    "urllib",
    "logging",
}
FORBIDDEN_CALLS = {
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("datetime", "today"),
    ("date", "today"),
}


def forbidden(module: str) -> bool:
    """The package's own shell counts by its name inside `raftcron` (raftcron.cluster is
    cluster); `raftcron` itself is the public API, which is the shell's."""
    parts = module.split(".")
    if parts[0] == "raftcron":
        return len(parts) == 1 or parts[1] != "scheduler"
    return parts[0] in FORBIDDEN


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def test_scheduler_imports_nothing_impure():
    problems = []
    files = sorted(SCHEDULER.rglob("*.py"))
    assert files, "scheduler/ has no modules"
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in imported_modules(tree):
            if forbidden(module):
                problems.append(f"{path.name}:{line} imports {module}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                base = node.func.value
                name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
                if (name, node.func.attr) in FORBIDDEN_CALLS:
                    problems.append(
                        f"{path.name}:{node.lineno} reads the clock ({name}.{node.func.attr})"
                    )
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "hash"
            ):
                problems.append(f"{path.name}:{node.lineno} calls the salted builtin hash()")
    assert problems == []


@pytest.mark.parametrize(
    "source",
    [
        "import time",
        "from os import path",
        "import random as r",
        "from cluster import node",
        "from raftcron.cluster import node",
        "import raftcron.chaos.tier2.workload",
        "from raftcron import Worker",
        "import asyncio.events",
    ],
)
def test_the_purity_check_catches_an_impure_import(source):
    modules = [m for _, m in imported_modules(ast.parse(source))]
    assert any(forbidden(m) for m in modules)


def test_the_purity_check_allows_the_core_itself():
    assert not forbidden("raftcron.scheduler.state")
