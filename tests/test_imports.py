"""The package's import graph: one installed name, and no import from outside `raftcron`'s own
names into it.

Every module of the product and the suite imports the project by `raftcron.<room>`: the
top-level `scheduler`, `cluster` and `chaos` directories are the repository's layout, and
importing a module by both names would make two copies of it (two classes that fail each
other's isinstance checks, two registries of tasks). Type-only imports count: they are imports.
"""

import ast
import functools
import io
import os
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "raftcron"
ROOMS = ("scheduler", "cluster", "chaos")


@functools.cache  # one walk and one parse of the tree for every check here
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
                                    "from chaos.tier1 import SeedRun"])
def test_the_check_catches_a_top_level_import(source, tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(source + "\n")
    [(_, module)] = imports_of("raftcron.cluster.probe", path)
    assert module.split(".")[0] in ROOMS


ROOM_NAMES = "|".join(ROOMS)
# `from <room>[.module] import` anywhere; `import <room>[.module]` where a line or a piece of
# code in backticks starts (prose that says "import" beside a room's name is not code).
TOP_LEVEL_IMPORT = re.compile(
    rf"(?<![\w.])from\s+(?:{ROOM_NAMES})(?:\.\w+)*\s+import\b"
    rf"|(?:^|[`;])[ \t>]*import\s+(?:{ROOM_NAMES})(?:\.\w+)*(?=[ \t]*(?:$|[`;,]|as\b))",
    re.MULTILINE,
)


def is_parametrize_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "parametrize")


