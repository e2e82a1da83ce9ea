"""cluster/consensus/raftguard.py in isolation: its guard refuses a changed transport, and an accept
error pauses the listener instead of closing it (the real-node attacks are in
tests/cluster/test_security_raft.py)."""

from __future__ import annotations

import errno
import random
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pysyncobj.poller import createPoller
from pysyncobj.tcp_server import TcpServer

from raftcron.cluster.consensus import raftguard


@pytest.fixture(autouse=True)
def _checked_afresh() -> Iterator[None]:
    raftguard._checked = False
    yield
    raftguard._checked = False


def test_the_overridden_transport_matches_the_reviewed_source() -> None:
    assert raftguard.library_mismatches() == []
    raftguard.check()


def test_a_changed_transport_function_is_reported_and_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def bind(self: Any) -> None:
        """An 'upstream change' to a function the guard relies on."""

    monkeypatch.setattr(TcpServer, "bind", bind)
    assert any("TcpServer.bind" in problem for problem in raftguard.library_mismatches())
    with pytest.raises(raftguard.RaftGuardError, match=r"TcpServer\.bind"):
        raftguard.check()


class _FailingOnce:
    """A listening socket whose next accept() fails with errno, then behaves."""

    def __init__(self, real: socket.socket, code: int) -> None:
        self.real, self.code = real, code

    def accept(self) -> tuple[socket.socket, Any]:
        if self.code:
            code, self.code = self.code, 0
            raise OSError(code, "simulated")
        return self.real.accept()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ECONNABORTED])
def test_an_accept_error_leaves_the_listener_accepting(code: int) -> None:
    poller = createPoller("auto")
    accepted: list[Any] = []
    server = raftguard.GuardedServer(poller, "127.0.0.1", 0, onNewConnection=accepted.append)
    server.bind()
    real = server._TcpServer__socket
    port = real.getsockname()[1]
    try:
        server._TcpServer__socket = _FailingOnce(real, code)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            deadline = time.monotonic() + 10
            while not accepted and time.monotonic() < deadline:
                poller.poll(0.05)
                server.on_tick(time.monotonic())
            assert accepted, f"nothing accepted after {errno.errorcode[code]}"
            assert server._TcpServer__fileno is not None  # still bound
            client.sendall(struct.pack("i", 2**31 - 1))
            conn = accepted[0]
            while conn.state != 0 and time.monotonic() < deadline:  # 0: DISCONNECTED
                poller.poll(0.05)
            assert conn.state == 0, "an unauthenticated 2 GiB frame was not refused"
    finally:
        for conn in accepted:
            conn.disconnect()
        server._TcpServer__socket = real
        server.unbind()



def test_frames_queued_behind_a_slow_reader_are_appended_in_place_and_arrive_whole() -> None:
    """A peer that reads nothing for a while: every frame waits in one buffer, which grows in
    place (the library copied the whole backlog per frame, twice), and the reader then gets
    each message once, in order, through the receiving side's own parser."""
    from pysyncobj.encryptor import getEncryptor

    poller = createPoller("auto")
    left, right = socket.socketpair()
    for end in (left, right):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        end.setblocking(False)
    encryptor = getEncryptor("a cluster password")
    received: list[Any] = []
    sender = raftguard.GuardedConnection(poller, socket=left, timeout=60)
    reader = raftguard.GuardedConnection(poller, socket=right, timeout=60,
                                         onMessageReceived=received.append)
    sender.encryptor = reader.encryptor = encryptor
    # Incompressible entries (zlib runs before Fernet), so the backlog really is large.
    messages = [{"n": n, "entries": [random.Random(n).randbytes(3000), n]} for n in range(200)]
    try:
        sender.send(messages[0])
        outbox = sender._TcpConnection__writeBuffer
        assert isinstance(outbox, bytearray)
        for message in messages[1:]:
            sender.send(message)
            assert sender._TcpConnection__writeBuffer is outbox
        assert sender.getSendBufferSize() > 100_000  # the reader read nothing yet
        deadline = time.monotonic() + 20
        while len(received) < len(messages) and time.monotonic() < deadline:
            poller.poll(0.01)
        assert received == messages
        assert sender.getSendBufferSize() == 0
        sender.disconnect()  # the library resets its buffer to bytes(): sends still work
        assert not isinstance(sender._TcpConnection__writeBuffer, bytearray)
    finally:
        sender.disconnect()
        reader.disconnect()


def test_a_connection_still_connecting_after_the_timeout_is_given_up_to_resolve_again() -> None:
    from pysyncobj.tcp_connection import CONNECTION_STATE

    from raftcron.cluster.consensus.raftguard import stalled_connects

    states = {"stuck": CONNECTION_STATE.CONNECTING, "young": CONNECTION_STATE.CONNECTING,
              "up": CONNECTION_STATE.CONNECTED, "down": CONNECTION_STATE.DISCONNECTED,
              "incoming": CONNECTION_STATE.CONNECTING}  # never dialled by this node
    attempts = {"stuck": 100.0, "young": 101.5, "up": 90.0, "down": 90.0}
    assert stalled_connects(states, attempts, 103.0, 2.0) == ["stuck"]
