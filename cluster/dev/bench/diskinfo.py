"""Where a bench's files go: the filesystem, the disk under it and its counters, the machine.

What it owns: reading /proc and /sys for the mount holding a folder (type, device, options), its
whole disk and that disk's write cache, the flushes and bytes the disk completed so far, the bytes
a folder's files take, and dropping their cached pages (no root needed); `environment`, the
record of all that a bench's figures are reported with. It measures nothing itself and never
writes outside the folder it is given.
"""

from __future__ import annotations

import os
import platform
import sqlite3
from pathlib import Path
from typing import Any

MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")  # fsync reaches no disk there


def filesystem(path: Path) -> dict[str, str]:
    """The mount holding path, from /proc/self/mountinfo: type, device, mount point, options."""
    real = str(path.resolve())
    best: dict[str, str] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        point = fields[4].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best.get("mount_point", "")):
            best = {"type": tail[0], "device": tail[1], "mount_point": point, "options": fields[5]}
    return best


def block_device(path: Path) -> str | None:
    """The name of the whole disk (as in /proc/diskstats) holding path, if there is one."""
    st = path.stat()
    sys_path = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    if not sys_path.exists():
        return None
    device = sys_path.resolve()
    if (device / "partition").exists():
        device = device.parent
    return device.name


def write_cache(device: str | None) -> str | None:
    try:
        return Path(f"/sys/block/{device}/queue/write_cache").read_text().strip()
    except OSError:
        return None


def disk_counters(device: str | None) -> tuple[int, int] | None:
    """(flush requests, bytes written) the device completed so far, from /proc/diskstats."""
    if device is None:
        return None
    for line in Path("/proc/diskstats").read_text().splitlines():
        fields = line.split()  # major, minor, name, then the fields: 7 sectors written, 16 flushes
        if len(fields) >= 20 and fields[2] == device:
            return int(fields[18]), int(fields[9]) * 512
    return None


def bytes_on_disk(directory: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in directory.iterdir() if p.is_file())


def drop_page_cache(directory: Path) -> None:
    """Write back, then ask the kernel to forget the cached pages of every file (no root)."""
    os.sync()
    for path in directory.iterdir():
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def environment(root: Path) -> dict[str, Any]:
    device = block_device(root)
    return {
        "directory": str(root),
        "filesystem": filesystem(root),
        "block_device": device,
        "write_cache": write_cache(device),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "sqlite_secure_delete_default": _sqlite_default("secure_delete"),
        "cpus": os.cpu_count(),
    }


def _sqlite_default(pragma: str) -> object:
    db = sqlite3.connect(":memory:")
    try:
        return db.execute(f"PRAGMA {pragma}").fetchone()[0]
    finally:
        db.close()
