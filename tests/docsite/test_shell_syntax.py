"""Every shell block of the documentation passes `bash -n` (a syntax check that runs nothing):
a placeholder such as `<run>` reads as a redirection and fails, so pages write `RUN`."""

from __future__ import annotations

import subprocess

import pytest

from .pages import SHELLS, all_blocks

pytestmark = pytest.mark.processes  # bash is a process

SHELL = all_blocks(*SHELLS)


@pytest.mark.parametrize("block", SHELL, ids=[block.where for block in SHELL])
def test_every_shell_block_passes_bash_n(block) -> None:
    checked = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True,
                             timeout=30)
    assert checked.returncode == 0, f"{block.where}: {checked.stderr.strip()}"


def test_bash_n_refuses_a_placeholder_in_angle_brackets() -> None:
    checked = subprocess.run(["bash", "-n"], input="raftcron chaos check data/chaos/<run>  # x\n",
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode != 0
