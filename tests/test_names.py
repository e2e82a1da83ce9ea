"""One name per thing: no class or type alias is defined by two modules of the tree.

Two `Handler`s (an HTTP route's and a task's) or two `SeedResult`s (the Raft simulation's and
tier 1's) make a reader, a grep and an import guess which is meant. A thing used in two places
is defined once and imported; two things get two names.

The whole tree is one room here: the product (scheduler/, cluster/, raftcron's own modules such
as raftcron/testing.py), its tools in cluster/dev and the chaos suite (chaos/). A tool names the
product's things by the product's names, so a `Disk` in chaos/ beside cluster.storage's `Disk`
is the same guess. A definition is a top-level `class`, or a top-level assignment to a CamelCase
name (a type alias such as `Handler = Callable[[Any], Any]`); constants (UPPER_CASE) and
functions are not.
"""

from __future__ import annotations

import ast
import os
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "raftcron"
TYPE_NAME = re.compile(r"[A-Z][a-z0-9]\w*")  # CamelCase: `Handler`, not `FD_LIMIT` nor `T`


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (the rooms through raftcron/'s links)."""
    found = {}
    for top, _, files in os.walk(PACKAGE, followlinks=True):
        for file in files:
            if file.endswith(".py"):
                path = Path(top) / file
                parts = path.relative_to(REPO).with_suffix("").parts
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def defined_types(source: str) -> list[tuple[str, int]]:
    """(name, line) of the module's top-level classes and CamelCase assignments."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            found.append((node.name, node.lineno))
        elif isinstance(node, ast.Assign):
            found += [(target.id, node.lineno) for target in node.targets
                      if isinstance(target, ast.Name) and TYPE_NAME.fullmatch(target.id)]
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
              and TYPE_NAME.fullmatch(node.target.id)):
            found.append((node.target.id, node.lineno))
    return found


def names_defined_twice(files: dict[str, str]) -> dict[str, list[str]]:
    """Type name -> `module:line` of each definition, for names that more than one module of
    `files` (module name -> source) defines."""
    where: dict[str, list[str]] = defaultdict(list)
    for module, source in sorted(files.items()):
        for name, line in defined_types(source):
            where[name].append(f"{module}:{line}")
    return {
        name: places for name, places in where.items()
        if len({place.rpartition(":")[0] for place in places}) > 1
    }


def test_no_type_name_is_defined_by_two_modules_of_the_tree():
    files = {name: path.read_text() for name, path in modules().items()}
    rooms = {name.split(".")[1] for name in files if name.count(".") >= 1}
    # the walk found every room: the product's, the tools' and raftcron's own modules
    assert {"scheduler", "cluster", "chaos", "testing"} <= rooms, sorted(rooms)
    assert any(name.startswith("raftcron.cluster.dev.") for name in files), sorted(files)
    assert names_defined_twice(files) == {}


def test_the_check_finds_a_name_defined_twice():
    files = {
        "raftcron.cluster.http.common": "Handler = Callable[[Request], Response]\nclass A: ...\n",
        "raftcron.cluster.worker.tasks": "Handler = Callable[[Any], Any]\n",
        "raftcron.cluster.a": "from raftcron.cluster.http.common import Handler\nLIMIT = 1\n",
        "raftcron.cluster.b": "class Profile:\n    pass\nLIMIT = 2\nT = TypeVar('T')\n",
        "raftcron.cluster.c": "Profile: TypeAlias = dict[str, int]\n",
        "raftcron.cluster.storage.disk": "class Disk(Protocol):\n    pass\n",
        "raftcron.chaos.powerfs.disk": "LIMIT = 3\n\n\nclass Disk:\n    pass\n",
    }
    assert names_defined_twice(files) == {
        "Handler": ["raftcron.cluster.http.common:1", "raftcron.cluster.worker.tasks:1"],
        "Profile": ["raftcron.cluster.b:1", "raftcron.cluster.c:1"],
        "Disk": ["raftcron.chaos.powerfs.disk:4", "raftcron.cluster.storage.disk:1"],
    }
