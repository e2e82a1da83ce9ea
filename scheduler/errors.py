"""Outcomes of applying a command: `Ok(value)` or `Rejected(code, message, field)`.

Rejections are values, never exceptions: PySyncObj re-applies a command whose apply raised,
forever, so `SchedulerState.apply` turns every expected failure into a `Rejected` and changes
nothing. `Invalid` is the one exception of the core: spec parsers raise it, and the command
handlers turn it into `Rejected("invalid", ...)` before any state is touched.

Each code carries the HTTP status the API answers with (the h11 habit: protocol errors carry a
status hint), so the shell never has to guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# code -> HTTP status. A code is part of the API contract: never rename one.
STATUS_BY_CODE: dict[str, int] = {
    "invalid": 400,
    "cycle": 400,
    "too_large": 413,
    "not_found": 404,
    "stale_token": 409,
    "job_cancelled": 409,
    "conflict": 409,
    "not_retryable": 409,
    "overlap": 409,
    "request_id_reused": 409,
    "not_ready": 503,
    "busy": 503,
    "not_finalized": 409,
    "state_full": 507,
}


class Invalid(Exception):
    """Bad input: `field` names what is wrong (a dotted path such as `jobs[3].backoff.factor`)."""

    def __init__(self, field: str, message: str, *, code: str = "invalid") -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.code = code

    def within(self, prefix: str) -> Invalid:
        """The same error, its field placed under `prefix` (for nested specs)."""
        if not self.field:  # the item itself is wrong (a list's value)
            field = prefix
        elif self.field.startswith("["):
            field = prefix + self.field
        else:
            field = f"{prefix}.{self.field}"
        return Invalid(field, self.message, code=self.code)


@dataclass(frozen=True, slots=True)
class Ok:
    value: dict[str, Any]

    @property
    def ok(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class Rejected:
    code: str
    message: str
    field: str | None = None
    details: dict[str, Any] | None = None  # more fields of the error body (state_full's figures)

    @property
    def ok(self) -> bool:
        return False

    @property
    def http_status(self) -> int:
        return STATUS_BY_CODE.get(self.code, 400)

    @staticmethod
    def from_invalid(error: Invalid) -> Rejected:
        return Rejected(error.code, f"{error.field}: {error.message}", error.field)


Result = Ok | Rejected
