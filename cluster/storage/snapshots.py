"""Snapshots: checksummed files, written off the Raft thread, made current by the node itself.

The file (``snapshot``): a fixed header (magic, format version, the index and term of the last
entry it covers, the body's length and crc32, the header's own crc32) and a zlib body holding
msgpack ``{"cluster_name", "prev", "last", "cluster", "state", "members"}``: the name of the
cluster whose node wrote it (`[cluster] name`; the body's first key, so that a file's first
bytes tell it without the state being decompressed: `cluster_name_in`), the two log entries
PySyncObj keeps at the start of a compacted log, the voters (Raft addresses) as of its last
entry, the state machine's own snapshot bytes and its member book
(cluster/membership/book.py). The name and the book are absent from snapshots written before
them, which load as an unknown name (None) and an empty book: a new key that older releases
ignore needs no new format version.

Rules this module keeps (DESIGN.md §8.1; research/audit-wave2.md finding 1, S1, S2):
- A snapshot is written to ``snapshot.<index>.tmp`` by a forked child (a copy-on-write image
  of the state, so the Raft thread does not stall), fsynced, and the child exits. Only the
  node process renames it over ``snapshot`` and syncs the folder, and only when it covers more
  than the current one; PySyncObj compacts the log after that, never before. Both syncs happen
  in either durability mode: the compaction deletes log segments (one sync per snapshot), and
  an unsynced snapshot renamed into place left a node that could not start after a power loss.
- The child never outlives the node: it asks the kernel for SIGKILL when its parent dies
  (PR_SET_PDEATHSIG), checks the parent is still there, and takes default signal handlers
  (asyncio's would make it ignore SIGTERM).
- A snapshot received from the leader is checked whole (header, length, checksum) before it
  replaces the current one; one that does not check out is not installed and not acknowledged,
  nor one older than the current one or the current one itself (same index and term).
- Nothing is swallowed: a current snapshot that does not load is `LogDamaged`.
- A transfer to a follower is a stream of chunks, each naming the snapshot (index, term), its
  offset and the total: a chunk that does not continue what was received (one lost with a
  dropped connection, or from another transfer) ends that transfer, and the leader sends the
  snapshot again from the start; it never becomes part of another one. The follower tells the
  leader of each chunk (`on_chunk`): PySyncObj's follower is otherwise silent for the whole
  transfer, and a leader that hears nothing for `connection_timeout_s` drops the connection
  (with the chunks in its send buffer) — a 22 MB snapshot on a busy machine never arrived.

Implements the interface PySyncObj expects of its ``Serializer`` (checkSerializing, serialize,
deserialize, getTransmissionData, setTransmissionData, cancelTransmisstion).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import resource
import signal
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import msgpack
from pysyncobj.config import SERIALIZER_STATE

from raftcron.cluster.storage import compress
from raftcron.cluster.storage.disk import Disk, OsDisk
from raftcron.cluster.storage.raftlog import LogDamaged, StorageUnavailable

log = logging.getLogger("raftcron.storage")

SNAPSHOT_NAME = "snapshot"
MAGIC = b"raftcron-snapshot\x00\x00\x00"
FORMAT_VERSION = 1
_HEAD = struct.Struct("<20sIQQQI")  # magic, version, index, term, body bytes, body crc32
_HEAD_CRC = struct.Struct("<I")
HEADER_BYTES = _HEAD.size + _HEAD_CRC.size
CHUNK_BYTES = 1 << 20
NAME_PREFIX_BYTES = 256  # decompressed bytes that hold the body's map header and first key
INFLATE_INPUT_BYTES = 64 << 10  # compressed bytes given to zlib at a time (decode)
INFLATE_PIECE_BYTES = 1 << 20  # decompressed bytes taken from it at a time
_CHUNK_HEAD = struct.Struct("<QQQQ")  # snapshot index, term, offset of this chunk, total bytes
PR_SET_PDEATHSIG = 1
WRITER_REAP_S = 2.0  # how long a stop waits for the killed snapshot writer to be gone

LogEntry = tuple[bytes, int, int]  # PySyncObj's (command, index, term)


class SnapshotSource(Protocol):
    """The state machine: its snapshot bytes, and loading them back."""

    def snapshot_bytes(self) -> bytes: ...
    def load_snapshot(self, blob: bytes | bytearray) -> None: ...


@dataclass(frozen=True)
class Snapshot:
    index: int
    term: int
    prev: LogEntry
    last: LogEntry
    cluster: list[str]
    state: bytes | bytearray  # a bytearray as decoded: filled as it was decompressed
    members: Any = None  # the member book, as the source's snapshot_members() gave it
    cluster_name: str | None = None  # None: written before cluster names


def encode(snapshot_index: int, term: int, body: dict[str, Any]) -> Iterator[bytes]:
    """The file's bytes: the header, then the compressed body (`compress`: the msgpack of
    `body`, compressed in parts as it is produced; its "state" may be `compress.Pieces`)."""
    compressed = compress.compress_body(body)
    head = _HEAD.pack(MAGIC, FORMAT_VERSION, snapshot_index, term, len(compressed),
                      zlib.crc32(compressed))
    yield head + _HEAD_CRC.pack(zlib.crc32(head))
    for start in range(0, len(compressed), CHUNK_BYTES):
        yield compressed[start:start + CHUNK_BYTES]


def read_header(data: bytes, path: str) -> tuple[int, int, int, int]:
    """(index, term, body bytes, body crc32) of a snapshot file's header."""
    if len(data) < HEADER_BYTES:
        raise LogDamaged(path, f"is {len(data)} bytes, shorter than a snapshot header")
    head = data[:_HEAD.size]
    (crc,) = _HEAD_CRC.unpack_from(data, _HEAD.size)
    magic, version, index, term, size, body_crc = _HEAD.unpack(head)
    if magic != MAGIC:
        raise LogDamaged(path, "is not a raftcron snapshot (wrong magic)")
    if zlib.crc32(head) != crc:
        raise LogDamaged(path, "has a snapshot header whose checksum does not match")
    if version != FORMAT_VERSION:
        raise LogDamaged(path, f"is snapshot format version {version}; this release reads "
                               f"version {FORMAT_VERSION}")
    return index, term, size, body_crc


