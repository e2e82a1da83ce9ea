"""The wheel built from the tree installs one import name, `raftcron` (DESIGN.md §8.6).

The repository keeps `scheduler/`, `cluster/` and `chaos/` at the top level and `raftcron/`
links to them; this builds the wheel from a copy of the working tree (so no `build/` is left in
the checkout, and none left there by an earlier build leaks in) and reads it with zipfile: every
name in it is under `raftcron/` or its dist-info, every module of the tree is in it, and so is
the package data (`py.typed`, the dashboard, openapi.json).

The build runs pip in its own build environment: setuptools>=77 and wheel come from the index
pip is set up with (on the project's machines, wheels on disk; elsewhere PyPI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes  # runs pip

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "raftcron"
ROOMS = ("scheduler", "cluster", "chaos")
BUILD_TIMEOUT_S = 120
NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
    "data", "tests",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    work = tmp_path_factory.mktemp("wheel")
    source, out = work / "src", work / "out"
    shutil.copytree(REPO, source, symlinks=True, ignore=NOT_COPIED)  # raftcron/'s links stay
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
    )
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}\n{built.stderr}"
    [path] = out.glob("raftcron-*.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive


def tree_files(suffix: str) -> set[str]:
    """The package's files in the working tree ending with `suffix`, as the wheel names them."""
    return {
        (Path(top) / file).relative_to(REPO).as_posix()
        for top, _, files in os.walk(PACKAGE, followlinks=True)  # the rooms are links
        if "__pycache__" not in Path(top).parts
        for file in files
        if file.endswith(suffix)
    }


def test_the_wheel_installs_only_raftcron(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    dist_info = {name.split("/")[0] for name in names if name.split("/")[0].endswith(".dist-info")}
    assert len(dist_info) == 1, dist_info
    [info] = dist_info
    outside = [name for name in names if not name.startswith(("raftcron/", f"{info}/"))]
    assert outside == []
    assert wheel.read(f"{info}/top_level.txt").decode().split() == ["raftcron"]


def test_the_wheel_holds_every_module_of_the_tree(wheel: zipfile.ZipFile) -> None:
    """A folder that pyproject's package find leaves out (an `exclude`, an `include` that no
    longer matches) would be missing from a user's install without a word."""
    modules = {name for name in wheel.namelist() if name.endswith(".py")}
    assert modules == tree_files(".py")
    for room in ROOMS:
        assert f"raftcron/{room}/__init__.py" in modules


def test_the_wheel_holds_the_package_data(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    dashboard = {
        f"raftcron/cluster/http/ui/{file.name}" for file in (REPO / "cluster/http/ui").iterdir()
    }
    assert dashboard >= {f"raftcron/cluster/http/ui/{f}" for f in ("index.html", "app.js")}
    wanted = {"raftcron/py.typed", "raftcron/cluster/http/openapi.json", *dashboard}
    assert wanted - names == set()


def test_the_commands_run_raftcron_modules(wheel: zipfile.ZipFile) -> None:
    [info] = {name.split("/")[0] for name in wheel.namelist() if ".dist-info/" in name}
    scripts = wheel.read(f"{info}/entry_points.txt").decode()
    targets = [line.split("=", 1)[1].strip() for line in scripts.splitlines() if "=" in line]
    assert targets and all(target.startswith("raftcron.") for target in targets), targets
