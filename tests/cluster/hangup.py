"""Whether a server hangs up on a connection: the security tests' one socket helper."""

from __future__ import annotations

import socket
import time


def closed_within(sock: socket.socket, timeout_s: float, trickle: bytes = b"") -> bool:
    """Whether the other side closes within timeout_s (reading what it sends), while we send
    `trickle` every 0.2 s (a slowloris client) if it is given."""
    deadline = time.monotonic() + timeout_s
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            if trickle:
                sock.sendall(trickle)
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False
