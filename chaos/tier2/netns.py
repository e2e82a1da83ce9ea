"""Where chaos traffic flows, and how it is cut: network namespaces, or a relay on loopback.

Two implementations of one small interface (`addresses`, `isolate`, `drop`, `heal`, `close`):

- `Namespaces` (Linux, root, `ip` present): one network namespace per host (`rcchaos-n1`,
  `rcchaos-w1`, `rcchaos-ctl`, ...), each with an `eth0` veth whose peer is a port of the
  bridge `br0` in the `rcchaos-sw` "switch" namespace. Addresses are 198.18.0.x/24 and exist
  only inside those namespaces; nothing is added to the root namespace (no address, route or
  firewall rule). A host is isolated by taking its switch port down; a one-way drop is an
  iptables DROP rule in the receiver's namespace, or, without iptables, a static neighbour
  entry in the sender's namespace pointing at a MAC nobody owns (silent loss either way).
- `Relay` (anywhere): nodes listen on 127.0.0.1 and reach each other's Raft port through
  a TCP relay in this process (the in-process transport hook). PySyncObj connects from the
  higher address to the lower one and names itself by its own address, so only the initiating
  side of each pair is given the relay's address; ports are chosen so that the order holds.
  Cutting a pair closes its connections and holds new ones without forwarding a byte.

Rules: every namespace this module makes is named `rcchaos<slot>-<host>` and removed by
`close()`, by `atexit`, and by `remove_leftovers()` at the start of the next run that gets the
same slot (after the processes left in them are killed by pid). A slot is an exclusive lock on
/run/rcchaos-<slot>.lock held for the whole run, so runs at the same time never touch each
other's namespaces, and a slot's leftovers are only ever those of a run that is gone. No
traffic goes anywhere but loopback or these namespaces.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import os
import random
import selectors
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence

PREFIX = "rcchaos"
SLOTS = 10
LOCK_PATH = "/run/rcchaos-{slot}.lock"
SUBNET = "198.18.0"
CLONE_NEWNET = 0x40000000
NOWHERE_MAC = "02:00:00:00:00:01"  # a locally administered MAC that no veth here has
COMMAND_TIMEOUT_S = 10.0


class NetError(Exception):
    """A namespace command failed (with its output)."""


def run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise NetError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def namespaces_possible() -> str | None:
    """None when namespaces can be used here, else why not (said in the report)."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "no `ip` command (apt-get install -y iproute2)"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    try:
        run(["ip", "netns", "add", probe])
        run(["ip", "netns", "del", probe])
    except (NetError, OSError, subprocess.TimeoutExpired) as error:
        return f"cannot create a network namespace: {error}"
    return None


