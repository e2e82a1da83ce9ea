"""Reading node logs: the Python tracebacks in them (JSON log lines with an `exc` field, and
raw ones a crashing interpreter writes to stderr)."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

_OUR_FRAME = re.compile(
    r'File "' + re.escape(str(REPO_ROOT)) + r'/(cluster|scheduler|chaos)/[^"]+\.py"'
)


def tracebacks(lines: list[str], *, ours_only: bool = True) -> list[str]:
    """Python tracebacks in a node log: JSON lines with an `exc` field, and raw ones written
    to stderr. With ours_only, only those with a frame in this repository's packages."""
    found = []
    raw: list[str] = []
    for line in lines:
        if raw and (line.startswith((" ", "\t")) or not line.strip()):
            raw.append(line)
            continue
        if raw:
            raw.append(line)  # the exception line ends a raw traceback
            found.append("\n".join(raw))
            raw = []
        elif line.startswith("Traceback (most recent call last)"):
            raw = [line]
        elif line.startswith("{") and "Traceback" in line:
            found.append(_json_traceback(line))
    if raw:
        found.append("\n".join(raw))
    return [trace for trace in found if not ours_only or _OUR_FRAME.search(trace)]


def _json_traceback(line: str) -> str:
    try:
        entry = json.loads(line)
    except ValueError:
        return line
    if not isinstance(entry, dict):
        return line
    return f"{entry.get('msg', '')}\n{entry.get('exc', '')}"


def thread_stacks(lines: list[str]) -> str:
    """The last dump of every thread's stack in a node log (what faulthandler writes on
    SIGUSR1: blocks that begin "Thread 0x..." or "Current thread 0x..."), or ""."""
    starts = [index for index, line in enumerate(lines)
              if line.startswith(("Thread 0x", "Current thread 0x"))]
    if not starts:
        return ""
    # The dump's blocks follow each other; walk back from the last one to its first.
    first = starts[-1]
    for index in reversed(starts[:-1]):
        between = lines[index + 1:first]
        if any(line.startswith("{") for line in between):
            break  # a log line between them: an earlier dump
        first = index
    return "\n".join(line for line in lines[first:] if not line.startswith("{"))
