"""Starting, cutting and stopping a powerfs daemon from a test or the chaos suite.

`PowerFS(backing, mountpoint)` runs `python -m raftcron.chaos.powerfs mount ...` as a child
process in its own session, waits until the mount answers, and always cleans up in `stop` (also
used by `with`): SIGTERM, then SIGKILL after a bound, then `unmount` of whatever mount is left.
Should the starting process die before calling `stop`, the daemon notices and unmounts by
itself. `fuse_unavailable_reason()` says why FUSE cannot be used here (no /dev/fuse, no
libfuse3, or a trivial mfusepy filesystem that does not mount), or None; tests skip on exactly
that.

This module starts processes and mounts; it never touches what is under the mount.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from raftcron.chaos.powerfs import control

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 10.0
POLL_S = 0.02


class PowerFSError(Exception):
    """The daemon did not start, did not answer, or a mount could not be removed."""


def mounted(mountpoint: str | os.PathLike[str]) -> bool:
    """Whether anything is mounted at this path (also a dead FUSE mount, which stat fails on)."""
    target = os.path.realpath(mountpoint)
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            point = line.split(" ")[4].replace("\\040", " ").replace("\\011", "\t")
            if point.replace("\\134", "\\") == target:
                return True
    return False


def unmount(mountpoint: str | os.PathLike[str]) -> bool:
    """Remove the mount at this path, lazily if it is busy; returns whether one was there."""
    path = os.path.realpath(mountpoint)
    if not mounted(path):
        return False
    fusermount = shutil.which("fusermount3") or "fusermount3"
    for argv in ([fusermount, "-u", path], [fusermount, "-u", "-z", path], ["umount", "-l", path]):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(argv, capture_output=True, timeout=COMMAND_TIMEOUT_S, check=False)
        if not mounted(path):
            return True
    raise PowerFSError(f"could not unmount {path}")


class PowerFS:
    """One powerfs daemon serving `backing` at `mountpoint`."""

    def __init__(
        self, backing: str | os.PathLike[str], mountpoint: str | os.PathLike[str], *,
        log_path: str | os.PathLike[str] | None = None, sync_on_exit: bool = True,
        dirty_bytes_max: int | None = None,
    ) -> None:
        self.backing = os.path.realpath(backing)
        self.mountpoint = os.path.realpath(mountpoint)
        self.control_path = control.socket_path_for(self.mountpoint)
        self.log_path = Path(log_path) if log_path else Path(self.backing + ".powerfs.log")
        self.sync_on_exit = sync_on_exit
        self.dirty_bytes_max = dirty_bytes_max
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def __enter__(self) -> PowerFS:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        argv = [sys.executable, "-m", "raftcron.chaos.powerfs", "mount", self.backing,
                self.mountpoint, "--control", self.control_path, "--parent-pid", str(os.getpid())]
        if not self.sync_on_exit:
            argv.append("--drop-on-exit")
        if self.dirty_bytes_max is not None:
            argv += ["--dirty-bytes-max", str(self.dirty_bytes_max)]
        if self._log is not None:
            self._log.close()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (kept open for the daemon's life)
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise PowerFSError(
                    f"powerfs daemon exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            if mounted(self.mountpoint):
                with contextlib.suppress(control.ControlError):
                    control.request(self.control_path, {"op": "ping"}, timeout_s=1.0)
                    return
            time.sleep(POLL_S)
        self.stop()
        raise PowerFSError(f"powerfs did not mount within {timeout_s}s:\n{self.log_tail()}")

    def cut(self, *, torn: bool = False, seed: int = 0) -> dict[str, Any]:
        """A power cut: every change not made durable is gone (torn: last writes in part)."""
        return self._request({"op": "cut", "torn": torn, "seed": seed})

    def sync(self) -> dict[str, Any]:
        """Make everything durable, as sync(1) would on a real disk."""
        return self._request({"op": "sync"})

    def status(self) -> dict[str, Any]:
        return self._request({"op": "status"})

    def set_faults(self, **faults: Any) -> dict[str, Any]:
        """Make the disk sick (chaos/powerfs/faults.py: fsync_delay_s, fsync_jitter_s,
        fsync_errno, write_errno, read_errno, read_only, paths); replaces the faults in force."""
        return self._request({"op": "faults", **faults})

    def clear_faults(self) -> dict[str, Any]:
        """A healthy disk again (what a failed fsync lost stays lost)."""
        return self._request({"op": "faults"})

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        return control.request(self.control_path, message)

    def kill(self) -> None:
        """SIGKILL the daemon: a cut without torn writes, and the mount is gone."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=STOP_TIMEOUT_S)
        unmount(self.mountpoint)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """End the daemon (a clean unmount) and make sure nothing stays mounted."""
        try:
            process = self.process
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=timeout_s)
        finally:
            try:
                unmount(self.mountpoint)
            finally:
                if self._log is not None:
                    self._log.close()
                    self._log = None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


_PROBE = """
import errno, stat, sys
from raftcron.chaos.powerfs.binding import mfusepy
class Empty(mfusepy.Operations):
    use_ns = True
    def getattr(self, path, fh=None):
        if path != "/":
            raise OSError(errno.ENOENT, "")
        return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
    def readdir(self, path, fh):
        return [".", ".."]
mfusepy.FUSE(Empty(), sys.argv[1], foreground=True)
"""


@functools.cache
def fuse_unavailable_reason() -> str | None:
    """Why a FUSE filesystem cannot be mounted here, or None when one can."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse: the fuse kernel module is not loaded or not given to this container"
    try:
        from raftcron.chaos.powerfs import binding  # noqa: F401
    except (OSError, AttributeError) as error:
        return f"libfuse3 cannot be loaded ({error}): Debian packages fuse3 and libfuse3-3"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "not root and no fusermount3: Debian package fuse3"
    with tempfile.TemporaryDirectory(prefix="powerfs-probe-") as mountpoint:
        probe = subprocess.Popen(
            [sys.executable, "-c", _PROBE, mountpoint], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline and probe.poll() is None:
                if mounted(mountpoint):
                    return None
                time.sleep(POLL_S)
            output = ""
            if probe.poll() is not None and probe.stdout is not None:
                output = probe.stdout.read().decode(errors="replace")
            return f"a trivial FUSE filesystem did not mount: {output.strip()[-1000:]}"
        finally:
            unmount(mountpoint)
            if probe.poll() is None:
                probe.terminate()
            try:
                probe.wait(timeout=COMMAND_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(probe.pid, signal.SIGKILL)
                probe.wait(timeout=COMMAND_TIMEOUT_S)
            if probe.stdout is not None:
                probe.stdout.close()
