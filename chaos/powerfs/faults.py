"""Faults of a sick disk that powerfs injects on request: slow fsyncs, I/O errors, read-only.

What it owns: `DiskFaults`, the validated set of faults in force (built from the control
socket's `{"op": "faults", ...}`, the `powerfs faults` command and `PowerFS.set_faults`), and
`FaultInjector`, which the FUSE adapter asks before each operation what the disk does to it.
What a fault does to the data (a failed fsync's pages lost) is `volume.py`'s; this module only
decides whether, how long and with which errno.

The faults (every field optional; a request without any clears them all):

- ``fsync_delay_s`` (+- ``fsync_jitter_s``, uniform, never below 0): fsync, fdatasync and
  fsync of a directory sleep that long before doing their work, as a disk whose write cache
  flushes stall. Only the calling request waits: the daemon serves other requests meanwhile.
- ``fsync_errno``: fsync fails with it. Like Linux after a failed writeback, the file's data
  written since its last successful fsync is lost: never made durable, not by a later fsync
  that succeeds either ("fsyncgate"), although processes still read it until a power cut.
- ``write_errno``: write(2) fails with it, nothing is changed.
- ``read_errno``: read(2) fails with it when the read reaches the disk. As on a failing disk,
  pages the kernel still caches stay readable (dropping them would also turn every touch of a
  mapping, such as SQLite's WAL index, into SIGBUS); powerfs drops a file's cached pages at
  every open, so a file opened while the fault holds meets it at its first read.
- ``read_only``: every changing operation fails with EROFS (writes, truncates, creates,
  renames, unlinks, mkdir, attribute changes), and so does fsync of a file or directory that
  holds changes not yet durable (they stay pending: a later fsync once healed makes them
  durable; only ``fsync_errno`` loses data).
- ``paths``: a glob (fnmatch, `*` also crosses `/`) over the path relative to the mount that the
  faults apply to, e.g. ``"*.seg"``; by default every file. A file unlinked while open has no
  path and is then spared by a glob.
"""

from __future__ import annotations

import errno
import fnmatch
import random
import threading
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

FSYNC_DELAY_S_MAX = 600.0  # a stall longer than this is a dead disk, not a slow one
PATHS_CHARS_MAX = 1024
ERRNO_NAMES = frozenset(errno.errorcode.values())
FIELDS = ("fsync_delay_s", "fsync_jitter_s", "fsync_errno", "write_errno", "read_errno",
          "read_only", "paths")


class FaultsError(ValueError):
    """A faults request that names an unknown field or a value out of its range."""


@dataclass(frozen=True)
class DiskFaults:
    """The faults in force; the default is a healthy disk. Errnos are names ("EIO")."""

    fsync_delay_s: float = 0.0
    fsync_jitter_s: float = 0.0
    fsync_errno: str | None = None
    write_errno: str | None = None
    read_errno: str | None = None
    read_only: bool = False
    paths: str | None = None

    @classmethod
    def from_request(cls, request: dict[str, Any]) -> DiskFaults:
        """Validate a control request's fields (its "op" aside); raises FaultsError."""
        fields = {k: v for k, v in request.items() if k != "op"}
        unknown = sorted(set(fields) - set(FIELDS))
        if unknown:
            raise FaultsError(f"unknown fault field(s) {unknown}; known: {list(FIELDS)}")
        return cls(
            fsync_delay_s=_seconds(fields, "fsync_delay_s"),
            fsync_jitter_s=_seconds(fields, "fsync_jitter_s"),
            fsync_errno=_errno_name(fields, "fsync_errno"),
            write_errno=_errno_name(fields, "write_errno"),
            read_errno=_errno_name(fields, "read_errno"),
            read_only=_flag(fields, "read_only"),
            paths=_glob(fields, "paths"),
        )

    @property
    def healthy(self) -> bool:
        return self == DiskFaults()

    def to_request(self) -> dict[str, Any]:
        """The fields that differ from a healthy disk (what `from_request` takes back)."""
        healthy = asdict(DiskFaults())
        return {k: v for k, v in asdict(self).items() if v != healthy[k]}

    def applies_to(self, path: str | None) -> bool:
        if self.paths is None:
            return True
        return path is not None and fnmatch.fnmatchcase(path.lstrip("/"), self.paths)