def imports_in_text(path: Path) -> list[tuple[int, str]]:
    """(line, code) for every import of a room by its top-level name inside the file's strings
    (a program run with `python -c`, a snippet in a docstring) and comments. The import
    statements are `imports_of`'s; the strings that a `pytest.mark.parametrize` hands a test
    are left out (the checks' own probes, below and in test_purity.py)."""
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    probes = {
        id(constant)
        for call in ast.walk(tree) if is_parametrize_call(call)
        for constant in ast.walk(call)
    }
    texts = [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in probes
    ]
    texts += [
        (token.start[0], token.string.lstrip("#"))
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    return [
        (line + text.count("\n", 0, match.start()), match.group().strip(" \t>`;"))
        for line, text in texts
        for match in TOP_LEVEL_IMPORT.finditer(text)
    ]


def test_no_program_or_snippet_in_a_string_imports_a_room_by_its_top_level_name():
    """A program run with `python -c` that imports `cluster.commandline.main` by the room's name
    works only from the repository's root (its cwd on sys.path) and loads the modules under a second
    name; a docstring or comment showing such an import teaches a name that a user's install
    does not have."""
    files = {**modules(), **{f"tests.{p.stem}": p for p in (REPO / "tests").rglob("*.py")}}
    problems = [
        f"{path.relative_to(REPO)}:{line} {code!r}"
        for path in files.values()
        for line, code in imports_in_text(path)
    ]
    assert problems == []


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ('PROGRAM = (\n    "import sys\\n"\n    "from cluster.cli import main\\n"\n)\n', 3),
        ('run(["python", "-c", "import chaos.tier1; chaos.tier1.main()"])\n', 1),
        ('def f():\n    """Use it as\n\n        from scheduler import state\n    """\n', 4),
        ("x = 1  # the decorator (`from cluster.worker import task`)\n", 1),
        ('code = """\n>>> import cluster\n"""\n', 2),
    ],
)
def test_the_text_check_catches_a_top_level_import(source, line, tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert [found for found, _ in imports_in_text(path)] == [line]


@pytest.mark.parametrize(
    "source",
    [
        '"""The shell must never import cluster state from the core."""\n',
        '"from raftcron.cluster.commandline.main import main"\n',
        "# the scheduler imports nothing from cluster/\n",
    ],
)
def test_the_text_check_leaves_prose_and_package_imports_alone(source, tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert imports_in_text(path) == []


@functools.cache
def graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (`from a import b` counts b when b is a
    module). A package's __init__ re-exporting its modules is an edge like any other."""
    names = modules()
    edges: dict[str, set[str]] = {}
    for name, path in names.items():
        targets = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        for _, module in imports_of(name, path):
            if module in names:
                targets.add(module)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {f"{node.module}.{a.name}" for a in node.names} & names.keys()
        edges[name] = targets - {name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_in_a_circle():
    """Type-only imports included: a circle hidden behind TYPE_CHECKING is still one."""
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_circles():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}, "g": set()}
    assert sorted(cycles(edges)) == [["a", "b", "c"], ["e", "f"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_core_imports_nothing_of_the_shell():
    problems = [
        f"{name} imports {target}"
        for name, targets in graph().items()
        if name.startswith("raftcron.scheduler")
        for target in targets
        if not target.startswith("raftcron.scheduler")
    ]
    assert problems == []


def test_the_product_imports_no_tool_but_the_commands_that_run_them():
    """cluster/dev (local cluster, demo, benchmarks) and chaos are tools beside the product:
    only the `raftcron` command reaches them, for `raftcron demo|bench|chaos`."""
    tools = ("raftcron.cluster.dev", "raftcron.chaos")
    problems = [
        f"{name} imports {target}"
        for name, targets in graph().items()
        if not name.startswith(tools) and name != "raftcron.cluster.commandline.main"
        for target in targets
        if target.startswith(tools)
    ]
    assert problems == []


SEAM_PRIVATE = {"state", "lock", "audits"}  # what only cluster/consensus/replica.py touches


def reaches_past_the_seam(path: Path) -> list[int]:
    """Lines reading `<...>machine.state`, `.lock` or `.audits` (a StateMachine's insides)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Attribute) or node.attr not in SEAM_PRIVATE:
            continue
        owner = node.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if name == "machine":
            lines.append(node.lineno)
    return lines


def test_the_shell_reads_the_state_through_one_seam():
    """Every read of the core's state goes through `StateMachine.read(query)` (a pure query
    from scheduler/views.py, run under the apply lock); nothing else takes the lock or holds a
    live record. The replica's other reads hand out immutable values: `machine.members` (the
    member book, replaced whole by each change), `machine.clock_started` (one flag) and
    `machine.audit(id)` (a tuple)."""
    problems = [
        f"{path.relative_to(REPO)}:{line}"
        for name, path in modules().items()
        if name.startswith("raftcron.cluster") and name != "raftcron.cluster.consensus.replica"
        for line in reaches_past_the_seam(path)
    ]
    assert problems == []


@pytest.mark.parametrize(
    "source",
    [
        "with node.machine.lock:\n    pass\n",
        "x = machine.state.table\n",
        "y = svc.node.machine.audits\n",
    ],
)
def test_the_seam_check_catches_a_reach_past_it(source, tmp_path):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert reaches_past_the_seam(path) == [1]


MODULE_LINES_MAX = 600


def test_no_module_is_over_600_lines() -> None:
    """A module a newcomer must read whole stays readable: the product's, and the tools' in
    cluster/dev and the proof's in chaos/ too (they are read to trust a figure or a verdict)."""
    found = modules()
    assert any(name.startswith("raftcron.cluster.dev.") for name in found), sorted(found)
    assert any(name.startswith("raftcron.chaos.") for name in found), sorted(found)
    assert len(found) > 200, sorted(found)  # the walk found the product and its tools
    long = {name: lines for name, path in found.items()
            if (lines := len(path.read_text().splitlines())) > MODULE_LINES_MAX}
    assert not long, long


# The shell's rooms, lowest first (cluster/ and its folders): a module may import its own room
# and the rooms before it, never one after. So the instruments and the config know nothing of
# the node, a client nothing of the server, the log nothing of the HTTP API. The tools
# (cluster/dev) stand on top and may read anything; the command line reaches them through one
# door (TOOL_DOOR), for `raftcron demo|bench|chaos`.
CLUSTER_ROOMS = (
    "config",  # cluster/config.py and configenv.py: what a node is told
    "telemetry",  # histograms, logs, traces
    "clients",  # Client, AsyncClient, TLS contexts, a node dialling its peers
    "worker",  # the worker and its handlers' context
    "storage",  # the Raft log and snapshots on disk
    "archive",  # finished jobs on disk
    "membership",  # who the members are, how a node starts
    "consensus",  # the replica, the proposer, PySyncObj's patches
    "clock",  # the members' clocks and the leader's Ticks
    "ops",  # metrics, doctor, backups, notifications
    "http",  # the API and the dashboard
    "node",  # cluster/node.py: composes a node
    "commandline",  # the `raftcron` command
    "dev",  # tools: local clusters, the demo, benchmarks, the reference pages' generator
)
# The one way down from the command line to the tools: `raftcron demo|bench|chaos` (imported
# when the command runs; test_the_product_imports_no_tool_but_the_commands_that_run_them).
TOOL_DOOR = "raftcron.cluster.commandline.main"
CLUSTER_ROOT = {"raftcron.cluster", "raftcron.cluster.config", "raftcron.cluster.configenv",
                "raftcron.cluster.node", "raftcron.cluster.cli"}
# cluster/cli.py is the command's entry point from before the rooms (`python -m
# raftcron.cluster.cli` keeps working): a door into the command line's room, nothing more.
ROOT_DOORS = {"cli": "commandline"}


def cluster_room(name: str) -> str | None:
    """The room of a module of cluster/ (None outside it)."""
    parts = name.split(".")
    if parts[:2] != ["raftcron", "cluster"] or len(parts) < 3:
        return None
    if parts[2] in ("config", "configenv"):
        return "config"
    return ROOT_DOORS.get(parts[2], parts[2])


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    problems = []
    for name, targets in sorted(edges.items()):
        room = cluster_room(name)
        if room is None:
            continue
        for target in sorted(targets):
            other = cluster_room(target)
            if name == TOOL_DOOR and other == "dev":
                continue
            if other is not None and CLUSTER_ROOMS.index(other) > CLUSTER_ROOMS.index(room):
                problems.append(f"{name} ({room}) imports {target} ({other})")
    return problems


def test_cluster_root_holds_only_what_composes_a_node_and_every_module_has_a_room() -> None:
    names = [name for name in modules() if name.startswith("raftcron.cluster")]
    rooms = {cluster_room(name) for name in names} - {None}
    assert rooms == set(CLUSTER_ROOMS), "a new folder of cluster/ needs its place in CLUSTER_ROOMS"
    root = {name for name in names if name.count(".") == 2 and name not in CLUSTER_ROOT
            and not (PACKAGE / "cluster" / name.rsplit(".", 1)[1]).is_dir()}
    assert root == set(), "cluster/'s root composes a node; give these a room"


def test_each_room_of_the_shell_imports_only_the_rooms_before_it() -> None:
    """Type-only imports included: a dependency is one whether or not it runs."""
    assert upward_imports(graph()) == []


@pytest.mark.parametrize(("importer", "imported"), [
    ("raftcron.cluster.consensus.replica", "raftcron.cluster.http.common"),
    ("raftcron.cluster.clients.client", "raftcron.cluster.node"),
    ("raftcron.cluster.config", "raftcron.cluster.telemetry.logs"),
    ("raftcron.cluster.node", "raftcron.cluster.commandline.main"),
    ("raftcron.cluster.commandline.opscli", "raftcron.cluster.dev.demo"),
])
def test_the_room_check_catches_an_import_of_a_later_room(importer: str, imported: str) -> None:
    assert upward_imports({importer: {imported}}) != []
    assert upward_imports({imported: {importer}}) == []


def test_the_commands_entry_point_from_before_the_rooms_still_runs(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Scripts and service files run `python -m raftcron.cluster.cli`; it is the same command."""
    import runpy
    import sys

    from raftcron.cluster import cli
    from raftcron.cluster.commandline import main

    assert cli.main is main.main
    monkeypatch.setattr(sys, "argv", ["raftcron", "--help"])
    monkeypatch.delitem(sys.modules, "raftcron.cluster.cli")  # run afresh, as -m runs it
    with pytest.raises(SystemExit) as done:  # as `python -m raftcron.cluster.cli --help` runs
        runpy.run_module("raftcron.cluster.cli", run_name="__main__")
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: raftcron")
