"""The package's import graph: one installed name, and no import from outside `raftcron`'s own
names into it.

Every module of the product and the suite imports the project by `raftcron.<room>`: the
top-level `scheduler`, `cluster` and `chaos` directories are the repository's layout, and
importing a module by both names would make two copies of it (two classes that fail each
other's isinstance checks, two registries of tasks). Type-only imports count: they are imports.
"""

import ast
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "raftcron"
ROOMS = ("scheduler", "cluster", "chaos")


def modules() -> dict[str, Path]:
    """Every module of the installed package, by its dotted name (the rooms through raftcron/)."""
    found = {}
    paths = [
        Path(top) / file
        for top, _, files in os.walk(PACKAGE, followlinks=True)  # the rooms are links
        for file in files
        if file.endswith(".py")
    ]
    for path in sorted(paths):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports_of(name: str, path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, relative ones resolved, type-only included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append((node.lineno, module))
    return found


def test_the_package_sees_every_room():
    names = modules()
    for room in ROOMS:
        assert f"raftcron.{room}" in names, f"raftcron/{room} does not lead to {room}/"
    assert len(names) > 100


def test_nothing_imports_a_room_by_its_top_level_name():
    problems = []
    files = {**modules(), **{f"tests.{p.stem}": p for p in (REPO / "tests").rglob("*.py")}}
    for name, path in files.items():
        for line, module in imports_of(name, path):
            if module.split(".")[0] in ROOMS:
                problems.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert problems == []


@pytest.mark.parametrize("source", ["import cluster.node", "from scheduler import state",
                                    "from chaos.tier1 import Run"])
def test_the_check_catches_a_top_level_import(source, tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(source + "\n")
    [(_, module)] = imports_of("raftcron.cluster.probe", path)
    assert module.split(".")[0] in ROOMS