def _seconds(fields: dict[str, Any], name: str) -> float:
    value = fields.get(name, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FaultsError(f"{name} must be a number of seconds, not {value!r}")
    if not 0 <= value <= FSYNC_DELAY_S_MAX:
        raise FaultsError(f"{name} must be within [0, {FSYNC_DELAY_S_MAX:g}] s, not {value}")
    return float(value)


def _errno_name(fields: dict[str, Any], name: str) -> str | None:
    value = fields.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or value not in ERRNO_NAMES:
        raise FaultsError(f"{name} must be an errno name such as \"EIO\", not {value!r}")
    return value


def _flag(fields: dict[str, Any], name: str) -> bool:
    value = fields.get(name, False)
    if not isinstance(value, bool):
        raise FaultsError(f"{name} must be true or false, not {value!r}")
    return value


def _glob(fields: dict[str, Any], name: str) -> str | None:
    value = fields.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > PATHS_CHARS_MAX:
        raise FaultsError(f"{name} must be a non-empty glob of at most {PATHS_CHARS_MAX} "
                          f"characters, not {value!r}")
    if value.startswith("/"):
        raise FaultsError(f"{name} is relative to the mount (\"*.seg\", \"data/*\"), "
                          f"not {value!r}")
    return value


def _fail(name: str) -> OSError:
    code = getattr(errno, name)
    return OSError(code, f"powerfs fault: {name}")


class FaultInjector:
    """The faults in force and what they did; asked from any FUSE thread."""

    def __init__(self, seed: int | None = None) -> None:
        self._lock = threading.Lock()
        self._faults = DiskFaults()
        self._rng = random.Random(seed)
        self.injected: Counter[str] = Counter()

    @property
    def faults(self) -> DiskFaults:
        return self._faults  # one reference, swapped whole: no lock needed to read it

    def set(self, faults: DiskFaults) -> None:
        with self._lock:
            self._faults = faults

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"faults": self._faults.to_request(), "injected": dict(self.injected)}

    def _count(self, what: str) -> None:
        with self._lock:
            self.injected[what] += 1

    def check_read(self, path: str | None) -> None:
        faults = self._faults
        if faults.read_errno is not None and faults.applies_to(path):
            self._count("read_errors")
            raise _fail(faults.read_errno)

    def check_change(self, *paths: str | None) -> None:
        """Before an operation that changes the file system: EROFS when read-only."""
        faults = self._faults
        if faults.read_only and any(faults.applies_to(path) for path in paths):
            self._count("read_only_refusals")
            raise _fail("EROFS")

    def check_write(self, path: str | None) -> None:
        self.check_change(path)
        faults = self._faults
        if faults.write_errno is not None and faults.applies_to(path):
            self._count("write_errors")
            raise _fail(faults.write_errno)

    def fsync_delay_s(self, path: str | None) -> float:
        faults = self._faults
        if (not faults.fsync_delay_s and not faults.fsync_jitter_s) or not faults.applies_to(path):
            return 0.0
        with self._lock:
            jitter = self._rng.uniform(-faults.fsync_jitter_s, faults.fsync_jitter_s)
            self.injected["fsync_delays"] += 1
        return max(0.0, faults.fsync_delay_s + jitter)

    def fsync_failure(self, path: str | None) -> tuple[int | None, bool]:
        """(errno an fsync fails with, losing its data; whether the disk is read-only)."""
        faults = self._faults
        if not faults.applies_to(path):
            return None, False
        if faults.fsync_errno is not None:
            self._count("fsync_errors")
            return int(getattr(errno, faults.fsync_errno)), faults.read_only
        return None, faults.read_only
