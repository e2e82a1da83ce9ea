"""The powerfs daemon: one Volume, its FUSE loop and its control socket, in one process.

`serve` blocks until the mount goes away: `fusermount3 -u MOUNTPOINT`, or SIGTERM, SIGINT or
SIGHUP to this process (libfuse then unmounts). A clean end syncs every pending change first,
as an unmount of a real filesystem does, unless `sync_on_exit` is off. SIGKILL of the daemon is
itself a power cut without torn writes: nothing pending reaches BACKING_DIR, and the mount is
left dead ("Transport endpoint is not connected") until `powerfs unmount` removes it.
With `parent_pid`, the daemon also ends (cleanly) when that process is gone.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from typing import Any

from raftcron.chaos.powerfs.control import ControlServer, socket_path_for
from raftcron.chaos.powerfs.faults import DiskFaults, FaultInjector
from raftcron.chaos.powerfs.fuse_ops import PowerOperations, run_fuse_loop
from raftcron.chaos.powerfs.harness import mounted
from raftcron.chaos.powerfs.volume import DIRTY_BYTES_MAX_DEFAULT, Volume

log = logging.getLogger("powerfs")

PARENT_POLL_S = 0.5


class SetupError(Exception):
    """The backing dir or the mountpoint cannot be used."""


def check_paths(backing: str, mountpoint: str) -> tuple[str, str]:
    backing_real, mount_real = os.path.realpath(backing), os.path.realpath(mountpoint)
    if mounted(mount_real):
        raise SetupError(f"{mount_real} is mounted already (`powerfs unmount` removes it)")
    for name, path in (("backing dir", backing_real), ("mountpoint", mount_real)):
        if not os.path.isdir(path):
            raise SetupError(f"{name} {path} is not a directory")
    if os.path.commonpath([backing_real, mount_real]) in (backing_real, mount_real):
        raise SetupError(f"backing dir {backing_real} and mountpoint {mount_real} nest")
    return backing_real, mount_real


def serve(
    backing: str, mountpoint: str, *, control_path: str | None = None,
    sync_on_exit: bool = True, dirty_bytes_max: int = DIRTY_BYTES_MAX_DEFAULT,
    parent_pid: int | None = None,
) -> None:
    backing, mountpoint = check_paths(backing, mountpoint)
    if parent_pid is not None:
        _end_with_parent(parent_pid)
    volume = Volume(backing, dirty_bytes_max=dirty_bytes_max)
    faults = FaultInjector()
    operations = PowerOperations(volume, sync_on_exit=sync_on_exit, faults=faults)

    def handle(request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            return {"pid": os.getpid(), "backing": backing, "mountpoint": mountpoint}
        if op == "status":
            return {**volume.status(), **faults.status()}
        if op == "faults":
            wanted = DiskFaults.from_request(request)
            faults.set(wanted)
            log.info("action=faults %s", json.dumps(wanted.to_request(), sort_keys=True))
            return faults.status()
        if op == "sync":
            pending = volume.sync_all()
            log.info("action=sync %s", _fields(pending))
            return pending
        if op == "cut":
            report = volume.cut(torn=bool(request.get("torn")), seed=int(request.get("seed", 0)))
            operations.invalidate(report.pop("paths"))
            log.info("action=cut torn=%d %s", len(report["torn_writes"]), _fields(report))
            return report
        raise ValueError(f"unknown op {op!r}")

    server = ControlServer(control_path or socket_path_for(mountpoint), handle)
    log.info("action=mount backing=%s mountpoint=%s control=%s", backing, mountpoint, server.path)
    try:
        run_fuse_loop(operations, mountpoint)
    finally:
        server.close()
        log.info("action=unmounted mountpoint=%s", mountpoint)


def _end_with_parent(parent_pid: int) -> None:
    """SIGTERM this daemon (a clean unmount) once the process that started it is gone, so a
    test run that dies hard leaves no mount behind."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        log.info("action=parent_gone parent_pid=%d", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="powerfs-parent", daemon=True).start()


def _fields(report: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in report.items() if isinstance(v, int))
