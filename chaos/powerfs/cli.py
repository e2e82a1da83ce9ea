"""The `powerfs` command (also `python -m raftcron.chaos.powerfs`).

    powerfs mount BACKING_DIR MOUNTPOINT [--control SOCKET] [--drop-on-exit]
                  [--dirty-bytes-max N] [--parent-pid PID]
    powerfs cut MOUNTPOINT [--torn] [--seed N]
    powerfs sync MOUNTPOINT
    powerfs status MOUNTPOINT
    powerfs faults MOUNTPOINT [--fsync-delay S] [--fsync-jitter S] [--fsync-errno EIO]
                  [--write-errno EIO] [--read-errno EIO] [--read-only] [--paths GLOB]
    powerfs unmount MOUNTPOINT

`mount` runs the daemon in the foreground until it is unmounted or signalled. The others talk
to the daemon of MOUNTPOINT through its control socket (`--control` if the daemon was given
one) and print its JSON answer. Exit status: 0 done, 1 failed, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from raftcron.chaos.powerfs import control


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="powerfs", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    mount = commands.add_parser("mount", help="serve BACKING_DIR at MOUNTPOINT (foreground)")
    mount.add_argument("backing")
    mount.add_argument("mountpoint")
    mount.add_argument("--control", help="control socket path (default: derived from MOUNTPOINT)")
    mount.add_argument("--drop-on-exit", action="store_true",
                       help="a clean unmount drops pending changes instead of syncing them")
    mount.add_argument("--dirty-bytes-max", type=int, default=None,
                       help="unsynced bytes held in memory before writes fail with ENOSPC")
    mount.add_argument("--parent-pid", type=int, default=None,
                       help="unmount (cleanly) when this process is gone")
    cut = commands.add_parser("cut", help="power cut: drop every change not made durable")
    cut.add_argument("mountpoint")
    cut.add_argument("--torn", action="store_true",
                     help="the last unsynced write of each file persists in part (a prefix)")
    cut.add_argument("--seed", type=int, default=0, help="picks the torn prefixes (default 0)")
    for name, text in (("sync", "make every pending change durable"),
                       ("status", "what is pending"), ("unmount", "unmount (lazily if busy)")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("mountpoint")
    faults = commands.add_parser(
        "faults", help="make the disk sick (faults.py); with no option, healthy again")
    faults.add_argument("mountpoint")
    faults.add_argument("--fsync-delay", type=float, help="seconds every fsync sleeps first")
    faults.add_argument("--fsync-jitter", type=float, help="+- seconds around the delay")
    faults.add_argument("--fsync-errno", help="fsync fails with it (e.g. EIO): its data is lost")
    faults.add_argument("--write-errno", help="writes fail with it")
    faults.add_argument("--read-errno", help="reads fail with it")
    faults.add_argument("--read-only", action="store_true", help="changes fail with EROFS")
    faults.add_argument("--paths", help="glob relative to the mount (default: every file)")
    for sub in (cut, faults, *(commands.choices[n] for n in ("sync", "status"))):
        sub.add_argument("--control", help="control socket path (default: derived)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.command == "mount":
        return _mount(args)
    if args.command == "unmount":
        from raftcron.chaos.powerfs.harness import PowerFSError, unmount

        try:
            print(json.dumps({"ok": True, "was_mounted": unmount(args.mountpoint)}))
        except PowerFSError as error:
            print(f"powerfs: {error}", file=sys.stderr)
            return 1
        return 0
    message: dict[str, object] = {"op": args.command}
    if args.command == "cut":
        message.update(torn=args.torn, seed=args.seed)
    if args.command == "faults":
        given = {"fsync_delay_s": args.fsync_delay, "fsync_jitter_s": args.fsync_jitter,
                 "fsync_errno": args.fsync_errno, "write_errno": args.write_errno,
                 "read_errno": args.read_errno, "read_only": args.read_only or None,
                 "paths": args.paths}
        message.update({k: v for k, v in given.items() if v is not None})
    try:
        reply = control.request(args.control or control.socket_path_for(args.mountpoint), message)
    except control.ControlError as error:
        print(f"powerfs: {error}", file=sys.stderr)
        return 1
    print(json.dumps(reply, sort_keys=True))
    return 0


def _mount(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s powerfs %(levelname)s %(message)s")
    from raftcron.chaos.powerfs.daemon import SetupError, serve
    from raftcron.chaos.powerfs.volume import DIRTY_BYTES_MAX_DEFAULT

    try:
        serve(
            args.backing, args.mountpoint, control_path=args.control,
            sync_on_exit=not args.drop_on_exit,
            dirty_bytes_max=args.dirty_bytes_max or DIRTY_BYTES_MAX_DEFAULT,
            parent_pid=args.parent_pid,
        )
    except SetupError as error:
        print(f"powerfs: {error}", file=sys.stderr)
        return 2
    return 0