def check(data: bytes, path: str) -> tuple[int, int]:
    """(index, term) of a whole snapshot file whose header and body check out."""
    index, term, size, body_crc = read_header(data, path)
    body = memoryview(data)[HEADER_BYTES:]
    if len(body) != size:
        raise LogDamaged(path, f"holds {len(body)} bytes of snapshot body, its header says {size}")
    if zlib.crc32(body) != body_crc:
        raise LogDamaged(path, "has a snapshot body whose checksum does not match")
    return index, term


def decode(data: bytes, path: str) -> Snapshot:
    index, term = check(data, path)
    try:
        fields = _inflate_body(memoryview(data)[HEADER_BYTES:])
        prev, last = _entry(fields["prev"]), _entry(fields["last"])
        cluster, state = [str(member) for member in fields["cluster"]], fields["state"]
        if not isinstance(state, bytearray):
            state = bytes(state)
        members = fields.get("members")
        cluster_name = fields.get("cluster_name")
        if cluster_name is not None and not isinstance(cluster_name, str):
            raise TypeError(f"cluster_name is {type(cluster_name).__name__}, not a string")
    except (ValueError, KeyError, TypeError, zlib.error, msgpack.UnpackException) as error:
        raise LogDamaged(path, f"has a snapshot body that does not decode ({error})") from None
    if last[1] != index or last[2] != term or prev[1] != index - 1:
        raise LogDamaged(path, f"says index {index} term {term}, its entries say otherwise")
    return Snapshot(index, term, prev, last, cluster, state, members, cluster_name)


def _inflated(compressed: memoryview) -> Iterator[bytes]:
    """The decompressed zlib stream in pieces of at most `INFLATE_PIECE_BYTES`."""
    inflater = zlib.decompressobj()
    for start in range(0, len(compressed), INFLATE_INPUT_BYTES):
        pending: bytes | memoryview = compressed[start:start + INFLATE_INPUT_BYTES]
        while pending and not inflater.eof:
            piece = inflater.decompress(pending, INFLATE_PIECE_BYTES)
            pending = inflater.unconsumed_tail
            if piece:
                yield piece
    if not inflater.eof and (piece := inflater.flush()):
        yield piece  # what the last input left pending
    if not inflater.eof:
        raise zlib.error("incomplete or truncated stream")


