"""Schemathesis hooks of the API fuzz, loaded by its CLI through SCHEMATHESIS_HOOKS.

Two kinds of request are adjusted before they are sent (`tame`), each for a stated reason,
and a failure is dropped only when the answer shows a known product bug, told apart by the
one error line the node logged for that request (`KNOWN_BUGS`). Each known bug is pinned by a
test in test_api_regressions.py: once the bug is fixed that test fails, and its entry here
goes with it. Everything else fails the fuzz.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import schemathesis

NODE_LOG = "RAFTCRON_FUZZ_NODE_LOG"  # environment: the fuzzed node's log file
KNOWN_BUGS_SEEN = "known-bugs-seen.tsv"  # in the working directory: test, operation
CLAIM_WAIT_MS_MAX = 100


@dataclass(frozen=True)
class KnownBug:
    test: str  # the regression test that pins it
    status: int
    logged: str  # a regex that the node's error line (message and traceback) matches


KNOWN_BUGS: tuple[KnownBug, ...] = ()  # none open: see test_api_regressions.py


def tame(case: Any) -> None:
    """Adjust the kinds of request that would otherwise stop the fuzz or repeat a known bug.

    - A claim long-polls up to wait_ms (30 s): valid, but it would spend the time budget.
    - X-Request-Id is read only when the body has no request_id (as documented): it is left
      out then, or its value would be judged although the server never reads it.
    New containers are assigned, so schemathesis re-judges whether the case is still invalid.
    """
    body = case.body
    if not isinstance(body, dict):
        return
    path = case.operation.path
    if path == "/v1/claims" and _int_over(body.get("wait_ms"), CLAIM_WAIT_MS_MAX):
        body = {**body, "wait_ms": CLAIM_WAIT_MS_MAX}
    if body != case.body:
        case.body = body
    if body.get("request_id") and case.headers and "X-Request-Id" in case.headers:
        case.headers = {k: v for k, v in case.headers.items() if k != "X-Request-Id"}


def _int_over(value: Any, limit: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > limit


def known_bug(status: int, errors: list[dict[str, Any]]) -> KnownBug | None:
    """The known bug an answer shows: its status, and the one error it made the node log."""
    if len(errors) != 1:
        return None
    for bug in KNOWN_BUGS:
        if status == bug.status and re.search(bug.logged, describe(errors[0])):
            return bug
    return None


def describe(record: dict[str, Any]) -> str:
    return f"{record.get('msg', '')}\n{record.get('exc', '')}"


class LogCursor:
    """Reads the error lines a node logged since the last look (the log only grows)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def skip_to_end(self) -> None:
        self.offset = self.path.stat().st_size

    def new_errors(self) -> list[dict[str, Any]]:
        with self.path.open("rb") as log:
            log.seek(self.offset)
            data = log.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        records = []
        for line in complete.decode(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("level") in ("error", "critical"):
                records.append(record)
        return records


_cursor = LogCursor(Path(os.environ[NODE_LOG])) if NODE_LOG in os.environ else None
_errors_by_case: dict[int, list[dict[str, Any]]] = {}


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    tame(case)
    if _cursor is not None:
        _cursor.skip_to_end()


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    if _cursor is not None:
        _errors_by_case[id(case)] = _cursor.new_errors()


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure but those of an answer that shows a known bug (noted in a file)."""
    bug = known_bug(response.status_code, _errors_by_case.get(id(case), []))
    if bug is None:
        return True
    with Path(KNOWN_BUGS_SEEN).open("a") as seen:
        seen.write(f"{bug.test}\t{case.operation.label}\n")
    return False
