"""powerfs's Volume (no FUSE) against a naive oracle of what a power cut may keep.

The oracle knows only the rule: a file's durable content is its live content at its last fsync,
a directory's durable entries are its live entries at its last fsync, and a cut makes the live
view the durable one (a name made durable before its file was ever synced names an empty file).
A failed fsync (chaos/powerfs/faults.py's fsync_errno) loses the pages written since the last
one: no later fsync writes them (the disk keeps what it had there, zeros past what was kept
after truncates), though reads see them until a cut; a write into such a page makes it whole
again. The oracle tracks the pages written since the last fsync and the lost ones for that.
Hypothesis drives writes, truncates, renames (also across directories), unlinks, syncs and cuts
on a Volume over a temp dir, and after every step compares both the live view and BACKING_DIR
with the oracle.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from raftcron.chaos.powerfs.disk import STASH_NAME
from raftcron.chaos.powerfs.pages import PAGE_BYTES
from raftcron.chaos.powerfs.volume import Volume

DIRS = ["", "a"]
NAMES = ["x", "y"]
READ_ALL = 1 << 20

dirs = st.sampled_from(DIRS)
names = st.sampled_from(NAMES)
offsets = st.integers(0, 64) | st.integers(0, 3 * PAGE_BYTES)
lengths = st.integers(0, 64) | st.integers(0, 3 * PAGE_BYTES)
payloads = st.binary(min_size=1, max_size=PAGE_BYTES + 10).map(lambda b: b.replace(b"\0", b"*"))


def path_of(directory: str, name: str = "") -> str:
    return "/" + "/".join(part for part in (directory, name) if part)


class VolumeAgainstOracle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.backing = tempfile.mkdtemp(prefix="powerfs-model-")
        for directory in DIRS[1:]:
            os.mkdir(os.path.join(self.backing, directory))
        self.volume = Volume(self.backing)
        self.next_id = 0
        self.live_content: dict[int, bytearray] = {}
        self.durable_content: dict[int, bytes] = {}
        self.live: dict[str, dict[str, int]] = {d: {} for d in DIRS}
        self.durable: dict[str, dict[str, int]] = {d: {} for d in DIRS}
        # per file since its last good fsync: pages written, pages a failed fsync lost, and
        # how much of its durable content is still under the live one (truncates lower it)
        self.dirty_pages: dict[int, set[int]] = {}
        self.lost_pages: dict[int, set[int]] = {}
        self.base_len: dict[int, int] = {}

    def teardown(self) -> None:
        self.volume.close(sync=False)
        shutil.rmtree(self.backing)

    @rule(directory=dirs, name=names, offset=offsets, data=payloads)
    def write(self, directory: str, name: str, offset: int, data: bytes) -> None:
        fh = self.volume.create(path_of(directory, name), 0o644, os.O_RDWR, 0, 0)
        try:
            self.volume.write(fh, data, offset)
        finally:
            self.volume.release(fh)
        ino = self.live[directory].get(name)
        if ino is None:
            ino, self.next_id = self.next_id, self.next_id + 1
            self.live_content[ino] = bytearray()
            self.live[directory][name] = ino
        content = self.live_content[ino]
        if offset > len(content):
            content.extend(bytes(offset - len(content)))
        content[offset : offset + len(data)] = data
        pages = set(range(offset // PAGE_BYTES, (offset + len(data) - 1) // PAGE_BYTES + 1))
        self.dirty_pages.setdefault(ino, set()).update(pages)
        self.lost_pages.setdefault(ino, set()).difference_update(pages)

    @rule(directory=dirs, name=names, length=lengths)
    def truncate(self, directory: str, name: str, length: int) -> None:
        ino = self.live[directory].get(name)
        if ino is None:
            return
        self.volume.truncate(path_of(directory, name), length)
        content = self.live_content[ino]
        if length < len(content):
            self.base_len[ino] = min(self._base_len(ino), length)
            first_gone = -(-length // PAGE_BYTES)
            for pages in (self.dirty_pages, self.lost_pages):
                pages[ino] = {p for p in pages.get(ino, set()) if p < first_gone}
        del content[length:]
        content.extend(bytes(length - len(content)))

    @rule(directory=dirs, name=names, offset=offsets, data=payloads)
    def write_and_fsync(self, directory: str, name: str, offset: int, data: bytes) -> None:
        self.write(directory, name, offset, data)
        self.fsync_file(directory, name)

    @rule(directory=dirs, name=names, length=lengths, growth=st.integers(1, 2 * PAGE_BYTES))
    def shrink_then_grow(self, directory: str, name: str, length: int, growth: int) -> None:
        self.truncate(directory, name, length)
        self.truncate(directory, name, length + growth)

    @rule(directory=dirs, name=names)
    def fsync_file(self, directory: str, name: str) -> None:
        ino = self.live[directory].get(name)
        if ino is None:
            return
        fh = self.volume.open(path_of(directory, name), os.O_RDWR)
        try:
            self.volume.fsync(fh)
        finally:
            self.volume.release(fh)
        self._flushed(ino)

    @rule(directory=dirs, name=names)
    def failed_fsync(self, directory: str, name: str) -> None:
        ino = self.live[directory].get(name)
        if ino is None:
            return
        fh = self.volume.open(path_of(directory, name), os.O_RDWR)
        try:
            self.volume.fsync(fh, fail_errno=errno.EIO)
        except OSError as error:
            assert error.errno == errno.EIO
        else:
            raise AssertionError("a failed fsync returned")
        finally:
            self.volume.release(fh)
        self.lost_pages.setdefault(ino, set()).update(self.dirty_pages.pop(ino, set()))

    def _base_len(self, ino: int) -> int:
        return self.base_len.get(ino, len(self.durable_content.get(ino, b"")))

    def _flushed(self, ino: int) -> None:
        """A good fsync: the live content is durable, but for lost pages, where the disk
        keeps what it had below the base length and zeros above it."""
        live, old = self.live_content[ino], self.durable_content.get(ino, b"")
        base_len = self._base_len(ino)
        durable = bytearray(live)
        for page in self.lost_pages.get(ino, set()):
            for i in range(page * PAGE_BYTES, min((page + 1) * PAGE_BYTES, len(live))):
                durable[i] = old[i] if i < base_len else 0
        self.durable_content[ino] = bytes(durable)
        self.dirty_pages.pop(ino, None)
        self.base_len[ino] = len(live)

    @rule(directory=dirs)
    def fsync_dir(self, directory: str) -> None:
        fh = self.volume.opendir(path_of(directory))
        try:
            self.volume.fsync(fh)
        finally:
            self.volume.release(fh)
        self.durable[directory] = dict(self.live[directory])

    @rule()
    def sync_everything(self) -> None:
        """What a clean unmount (and the `sync` control command) does."""
        self.volume.sync_all()
        for directory, entries in self.live.items():
            self.durable[directory] = dict(entries)
            for ino in entries.values():
                self._flushed(ino)

    @rule(source_dir=dirs, source=names, dest_dir=dirs, dest=names)
    def rename(self, source_dir: str, source: str, dest_dir: str, dest: str) -> None:
        ino = self.live[source_dir].get(source)
        if ino is None or (source_dir, source) == (dest_dir, dest):
            return
        self.volume.rename(path_of(source_dir, source), path_of(dest_dir, dest))
        if self.live[dest_dir].get(dest) == ino:
            return  # two names of one file: rename does nothing
        del self.live[source_dir][source]
        self.live[dest_dir][dest] = ino

    @rule(directory=dirs, name=names)
    def unlink(self, directory: str, name: str) -> None:
        if self.live[directory].pop(name, None) is not None:
            self.volume.unlink(path_of(directory, name))

    @rule()
    def cut(self) -> None:
        self.volume.cut()
        self.live = {d: dict(entries) for d, entries in self.durable.items()}
        kept = {ino for entries in self.live.values() for ino in entries.values()}
        self.live_content = {i: bytearray(self.durable_content.get(i, b"")) for i in kept}
        self.durable_content = {i: c for i, c in self.durable_content.items() if i in kept}
        self.dirty_pages, self.lost_pages, self.base_len = {}, {}, {}

    @invariant()
    def backing_dir_is_the_durable_view(self) -> None:
        for directory in DIRS:
            on_disk = set(os.listdir(os.path.join(self.backing, directory))) - {STASH_NAME, *DIRS}
            assert on_disk == set(self.durable[directory]), directory
            for name, ino in self.durable[directory].items():
                with open(os.path.join(self.backing, directory, name), "rb") as f:
                    assert f.read() == self.durable_content.get(ino, b""), (directory, name)

    @invariant()
    def live_view_matches(self) -> None:
        for directory in DIRS:
            fh = self.volume.opendir(path_of(directory))
            try:
                listed = {n for n, _, _ in self.volume.readdir(fh)} - {".", "..", *DIRS}
            finally:
                self.volume.release(fh)
            assert listed == set(self.live[directory]), directory
            for name, ino in self.live[directory].items():
                fh = self.volume.open(path_of(directory, name), os.O_RDONLY)
                try:
                    data = self.volume.read(fh, READ_ALL, 0)
                finally:
                    self.volume.release(fh)
                assert data == bytes(self.live_content[ino]), (directory, name)
                size = self.volume.getattr(path_of(directory, name))["st_size"]
                assert size == len(self.live_content[ino])


VolumeAgainstOracle.TestCase.settings = settings(
    VolumeAgainstOracle.TestCase.settings, max_examples=300, stateful_step_count=40,
)
test_volume_keeps_exactly_what_was_synced = VolumeAgainstOracle.TestCase
