"""The documentation's code is checked, so a page cannot show what does not work: every Python
block runs (or says why it cannot, and still compiles), every `raftcron` command line of a
shell block parses with the CLI's own parser, and every shell line splits as a shell reads it
(`bash -n` over each block is in the processes tier, test_shell_syntax.py)."""

from __future__ import annotations

from typing import Any

import pytest

from raftcron.cluster.dev import docsgen
from raftcron.cluster.worker import default_registry

from .pages import SHELLS, Block, all_blocks, commands, raftcron_words

PYTHON = all_blocks("python")
SHELL = all_blocks(*SHELLS)
COMMANDS = [(block, line, words) for block in SHELL for line, words in commands(block)]
COMMAND_LINES = [(f"{block.page}:{line}", rest) for block, line, words in COMMANDS
                  if (rest := raftcron_words(words)) is not None]
NOT_RUN = "not-run:"


def test_the_pages_have_the_blocks_these_tests_check() -> None:
    # An extraction that found nothing would let every test below pass.
    assert len(PYTHON) >= 5, [block.where for block in PYTHON]
    assert len(COMMAND_LINES) >= 20, COMMAND_LINES
    assert any(where.startswith("README.md") for where, _ in COMMAND_LINES)


def run_block(block: Block) -> None:
    code = compile(block.code, block.where, "exec")  # a block that is not run still compiles
    if block.mark.startswith(NOT_RUN):
        assert block.mark[len(NOT_RUN):].strip(), f"{block.where}: say why it is not run"
        return
    namespace: dict[str, Any] = {"__name__": "docs_block"}
    exec(code, namespace)
    for name, value in namespace.items():
        if name.startswith("test_") and callable(value):
            value()  # a block that is a test (the handlers page's) passes


@pytest.mark.parametrize("block", PYTHON, ids=[block.where for block in PYTHON])
def test_every_python_block_runs_or_says_why_not(block: Block, monkeypatch) -> None:
    # A block registers its handlers with the default registry, as a user's module does.
    monkeypatch.setattr(default_registry, "_tasks", dict(default_registry._tasks))
    run_block(block)


def test_a_block_that_fails_or_is_not_run_without_a_reason_fails() -> None:
    with pytest.raises(AssertionError, match="say why"):
        run_block(Block("x.md", 1, "python", "x = 1\n", "not-run: "))
    with pytest.raises(SyntaxError):
        run_block(Block("x.md", 1, "python", "def broken(:\n", "not-run: a fragment"))
    with pytest.raises(AssertionError):
        run_block(Block("x.md", 1, "python", "def test_it():\n    assert 1 == 2\n", ""))


@pytest.mark.parametrize(("where", "words"), COMMAND_LINES,
                         ids=[where for where, _ in COMMAND_LINES])
def test_every_raftcron_command_line_parses(where: str, words: list[str], capsys) -> None:
    try:
        docsgen.parse_command_line(words)
    except SystemExit as refused:
        if refused.code == 0:
            return  # --help
        pytest.fail(f"{where}: `raftcron {' '.join(words)}` does not parse: "
                    f"{capsys.readouterr().err.strip()} (exit {refused.code})")


def test_a_command_line_the_parser_refuses_fails(capsys) -> None:
    with pytest.raises(SystemExit):
        docsgen.parse_command_line(["jobs", "list", "--no-such-flag"])
    with pytest.raises(SystemExit):
        docsgen.parse_command_line(["chaos", "run", "--minutes", "many"])


def test_a_shell_line_left_open_is_refused() -> None:
    block = Block("x.md", 1, "sh", "raftcron jobs list \\\n", "")
    with pytest.raises(ValueError, match="continues past the end"):
        list(commands(block))
    with pytest.raises(ValueError, match="quotation"):
        list(commands(Block("x.md", 1, "sh", "echo 'open\n", "")))