def _inflate_body(compressed: memoryview) -> dict[str, Any]:
    """The body's fields, its "state" a bytearray filled as it is decompressed. Decompressing
    the body whole and unpacking it held the state's bytes twice over (zlib's output in blocks
    and then joined, the body and then msgpack's copy of the state out of it): 2.1 times its
    size at the peak, beside the state a follower installing it still has. What comes before
    and after the state is small."""
    pieces = _inflated(compressed)
    head = bytearray()
    found = None
    for piece in pieces:
        head += piece
        found = _state_in(head)
        if found is not None:
            break
    if found is None:  # no state to stream (damage, or an empty one): as it is
        return dict(msgpack.unpackb(bytes(head), raw=False))
    fields, start, size, left = found
    state = bytearray(size)
    have = min(size, len(head) - start)
    state[:have] = head[start:start + have]
    rest = bytearray(head[start + have:])
    del head
    for piece in pieces:
        take = min(size - have, len(piece))
        state[have:have + take] = memoryview(piece)[:take]
        have += take
        rest += piece[take:]
    if have < size:
        raise ValueError("the snapshot's state ends early")
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(rest), 1 << 20))
    unpacker.feed(rest)
    try:
        for _ in range(left):
            key = unpacker.unpack()
            fields[key] = unpacker.unpack()
    except msgpack.OutOfData:
        raise ValueError("the snapshot's body ends early") from None
    if unpacker.tell() != len(rest):
        raise ValueError("the snapshot's body has bytes after its last field")
    fields["state"] = state
    return fields


_BIN_HEADERS = {0xC4: 1, 0xC5: 2, 0xC6: 4}  # msgpack's bin 8, 16, 32: bytes of the length


