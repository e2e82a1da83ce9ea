"""The documentation's pages and their code blocks, as the docs' tests read them.

A fenced block is taken with its language, its first line's number and the HTML comment just
before it, if any: `<!-- not-run: why -->` keeps a Python block from running (a fragment that
needs a cluster or names the reader's own objects), and must say why."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SHELLS = {"sh", "bash", "console", "shell"}
FENCE = re.compile(r"^(\s*)(```+)\s*([\w+-]*)\s*$")
MARK = re.compile(r"^\s*<!--\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository: "docs/concepts/guarantees.md"
    line: int  # of the block's first line of code
    language: str
    code: str
    mark: str  # the comment before the fence ("not-run: ..."), or ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text().split("\n")
    page = path.relative_to(REPO).as_posix()
    index = 0
    while index < len(lines):
        opened = FENCE.match(lines[index])
        if not opened:
            index += 1
            continue
        indent, ticks, language = opened.groups()
        before = next((line for line in reversed(lines[:index]) if line.strip()), "")
        marked = MARK.match(before) if before else None
        end = index + 1
        while end < len(lines) and lines[end].strip() != ticks:
            end += 1
        body = [line[len(indent):] if line.startswith(indent) else line
                for line in lines[index + 1 : end]]
        yield Block(page, index + 2, language, "\n".join(body) + "\n",
                    marked.group(1) if marked else "")
        index = end + 1


def all_blocks(*languages: str) -> list[Block]:
    return [block for path in pages() for block in blocks(path)
            if not languages or block.language in languages]


def commands(block: Block) -> Iterator[tuple[int, list[str]]]:
    """(line, words) of each command of a shell block: continuation lines joined, comments
    dropped; a prompt (`$ `) is taken off a console block's commands."""
    pending, first = "", 0
    for number, line in enumerate(block.code.rstrip("\n").split("\n"), start=block.line):
        if not pending:
            first = number
            if block.language == "console" and line.startswith("$ "):
                line = line[2:]
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        words = shlex.split(pending, comments=True)
        pending = ""
        if words:
            yield first, words
    if pending:
        raise ValueError(f"{block.where}: a line continues past the end of its block")


RAFTCRON = ("raftcron", ".venv/bin/raftcron")


def raftcron_words(words: list[str]) -> list[str] | None:
    """The words after `raftcron` when the command runs it: directly, or inside a container
    (`docker compose exec n1 raftcron ...`); None for any other command (`docker build -t
    raftcron .` names an image)."""
    if words[0] in RAFTCRON:
        return words[1:]
    if words[0] in ("docker", "podman", "kubectl") and "exec" in words:
        after = words[words.index("exec"):]
        for index, word in enumerate(after):
            if word in RAFTCRON:
                return after[index + 1 :]
    return None