def our_namespaces(slot: int | None = None) -> list[str]:
    """Namespaces of the suite (of one slot, if given)."""
    try:
        listed = run(["ip", "netns", "list"], check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    prefix = PREFIX if slot is None else f"{PREFIX}{slot}-"
    return [line.split()[0] for line in listed.splitlines() if line.startswith(prefix)]


def acquire_slot() -> tuple[int, int]:
    """(slot, lock fd): the first slot no live run holds. The lock dies with its process."""
    for slot in range(SLOTS):
        fd = os.open(LOCK_PATH.format(slot=slot), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return slot, fd
    raise NetError(f"{SLOTS} chaos runs are going on at once")


def _remove(name: str) -> None:
    pids = run(["ip", "netns", "pids", name], check=False).stdout.split()
    for pid in pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
                os.kill(int(pid), sig)
    run(["ip", "netns", "del", name], check=False)


def remove_leftovers(slot: int | None = None) -> list[str]:
    """Kill the processes left in namespaces of a crashed earlier run and delete those
    namespaces: of `slot` (whose lock the caller holds), or of every slot no run holds."""
    names = our_namespaces(slot) if slot is not None else leftover_namespaces()
    for name in names:
        _remove(name)
    return names


def leftover_namespaces() -> list[str]:
    """Namespaces of the suite whose run is gone (their slot's lock is free)."""
    found = []
    for slot in range(SLOTS):
        names = our_namespaces(slot)
        if not names:
            continue
        try:
            held, fd = acquire_specific(slot)
        except OSError:
            continue
        if held:
            found += names
        os.close(fd)
    return found


def acquire_specific(slot: int) -> tuple[bool, int]:
    fd = os.open(LOCK_PATH.format(slot=slot), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False, fd
    return True, fd


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise NetError(f"setns {path}: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)


class Namespaces:
    """One namespace per host on a bridge; see the module docstring."""

    kind = "netns"

    def __init__(self, hosts: Sequence[str]) -> None:
        self.hosts = list(hosts)
        # CHAOS_NO_IPTABLES=1 exercises the neighbour-entry way of dropping (what a machine
        # without iptables gets).
        self.iptables = (
            shutil.which("iptables") is not None and os.environ.get("CHAOS_NO_IPTABLES") != "1"
        )
        self.created: list[str] = []
        self.entered = False
        self._home_fd: int | None = None
        self._drops: set[tuple[str, str]] = set()  # (receiver, sender)
        self._isolated: set[str] = set()
        self.slot, lock_fd = acquire_slot()
        self._lock_fd: int | None = lock_fd
        self.switch = self.namespace("sw")
        atexit.register(self.close)

    def namespace(self, host: str) -> str:
        return f"{PREFIX}{self.slot}-{host}"

    def address(self, host: str) -> str:
        kind, number = host[0], int(host[1:]) if host[1:].isdigit() else 0
        if host == "ctl":
            return f"{SUBNET}.2"
        offset = {"n": 10, "w": 30}.get(kind)
        if offset is None or not 1 <= number <= 19:
            raise ValueError(f"no address plan for host {host!r}")
        return f"{SUBNET}.{offset + number}"

    def create(self) -> None:
        remove_leftovers(self.slot)
        run(["ip", "netns", "add", self.switch])
        self.created.append(self.switch)
        sw = ["ip", "-n", self.switch]
        run([*sw, "link", "add", "br0", "type", "bridge"])
        run([*sw, "link", "set", "br0", "up"])
        run([*sw, "link", "set", "lo", "up"])
        for host in self.hosts:
            name = self.namespace(host)
            run(["ip", "netns", "add", name])
            self.created.append(name)
            port = f"v-{host}"
            run([*sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", name])
            run([*sw, "link", "set", port, "master", "br0", "up"])
            run(["ip", "-n", name, "addr", "add", f"{self.address(host)}/24", "dev", "eth0"])
            run(["ip", "-n", name, "link", "set", "eth0", "up"])
            run(["ip", "-n", name, "link", "set", "lo", "up"])

    def exec_prefix(self, host: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(host)]

    def enter(self, host: str) -> None:
        """Move this process's calling thread (call it from the main thread before any other
        thread starts) into a host's namespace; threads started later inherit it."""
        self._home_fd = os.open("/proc/self/ns/net", os.O_RDONLY)
        _setns(f"/run/netns/{self.namespace(host)}")
        self.entered = True

    def leave(self) -> None:
        if self._home_fd is not None:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.setns(self._home_fd, CLONE_NEWNET)
            os.close(self._home_fd)
            self._home_fd = None
        self.entered = False

    # -- faults -----------------------------------------------------------------------------

    def isolate(self, host: str) -> None:
        """Pull the host's cable at the switch: nothing in or out (real TCP timeouts)."""
        run(["ip", "-n", self.switch, "link", "set", f"v-{host}", "down"])
        self._isolated.add(host)

    def drop(self, receiver: str, sender: str) -> None:
        """Nothing `sender` sends arrives at `receiver` (one way)."""
        if self.iptables:
            run(
                [*self.exec_prefix(receiver), "iptables", "-A", "INPUT", "-s",
                 self.address(sender), "-j", "DROP"]
            )
        else:
            run(
                ["ip", "-n", self.namespace(sender), "neigh", "replace", self.address(receiver),
                 "lladdr", NOWHERE_MAC, "nud", "permanent", "dev", "eth0"]
            )
        self._drops.add((receiver, sender))

    def heal(self) -> None:
        for host in sorted(self._isolated):
            run(["ip", "-n", self.switch, "link", "set", f"v-{host}", "up"], check=False)
        self._isolated.clear()
        for receiver, sender in sorted(self._drops):
            if self.iptables:
                run(
                    [*self.exec_prefix(receiver), "iptables", "-D", "INPUT", "-s",
                     self.address(sender), "-j", "DROP"],
                    check=False,
                )
            else:
                run(
                    ["ip", "-n", self.namespace(sender), "neigh", "del",
                     self.address(receiver), "dev", "eth0"],
                    check=False,
                )
        self._drops.clear()

    def close(self) -> None:
        """Remove every namespace this object made (processes in them must be gone first;
        any left are killed by pid). Idempotent."""
        if self.entered:
            self.leave()
        for name in reversed(self.created):
            _remove(name)
        self.created.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # the slot is free again
            self._lock_fd = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)


# -- the loopback relay (fallback) ---------------------------------------------------------


def _free(port: int, taken: set[int]) -> bool:
    if port in taken:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_ports(count: int, low: int, high: int, taken: set[int]) -> list[int]:
    """`count` free ports in [low, high], ascending (5-digit ports sort as strings too)."""
    rng = random.SystemRandom()
    chosen: list[int] = []
    for _ in range(50 * count):
        if len(chosen) == count:
            break
        port = rng.randint(low, high)
        if _free(port, taken | set(chosen)):
            chosen.append(port)
    if len(chosen) < count:
        raise NetError(f"found only {len(chosen)} free ports in [{low}, {high}]")
    taken.update(chosen)
    return sorted(chosen)


class _Pipe:
    def __init__(self, pair: tuple[str, str], client: socket.socket) -> None:
        self.pair = pair  # (initiator, acceptor)
        self.client = client
        self.upstream: socket.socket | None = None
        self.discarded = False


class Relay:
    """TCP relays for the Raft connections of loopback nodes; see the module docstring."""

    kind = "relay"
    source_host: str | None = None  # where upstream connections leave from (None: any)

    def __init__(self) -> None:
        self.targets: dict[int, tuple[tuple[str, str], tuple[str, int]]] = {}
        self.listeners: list[socket.socket] = []
        self.pipes: list[_Pipe] = []
        self.cut: set[tuple[str, str]] = set()  # (sender, receiver): bytes not forwarded
        self.selector = selectors.DefaultSelector()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        atexit.register(self.close)

    def add(self, initiator: str, acceptor: str, target: tuple[str, int], port: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(16)
        sock.setblocking(False)
        self.listeners.append(sock)
        self.targets[port] = ((initiator, acceptor), target)
        self.selector.register(sock, selectors.EVENT_READ, ("listen", port))

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="chaos-relay", daemon=True)
        self.thread.start()

    def isolate(self, host: str) -> None:
        with self.lock:
            for (a, b), _ in self.targets.values():
                if host in (a, b):
                    self.cut |= {(a, b), (b, a)}
            self._close_cut_pipes()

    def drop(self, receiver: str, sender: str) -> None:
        with self.lock:
            self.cut.add((sender, receiver))

    def heal(self) -> None:
        with self.lock:
            self.cut.clear()
            for pipe in list(self.pipes):
                if pipe.discarded or pipe.upstream is None:
                    self._close(pipe)  # a stream with a hole in it: start afresh

    def _close_cut_pipes(self) -> None:
        for pipe in list(self.pipes):
            a, b = pipe.pair
            if (a, b) in self.cut and (b, a) in self.cut:
                self._close(pipe)

    def _close(self, pipe: _Pipe) -> None:
        for sock in (pipe.client, pipe.upstream):
            if sock is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(sock)
            sock.close()
        with contextlib.suppress(ValueError):
            self.pipes.remove(pipe)

    def _loop(self) -> None:
        while not self.stopping.is_set():
            events = self.selector.select(timeout=0.1)
            with self.lock:
                for key, _ in events:
                    role, item = key.data
                    try:
                        if role == "listen":
                            self._accept(key.fileobj, item)  # type: ignore[arg-type]
                        else:
                            self._forward(key.fileobj, *item)  # type: ignore[arg-type]
                    except OSError:
                        if role != "listen":
                            self._close(item[0])
                self._connect_held()

    def _accept(self, listener: socket.socket, port: int) -> None:
        client, _ = listener.accept()
        client.setblocking(False)
        pair, _target = self.targets[port]
        pipe = _Pipe(pair, client)
        pipe.target = _target  # type: ignore[attr-defined]
        self.pipes.append(pipe)  # registered for reading once it is connected upstream

    def _connect_held(self) -> None:
        """Connect upstream every pipe whose pair is not cut (held while it was)."""
        for pipe in list(self.pipes):
            a, b = pipe.pair
            if pipe.upstream is not None or (a, b) in self.cut or (b, a) in self.cut:
                continue
            source = None if self.source_host is None else (self.source_host, 0)
            try:
                upstream = socket.create_connection(
                    pipe.target, timeout=1.0, source_address=source)  # type: ignore[attr-defined]
            except OSError:
                self._close(pipe)
                continue
            upstream.setblocking(False)
            pipe.upstream = upstream
            self._connected(pipe, upstream)

    def _connected(self, pipe: _Pipe, upstream: socket.socket) -> None:
        """Both ends of a pipe are open: read from them."""
        self.selector.register(pipe.client, selectors.EVENT_READ, ("data", (pipe, "up")))
        self.selector.register(upstream, selectors.EVENT_READ, ("data", (pipe, "down")))

    def _forward(self, sock: socket.socket, pipe: _Pipe, direction: str) -> None:
        assert pipe.upstream is not None
        data = sock.recv(65536)
        if not data:
            self._close(pipe)
            return
        a, b = pipe.pair
        sender, receiver, out = (a, b, pipe.upstream) if direction == "up" else (b, a, pipe.client)
        if (sender, receiver) in self.cut:
            pipe.discarded = True
            return
        out.setblocking(True)
        out.settimeout(2.0)
        out.sendall(data)
        out.setblocking(False)

    def close(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=2)
        with self.lock:
            for pipe in list(self.pipes):
                self._close(pipe)
            for sock in self.listeners:
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(sock)
                sock.close()
            self.listeners.clear()
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)


def wait_gone(pids: Sequence[int], timeout_s: float = 5.0) -> None:
    """Wait (bounded) until the given processes no longer exist."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return
        time.sleep(0.05)
