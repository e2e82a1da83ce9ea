"""powerfs: a FUSE filesystem that forgets what was not fsynced, to simulate a power loss.

What Jepsen's LazyFS does, in Python, for the chaos suite's power-loss nemesis (CHAOS.md, wave 2;
DESIGN.md §8.1). `python -m chaos.powerfs mount BACKING_DIR MOUNTPOINT` shows BACKING_DIR at
MOUNTPOINT. Processes on the mount see every change at once, as with a page cache, but
BACKING_DIR (the "disk") only receives what was made durable: fsync/fdatasync of a file makes its
content and size durable, fsync of a directory makes its entries (creates, renames, unlinks)
durable. `python -m chaos.powerfs cut MOUNTPOINT [--torn --seed N]` is the power cut: every
change not made durable is dropped, and with `--torn` the last unsynced write of each file
reaches the disk only in part (a prefix).

The model (chosen over a second shadow directory because renames and unlinks of open files
need inode identity, which paths alone do not have): an in-memory inode table holds both the
live and the durable namespace (`tree.py`); a file's live content is its durable bytes on disk
overlaid by dirty 4 KiB pages in memory (`pages.py`); BACKING_DIR is changed only by syncs and
always equals the durable namespace (`disk.py`); `volume.py` applies the POSIX operations and the
cut; `fuse_ops.py` maps FUSE callbacks (mfusepy over libfuse3, `binding.py`) onto it;
`control.py` is the unix socket the `cut`/`status`/`sync` commands use; `daemon.py` runs it all;
`harness.py` starts and stops daemons for tests and the chaos suite; `cli.py` is the command.

After a cut, the mount serves the durable state; handles opened before it fail with EIO on every
operation that reaches the daemon (reads the kernel still caches may return old bytes until the
cache is invalidated, which the cut requests for every known path).
"""
