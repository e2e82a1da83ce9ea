"""`raftcron jobs export`: every job a search matches (the filters of `jobs list`, live and
archived alike), as JSON Lines for a warehouse, on standard output or into a file.

What it owns: following the search's cursor page after page until the last, the lines, the
file's rename at the end, and the progress on standard error.

Rules it keeps:
- A page is written whole before the cursor moves past it, and the next page is asked for
  below it. A page the cluster could not serve (a node restarting, a leader change) is asked
  again by the client, failing over, from the same cursor (cluster/clients/asyncclient.py): the
  export neither starts over nor repeats a line. Past `--deadline` it stops and says which
  `--cursor` continues it.
- One page in memory at a time, of `--page-size` jobs at most (the API's most by default).
- `--out FILE`: the lines go to FILE.partial, renamed FILE (synced, then the rename synced)
  once the last page is in, so a file named FILE is always a whole export. An export that
  stops leaves FILE.partial, if it holds anything, cut to the whole pages written (a write
  that failed may have put part of one), and says how many jobs it holds.
- A line is the job's view as `GET /v1/jobs` lists it, with `"archived"` always present
  (false for a live job), so every line has the same fields.

What it must not do: print anything but the lines on standard output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any

import orjson

from raftcron.cluster.clients.client import Client, RaftcronError
from raftcron.cluster.commandline.cliparts import UsageError
from raftcron.cluster.commandline.opsargs import search_filters
from raftcron.cluster.http.bounds import PAGE_MAX
from raftcron.cluster.storage.disk import OsDisk

FORMATS = ("jsonl",)
PROGRESS_S = 1.0  # at most one progress line on stderr this often
WHO = "raftcron jobs export"


@dataclass
class Position:
    """How far an export got: jobs written (in `bytes`), and the cursor the rest starts below
    (None: from the newest job); `done` once the last page is written."""

    jobs: int = 0
    cursor: int | None = None
    done: bool = False
    bytes: int = 0


class Progress:
    """Jobs written so far on stderr, at most once per PROGRESS_S, and a last line."""

    def __init__(self, stream: IO[str] | None, clock: Callable[[], float] = time.monotonic):
        self.stream = stream
        self.clock = clock
        self.started = clock()
        self.shown = self.started

    def page(self, jobs: int) -> None:
        now = self.clock()
        if self.stream is not None and now - self.shown >= PROGRESS_S:
            self.shown = now
            self.stream.write(f"{WHO}: {jobs} jobs so far ({now - self.started:.1f} s)\n")
            self.stream.flush()

    def end(self, text: str, after: str = "") -> None:
        if self.stream is not None:
            took_s = self.clock() - self.started
            self.stream.write(f"{WHO}: {text} in {took_s:.1f} s{after}\n")
            self.stream.flush()


def line(view: Mapping[str, Any]) -> bytes:
    """One job view as a line of JSON (UTF-8), with `archived` always present."""
    row = {**view, "archived": bool(view.get("archived"))}
    try:
        return orjson.dumps(row) + b"\n"
    except TypeError:  # an integer past 64 bits in a payload: json writes it as it is
        return json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def export_jobs(client: Client, filters: Mapping[str, Any], sink: IO[bytes], *,
                page_size: int, position: Position, progress: Progress) -> None:
    """Every job `filters` matches, below `position.cursor`, into `sink` page by page;
    `position` says how far it got whenever it stops (an error is raised as it came)."""
    while True:
        page = client.jobs(**filters, limit=page_size, cursor=position.cursor)
        cursor = page.get("next_cursor")
        if cursor is not None and position.cursor is not None and cursor >= position.cursor:
            # The pages go down the ids: a cursor that does not would repeat jobs forever.
            raise RaftcronError(f"the cluster answered next_cursor {cursor} for a page below "
                                f"{position.cursor}")
        lines = b"".join(line(view) for view in page["jobs"])
        sink.write(lines)
        sink.flush()
        position.bytes += len(lines)
        position.jobs += len(page["jobs"])
        position.cursor = cursor
        progress.page(position.jobs)
        if cursor is None:
            position.done = True
            return


def run(client: Client, args: argparse.Namespace) -> None:
    """`raftcron jobs export` (cluster/commandline/opsargs.py has its flags)."""
    if args.format not in FORMATS:
        raise UsageError(f"--format must be {' or '.join(FORMATS)} (the only format so far), "
                         f"not {args.format!r}")
    if not 1 <= args.page_size <= PAGE_MAX:
        raise UsageError(f"--page-size must be between 1 and {PAGE_MAX}, not {args.page_size}")
    if args.cursor is not None and args.cursor < 1:
        raise UsageError(f"--cursor must be a job id (1 or more), not {args.cursor}")
    filters = search_filters(args)
    position = Position(cursor=args.cursor)
    progress = Progress(None if args.quiet else sys.stderr)
    if args.out is None:
        _to_stdout(client, filters, args, position, progress)
    else:
        _to_file(client, filters, args, position, progress)


def _to_stdout(client: Client, filters: Mapping[str, Any], args: argparse.Namespace,
               position: Position, progress: Progress) -> None:
    try:
        export_jobs(client, filters, sys.stdout.buffer, page_size=args.page_size,
                    position=position, progress=progress)
    except BrokenPipeError:
        # The reader went away (`| head`): it has what it wanted. Python's own flush of
        # stdout at exit would fail again, so stdout goes nowhere from here.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        progress.end(f"{position.jobs} jobs", ", then standard output was closed")
        return
    except OSError as error:
        _say_where_to_resume(position, "")
        raise UsageError(f"cannot write standard output: {error}") from None
    except BaseException:
        _say_where_to_resume(position, "")
        raise
    progress.end(f"{position.jobs} jobs")


def _to_file(client: Client, filters: Mapping[str, Any], args: argparse.Namespace,
             position: Position, progress: Progress) -> None:
    out = os.path.abspath(args.out)
    partial = out + ".partial"
    try:
        sink = open(partial, "wb")  # noqa: SIM115 (closed below, before the rename)
    except OSError as error:
        raise UsageError(f"cannot write {partial}: {error.strerror}") from None
    try:
        with sink:
            export_jobs(client, filters, sink, page_size=args.page_size, position=position,
                        progress=progress)
            os.fsync(sink.fileno())
        os.replace(partial, out)
        OsDisk().sync_dir(os.path.dirname(out))  # the rename itself survives a power loss
    except BaseException as error:
        with contextlib.suppress(OSError):
            if position.jobs == 0 and not position.done:
                os.unlink(partial)
            elif not position.done:
                # A page whose write failed (the disk full) may be in part: the file keeps
                # the whole pages, which the cursor below continues exactly.
                os.truncate(partial, position.bytes)
        _say_where_to_resume(position, f" ({partial} holds them)")
        if isinstance(error, OSError):
            raise UsageError(f"cannot write {partial}: {error}") from None
        raise
    progress.end(f"{position.jobs} jobs", f" -> {out}")


def _say_where_to_resume(position: Position, where: str) -> None:
    if position.done or position.jobs == 0:
        return
    print(f"{WHO}: stopped after {position.jobs} jobs{where}; the rest: --cursor "
          f"{position.cursor}", file=sys.stderr)