def _state_in(head: bytearray) -> tuple[dict[str, Any], int, int, int] | None:
    """If `head` reaches the state's bytes: the fields before it, where its bytes start, their
    length, how many fields follow; None while more is needed (or there is no state bin)."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(head), 1 << 20))
    unpacker.feed(head)
    fields: dict[str, Any] = {}
    try:
        count = unpacker.read_map_header()
        for number in range(count):
            key = unpacker.unpack()
            at = unpacker.tell()
            width = _BIN_HEADERS.get(head[at]) if at < len(head) else None
            if key == "state" and width is not None and at + 1 + width <= len(head):
                size = int.from_bytes(head[at + 1:at + 1 + width], "big")
                return fields, at + 1 + width, size, count - number - 1
            fields[key] = unpacker.unpack()
    except msgpack.OutOfData:
        return None
    return None


def cluster_name_in(data: bytes) -> str | None:
    """The cluster name of a snapshot file from its first bytes (at least its header and a
    few hundred more), without reading the rest; None when the body does not begin with one
    (written before cluster names) or those bytes do not decode (`check` says why)."""
    try:
        prefix = zlib.decompressobj().decompress(memoryview(data)[HEADER_BYTES:],
                                                 NAME_PREFIX_BYTES)
        unpacker = msgpack.Unpacker(raw=False)
        unpacker.feed(prefix)
        unpacker.read_map_header()
        if unpacker.unpack() != "cluster_name":
            return None
        name = unpacker.unpack()
    except (zlib.error, ValueError, msgpack.UnpackException):
        return None
    return name if isinstance(name, str) else None


def _entry(value: Any) -> LogEntry:
    command, index, term = value
    return bytes(command), int(index), int(term)


def _prepare_child(parent_pid: int, close_fds: list[int]) -> None:
    """In a freshly forked child: die with the parent, default signals, no shared lock."""
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    for fd in close_fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class SnapshotStore:
    def __init__(self, directory: str, source: SnapshotSource, *, durable: bool = True,
                 fork: bool = True, disk: Disk | None = None,
                 inherited_fds: Callable[[], list[int]] | None = None,
                 cluster_name: str | None = None) -> None:
        self.directory = directory
        self.cluster_name = cluster_name  # written into every snapshot this node makes
        self.source = source
        self.durable = durable  # the log's mode; a snapshot is synced in either (see above)
        self.fork = fork
        self.disk: Disk = disk or OsDisk()
        self.inherited_fds = inherited_fds or (lambda: [])
        self.path = os.path.join(directory, SNAPSHOT_NAME)
        self.current: Snapshot | None = None
        self._pending_load: Snapshot | None = None
        self._child_pid = 0
        self._child_path = ""
        self._child_meta: tuple[LogEntry, LogEntry, list[str]] = ((b"", 0, 0), (b"", 0, 0), [])
        self._child_id: int | None = None
        self._inline_done: tuple[int, int | None] | None = None  # (state, id) when fork=False
        self._started = 0.0  # when the snapshot being written began (time.monotonic)
        self._outgoing: dict[Any, tuple[bytes, int, int, int]] = {}  # data, sent, index, term
        # (index, term, total, chunks, bytes received) of the transfer being received
        self._incoming: tuple[int, int, int, list[bytes], int] | None = None
        self.on_chunk: Callable[[int], None] | None = None  # set by the hooks: tell the leader
        # The voters as of an index, from the voters now (set by RaftStorage: PySyncObj hands
        # over its current configuration, which may hold changes after the snapshot's index).
        self.cluster_at: Callable[[list[str], int], list[str]] | None = None
        # Whether a snapshot at this index may become current: the node's archive has made
        # durable every job the entries up to it removed (cluster/archive/writer.py). A written
        # snapshot waits here until it may; the log it would cover stays until then.
        self.may_cover: Callable[[int], bool] = lambda index: True
        self._awaiting_cover = False
        self._load()

    def _load(self) -> None:
        for name in self.disk.listdir(self.directory):
            if name.startswith(SNAPSHOT_NAME + ".") and name.endswith(".tmp"):
                self.disk.unlink(os.path.join(self.directory, name))  # never made current
        if self.disk.exists(self.path):
            self.current = decode(self.disk.read(self.path), self.path)
            self._pending_load = self.current

    # --- PySyncObj's Serializer interface --------------------------------------------------

    def checkSerializing(self) -> tuple[int, int | None]:
        if self._awaiting_cover:
            if not self.may_cover(self._child_meta[0][1]):
                return SERIALIZER_STATE.SERIALIZING, self._child_id
            self._awaiting_cover = False
            return self._adopt(self._child_path, self._child_meta, self._child_id)
        if self._inline_done is not None:
            state, done_id = self._inline_done
            self._inline_done = None
            return state, done_id
        if not self._child_pid:
            return SERIALIZER_STATE.NOT_SERIALIZING, None
        try:
            pid, status = os.waitpid(self._child_pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = self._child_pid, -1
        if pid == 0:
            return SERIALIZER_STATE.SERIALIZING, self._child_id
        self._child_pid = 0
        if status != 0:
            log.error("snapshot writer failed", extra={"action": "snapshot_failed",
                                                       "status": status})
            self._discard(self._child_path)
            return SERIALIZER_STATE.FAILED, self._child_id
        if not self.may_cover(self._child_meta[0][1]):
            self._awaiting_cover = True
            return SERIALIZER_STATE.SERIALIZING, self._child_id
        return self._adopt(self._child_path, self._child_meta, self._child_id)

    def serialize(self, data: Any, serialize_id: int) -> None:
        if self._child_pid or self._inline_done is not None or self._awaiting_cover:
            return
        last, prev, cluster = _entry(data[1]), _entry(data[2]), sorted(
            str(getattr(node, "id", node)) for node in data[3])
        if self.cluster_at is not None:
            cluster = self.cluster_at(cluster, last[1])
        path = os.path.join(self.directory, f"{SNAPSHOT_NAME}.{last[1]}.tmp")
        self._started = time.monotonic()
        if not self.fork:
            try:
                self._write(path, last, prev, cluster)
            except OSError as error:
                log.error("snapshot write failed: %s", error, extra={"action": "snapshot_failed"})
                self._discard(path)
                self._inline_done = (SERIALIZER_STATE.FAILED, serialize_id)
                return
            if not self.may_cover(last[1]):
                self._child_path, self._child_meta = path, (last, prev, cluster)
                self._child_id, self._awaiting_cover = serialize_id, True
                return
            self._inline_done = self._adopt(path, (last, prev, cluster), serialize_id)
            return
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: write, sync, exit; never return into the node's code
            code = 1
            try:
                _prepare_child(parent, self.inherited_fds())
                self._write(path, last, prev, cluster)
                code = 0
            finally:
                os._exit(code)
        self._child_pid, self._child_path = pid, path
        self._child_meta, self._child_id = (last, prev, cluster), serialize_id
        self._started = time.monotonic()

    def deserialize(self) -> tuple[Any, LogEntry, LogEntry, list[str]]:
        """What PySyncObj loads: the state is given to the source here, once per snapshot."""
        snapshot = self.current
        if snapshot is None:
            raise LogDamaged(self.path, "is missing")
        if self._pending_load is snapshot:
            self._pending_load = None
            self.source.load_snapshot(snapshot.state)
            load_members = getattr(self.source, "load_members", None)
            if load_members is not None:
                load_members(snapshot.members)
            # Loaded, the decoded state is garbage (hundreds of MB at a million retained jobs,
            # kept for as long as the node ran); what stays current is the index and entries.
            self.current = replace(snapshot, state=b"")
        return None, snapshot.last, snapshot.prev, snapshot.cluster

    def getTransmissionData(self, node: Any) -> tuple[bytes, bool, bool] | None:
        if self._child_pid or self.current is None:
            return None
        sending = self._outgoing.get(node)
        if sending is None:
            data = self._file_to_send()
            index, term, _, _ = read_header(data, self.path)
            sending = (data, 0, index, term)
        data, sent, index, term = sending
        chunk = data[sent:sent + CHUNK_BYTES]
        first, last = sent == 0, not chunk
        if last:
            self._outgoing.pop(node, None)
        else:
            self._outgoing[node] = (data, sent + len(chunk), index, term)
        return _CHUNK_HEAD.pack(index, term, sent, len(data)) + chunk, first, last

    def _file_to_send(self) -> bytes:
        """The current snapshot file's bytes: those of a transfer under way when it sends the
        same snapshot (followers behind at once share one copy, not one each), else read."""
        current = self.current
        assert current is not None
        for data, _, index, term in self._outgoing.values():
            if (index, term) == (current.index, current.term):
                return data
        return self.disk.read(self.path)

    def setTransmissionData(self, data: Any) -> bool:
        """One chunk from the leader; True once a whole snapshot was received and installed."""
        try:
            framed, _, last = data
            index, term, offset, total = _CHUNK_HEAD.unpack_from(framed)
            chunk = bytes(framed[_CHUNK_HEAD.size:])
        except (TypeError, ValueError, struct.error):
            self._incoming = None
            return False
        incoming = self._incoming
        if offset == 0:
            incoming = (index, term, total, [], 0)
        elif incoming is None or incoming[:3] != (index, term, total) or incoming[4] != offset:
            if incoming is not None:
                log.warning("snapshot transfer broken off: chunk at %d of %d, %s received; "
                            "the leader sends it again", offset, total,
                            incoming[4] if incoming[:3] == (index, term, total) else "none of it",
                            extra={"action": "snapshot_transfer_broken"})
            self._incoming = None
            return False
        chunks = incoming[3]
        chunks.append(chunk)
        received = incoming[4] + len(chunk)
        self._incoming = (index, term, total, chunks, received)
        if self.on_chunk is not None:
            self.on_chunk(received)
        if not last:
            return False
        self._incoming = None
        whole = b"".join(chunks)
        chunks.clear()  # not held a second time while the snapshot is decoded beside the state
        return self._install(whole)

    def cancelTransmisstion(self, node: Any) -> None:
        self._outgoing.pop(node, None)

    # --- internals -------------------------------------------------------------------------

    def _write(self, path: str, last: LogEntry, prev: LogEntry, cluster: list[str]) -> None:
        began = time.monotonic()
        # A source that gives its state in pieces (the node's state machine) has them
        # compressed as they come, never joined.
        pieces = getattr(self.source, "snapshot_pieces", None)
        state = compress.Pieces(pieces()) if pieces is not None else self.source.snapshot_bytes()
        body: dict[str, Any] = {} if self.cluster_name is None else {
            "cluster_name": self.cluster_name}  # first: see cluster_name_in
        body |= {"prev": list(prev), "last": list(last), "cluster": cluster, "state": state}
        members = getattr(self.source, "snapshot_members", None)
        if members is not None:
            body["members"] = members()
        chunks = list(encode(last[1], last[2], body))  # builds the state as it compresses it
        encoded = time.monotonic()
        self.disk.write_file(path, chunks, sync=True)
        # Where a slow snapshot's time went (in the writer: a forked child logs too; its
        # CPU time and page faults are its own since the fork, the node's when inline).
        usage = resource.getrusage(resource.RUSAGE_SELF)
        log.info("snapshot at index %d written: state built and compressed in %.2f s "
                 "(%d bytes), written and synced in %.2f s", last[1], encoded - began,
                 sum(map(len, chunks)), time.monotonic() - encoded,
                 extra={"action": "snapshot_encoded", "index": last[1],
                        "encode_s": round(encoded - began, 3),
                        "write_s": round(time.monotonic() - encoded, 3),
                        "user_s": round(usage.ru_utime, 3), "system_s": round(usage.ru_stime, 3),
                        "page_faults": usage.ru_minflt})

    def _adopt(self, path: str, meta: tuple[LogEntry, LogEntry, list[str]],
               serialize_id: int | None) -> tuple[int, int | None]:
        """Make a written snapshot current if it covers more than the current one."""
        last, prev, cluster = meta
        if self.current is not None and self.current.index >= last[1]:
            log.info("snapshot at %d dropped: %d is current", last[1], self.current.index,
                     extra={"action": "snapshot_superseded"})
            self._discard(path)
            return SERIALIZER_STATE.NOT_SERIALIZING, None
        try:
            data = self.disk.read(path)
            check(data, path)  # the checksum only: no decompression here
            self._make_current(path)
        except (OSError, LogDamaged) as error:
            log.error("snapshot not made current: %s", error, extra={"action": "snapshot_failed"})
            self._discard(path)
            return SERIALIZER_STATE.FAILED, serialize_id
        self.current = Snapshot(last[1], last[2], prev, last, cluster, b"",
                                cluster_name=self.cluster_name)
        took_s = round(time.monotonic() - self._started, 3)
        log.info("snapshot at index %d term %d is current (%d bytes, %.2f s since it began)",
                 last[1], last[2], len(data), took_s,
                 extra={"action": "snapshot_written", "index": last[1], "took_s": took_s})
        return SERIALIZER_STATE.SUCCESS, serialize_id

    def _install(self, received: bytes) -> bool:
        """A snapshot from the leader: checked whole, then current, then loaded by PySyncObj."""
        path = os.path.join(self.directory, f"{SNAPSHOT_NAME}.install.tmp")
        try:
            snapshot = decode(received, "the snapshot received from the leader")
        except LogDamaged as error:
            log.error("refused a snapshot from the leader: %s", error,
                      extra={"action": "snapshot_install_refused"})
            return False
        current = self.current
        if current is not None and (current.index > snapshot.index or (
                current.index, current.term) == (snapshot.index, snapshot.term)):
            # Raft installs the leader's snapshot unless this node holds its last entry: the
            # same index with another term is another history (a node that lost writes).
            log.warning("snapshot from the leader at %d (term %d) is not newer than %d (term "
                        "%d); not installed", snapshot.index, snapshot.term, current.index,
                        current.term, extra={"action": "snapshot_install_refused"})
            return False
        try:
            self.disk.write_file(path, [received], sync=True)
            self._make_current(path)
        except OSError as error:
            self._discard(path)
            raise StorageUnavailable(f"{self.path}: install failed: {error}") from error
        self.current = self._pending_load = snapshot
        log.info("installed the leader's snapshot at index %d", snapshot.index,
                 extra={"action": "snapshot_installed", "index": snapshot.index})
        return True

    def _make_current(self, path: str) -> None:
        self.disk.rename(path, self.path)
        self.disk.sync_dir(self.directory)

    def _discard(self, path: str) -> None:
        try:
            if path and self.disk.exists(path):
                self.disk.unlink(path)
        except OSError:
            pass

    def kill_writer(self, wait_s: float = WRITER_REAP_S) -> None:
        """On a clean stop: the writer's work is lost, never half-adopted.

        Killed, it can do nothing more (only the node renames a snapshot into place), so the
        stop waits for it only `wait_s`: a writer inside a long fsync on a busy disk dies when
        the call returns, and a stop must not wait for the disk on its behalf."""
        if not self._child_pid:
            return
        pid, self._child_pid = self._child_pid, 0
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + wait_s
        try:
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() >= deadline:
                    log.warning("snapshot writer %d killed but not yet gone after %.1f s (in "
                                "the kernel, a disk call); not waiting for it", pid, wait_s,
                                extra={"action": "snapshot_writer_lingers", "pid": pid})
                    break
                time.sleep(0.01)
        except ChildProcessError:
            pass
        self._discard(self._child_path)
