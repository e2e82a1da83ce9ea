"""powerfs: a FUSE filesystem that forgets what was not fsynced, to simulate a power loss.

What Jepsen's LazyFS does, in Python, for the chaos suite's power-loss nemesis (CHAOS.md, wave
2; DESIGN.md §8.1). `python -m raftcron.chaos.powerfs mount BACKING_DIR MOUNTPOINT` (or `powerfs
mount`) shows BACKING_DIR at MOUNTPOINT. Processes on the mount see every change at once, as
with a page cache, but BACKING_DIR (the "disk") only receives what was made durable:
fsync/fdatasync of a file makes its content, size, mode and times durable; fsync of a directory
makes its entries (creates, renames, unlinks, mkdirs in it) durable. `powerfs cut MOUNTPOINT
[--torn --seed N]` is the power cut: every change not made durable is dropped, and with `--torn`
the last unsynced write of each file reaches the disk only in part (a seeded prefix). From
Python, use `harness.PowerFS(backing, mountpoint)`: start, cut, sync, status, kill, stop.
`powerfs faults MOUNTPOINT --fsync-delay 2` (`PowerFS.set_faults`, `clear_faults`) makes the disk
sick at runtime: slow fsyncs, EIO on fsync (which loses the data, as Linux does), write or read,
read-only (`faults.py`).

The model (chosen over a second shadow directory because renames and unlinks of open files need
inode identity, which paths alone do not have): an in-memory inode table holds both the live and
the durable namespace (`tree.py`); a file's live content is its durable bytes on disk overlaid by
dirty 4 KiB pages in memory (`pages.py`); BACKING_DIR is changed only by syncs and always equals
the durable namespace (`disk.py`); `volume.py` applies the POSIX operations and the cut;
`power.py` tears writes and counts what is pending; `fuse_ops.py` maps FUSE callbacks (mfusepy
over libfuse3, `binding.py`) onto the volume; `control.py` is the unix socket the
`cut`/`status`/`sync` commands use; `daemon.py` runs it all; `harness.py` starts and stops
daemons for tests and the chaos suite; `cli.py` is the command.

The failure model is the worst case POSIX allows: no unsynced write reaches the disk on its own
(no background writeback), fsync of a file does not make its name durable (stricter than ext4,
whose journal usually commits the name with the data), and a name made durable before its file
was ever synced names an empty file. A file renamed across directories with only the destination
synced has both names after a cut (a hard link on disk); a directory has one durable name.

After a cut the mount serves the durable state. Handles opened before it belong to an old
generation: every operation on them that reaches the daemon fails with EIO, and a mapping made
before it raises SIGBUS when touched (the kernel's cached pages of every known path are dropped
at the cut). The intended use is that the cut also kills the processes, as a power loss does.
SIGKILL of the daemon is itself a cut (without tearing); a clean unmount or SIGTERM syncs
everything first unless `--drop-on-exit`.

Known limits:
- mmap: reads and shared writable mappings work; mapped writes reach the live view when the kernel
  writes the pages back (msync, munmap, close) and become durable with msync/fsync.
- Locks: flock and fcntl locks are kept by the kernel (no FUSE lock callbacks): right for
  processes on one machine.
- fstat, chmod, chown and utimes of an unlinked file that is still open fail with ESTALE
  (libfuse's high-level API finds files by path); read, write, fsync and ftruncate on it work.
- No xattrs (EOPNOTSUPP), no FIFOs, sockets or device nodes (EPERM; ones already in BACKING_DIR
  are not shown), no RENAME_EXCHANGE (EINVAL; RENAME_NOREPLACE works), no atime updates.
- sync(2) and syncfs(2) make nothing durable (FUSE does not pass them on): use fsync, or
  `powerfs sync`.
- Unsynced data lives in RAM, at most `--dirty-bytes-max` (2 GiB), then writes fail with ENOSPC.
- Every lookup and stat asks the daemon (timeouts 0, so a cut shows at once): about 0.1-0.3 ms
  per metadata operation; a pool of FUSE threads (a delayed fsync holds only its own).
- Nothing else may change BACKING_DIR while it is mounted; `.powerfs-orphans` in it is reserved
  (the stash of durable objects without a durable name, emptied at mount and at every cut).
"""
