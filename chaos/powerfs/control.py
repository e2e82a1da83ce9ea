"""The control channel of a powerfs daemon: a unix socket outside the mount.

One request per connection, one JSON object per line each way:

    {"op": "ping"}                              -> {"ok": true, "pid": 123}
    {"op": "status"}                            -> {"ok": true, "dirty_files": 2, ...}
    {"op": "cut", "torn": true, "seed": 7}      -> {"ok": true, "dirty_bytes": 0, "torn_writes": []}
    {"op": "sync"}                              -> {"ok": true, ...what was pending}
    {"op": "faults", "fsync_delay_s": 2.0, ...} -> {"ok": true, "faults": {...}, "injected": {}}
    {"op": "faults"}                            -> every fault cleared (faults.py: the fields)

The socket's path is derived from the mountpoint's real path (`socket_path_for`), so that
`python -m raftcron.chaos.powerfs cut MOUNTPOINT` finds its daemon without being told more; it
lives in $POWERFS_RUN_DIR (default: the system's temp dir), never inside the mount. This module
owns the wire format and the server thread; what a command does is `volume.py`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import tempfile
import threading
from collections.abc import Callable
from typing import Any

REQUEST_BYTES_MAX = 64 * 1024
REPLY_BYTES_MAX = 64 * 1024 * 1024
CLIENT_TIMEOUT_S = 60.0

ControlHandler = Callable[[dict[str, Any]], dict[str, Any]]


class ControlError(Exception):
    """The daemon could not be reached or refused a command."""


def socket_path_for(mountpoint: str) -> str:
    real = os.path.realpath(mountpoint)
    digest = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    run_dir = os.environ.get("POWERFS_RUN_DIR") or tempfile.gettempdir()
    return os.path.join(run_dir, f"powerfs-{digest}.sock")


class ControlServer:
    """Serves requests on a unix socket in a daemon thread until `close`."""

    def __init__(self, path: str, handler: ControlHandler) -> None:
        self.path = path
        self.handler = handler
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.listener.listen(8)
        self.thread = threading.Thread(target=self._serve, name="powerfs-control", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return  # closed
            with connection:
                try:
                    self._answer(connection)
                except OSError:
                    continue  # the client went away

    def _answer(self, connection: socket.socket) -> None:
        connection.settimeout(CLIENT_TIMEOUT_S)
        raw = _read_line(connection, REQUEST_BYTES_MAX)
        try:
            request = json.loads(raw)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
            reply = {"ok": True, **self.handler(request)}
        except Exception as error:
            reply = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        connection.sendall(json.dumps(reply).encode() + b"\n")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def request(
    path: str, message: dict[str, Any], *, timeout_s: float = CLIENT_TIMEOUT_S
) -> dict[str, Any]:
    """Send one command; raises ControlError when unreachable or when the daemon refused it."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout_s)
            connection.connect(path)
            connection.sendall(json.dumps(message).encode() + b"\n")
            reply = json.loads(_read_line(connection, REPLY_BYTES_MAX))
    except (OSError, ValueError) as error:
        raise ControlError(f"powerfs daemon at {path}: {error}") from error
    if not isinstance(reply, dict) or not reply.get("ok"):
        raise ControlError(f"powerfs daemon refused {message.get('op')}: {reply}")
    return reply


def _read_line(connection: socket.socket, bytes_max: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while not chunks or not chunks[-1].endswith(b"\n"):
        chunk = connection.recv(1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > bytes_max:
            raise ValueError(f"message longer than {bytes_max} bytes")
    return b"".join(chunks)
