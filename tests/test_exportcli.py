"""`raftcron jobs export` without a cluster: the pages it follows, the lines it writes, what
it refuses, and the file that appears only whole (cluster/commandline/exportcli.py). The same
against a real cluster, through restarts: tests/cluster/test_export.py."""

from __future__ import annotations

import argparse
import errno
import io
import json
from pathlib import Path
from typing import Any

import pytest

from raftcron.cluster.clients.client import Unavailable
from raftcron.cluster.commandline import exportcli, opsargs, opscli
from raftcron.cluster.commandline import main as cli


class PagedJobs:
    """A client's `jobs` over ids 1..count, newest first, `fail_at` calls raising Unavailable
    (a deadline passed) once each; the calls it was asked, kept."""

    def __init__(self, count: int, *, fail_at: tuple[int, ...] = (), cursor_stuck: bool = False):
        self.ids = list(range(count, 0, -1))
        self.fail_at = set(fail_at)
        self.cursor_stuck = cursor_stuck
        self.calls: list[dict[str, Any]] = []

    def jobs(self, **params: Any) -> dict[str, Any]:
        self.calls.append(params)
        if len(self.calls) in self.fail_at:
            raise Unavailable("GET /v1/jobs: no node answered in time")
        cursor, limit = params["cursor"], params["limit"]
        below = [i for i in self.ids if cursor is None or i < cursor][:limit]
        page = [{"id": i, "payload": {"n": i}, **({"archived": True} if i % 2 else {})}
                for i in below]
        more = bool(below) and below[-1] > 1
        next_cursor = (cursor if self.cursor_stuck and cursor else below[-1]) if more else None
        return {"jobs": page, "next_cursor": next_cursor}


def export_args(*words: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    opsargs.add_commands(parser.add_subparsers(dest="command"))
    return parser.parse_args(["jobs", "export", *words])


def test_every_page_is_followed_to_the_last_and_each_job_is_one_line() -> None:
    client = PagedJobs(25)
    sink = io.BytesIO()
    position = exportcli.Position()
    exportcli.export_jobs(client, {"task": "invoice"}, sink, page_size=10, position=position,
                          progress=exportcli.Progress(None))
    rows = [json.loads(text) for text in sink.getvalue().decode().splitlines()]
    assert [row["id"] for row in rows] == list(range(25, 0, -1))
    assert all(row["archived"] is bool(row["id"] % 2) for row in rows)  # always present
    assert [call["cursor"] for call in client.calls] == [None, 16, 6]
    assert all(call["task"] == "invoice" and call["limit"] == 10 for call in client.calls)
    assert position == exportcli.Position(jobs=25, cursor=None, done=True,
                                          bytes=len(sink.getvalue()))


def test_a_cursor_that_does_not_go_down_stops_the_export_instead_of_repeating_jobs() -> None:
    with pytest.raises(Exception, match="next_cursor 31 for a page below 31"):
        exportcli.export_jobs(PagedJobs(40, cursor_stuck=True), {}, io.BytesIO(), page_size=10,
                              position=exportcli.Position(),
                              progress=exportcli.Progress(None))


def test_progress_shows_at_most_once_a_second_then_the_total_and_time() -> None:
    stream = io.StringIO()
    now = [100.0]
    progress = exportcli.Progress(stream, clock=lambda: now[0])
    for jobs, at in ((1_000, 100.4), (2_000, 101.1), (3_000, 101.5), (4_000, 102.2)):
        now[0] = at
        progress.page(jobs)
    progress.end("4000 jobs")
    assert stream.getvalue().splitlines() == [
        "raftcron jobs export: 2000 jobs so far (1.1 s)",
        "raftcron jobs export: 4000 jobs so far (2.2 s)",
        "raftcron jobs export: 4000 jobs in 2.2 s",
    ]


@pytest.mark.parametrize(("words", "said"), [
    (["--format", "csv"], "--format must be jsonl (the only format so far), not 'csv'"),
    (["--page-size", "0"], "--page-size must be between 1 and 1000, not 0"),
    (["--page-size", "1001"], "--page-size must be between 1 and 1000, not 1001"),
    (["--payload", "customer.id"], "--payload takes PATH=VALUE, not 'customer.id'"),
    (["--finished-from", "last tuesday"], "--finished-from: 'last tuesday' is not ISO-8601"),
])
def test_a_bad_command_line_exits_2_with_one_line_before_asking_the_cluster(
        capsys: pytest.CaptureFixture[str], words: list[str], said: str) -> None:
    # Nothing listens on port 9: a request would end in "unavailable" (3), not 2.
    code = cli.main(["jobs", "export", "--connect", "http://127.0.0.1:9", *words])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and said in err, err


def test_the_file_appears_only_whole_and_a_stopped_export_says_how_to_go_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "jobs.jsonl"
    args = export_args("--out", str(out), "--page-size", "10", "--quiet")
    with pytest.raises(Unavailable):
        exportcli.run(PagedJobs(25, fail_at=(2,)), args)
    assert not out.exists()
    partial = Path(f"{out}.partial")
    assert [json.loads(text)["id"] for text in partial.read_text().splitlines()] == list(
        range(25, 15, -1))
    err = capsys.readouterr().err
    assert f"stopped after 10 jobs ({partial} holds them); the rest: --cursor 16" in err

    # Continued from that cursor into another file: the two hold each job once.
    rest = tmp_path / "rest.jsonl"
    exportcli.run(PagedJobs(25), export_args("--out", str(rest), "--cursor", "16", "--quiet"))
    ids = [json.loads(text)["id"] for path in (partial, rest)
           for text in path.read_text().splitlines()]
    assert ids == list(range(25, 0, -1)) and not Path(f"{rest}.partial").exists()


def test_an_export_refused_at_its_first_page_leaves_no_file(tmp_path: Path) -> None:
    out = tmp_path / "jobs.jsonl"
    with pytest.raises(Unavailable):
        exportcli.run(PagedJobs(5, fail_at=(1,)), export_args("--out", str(out)))
    assert list(tmp_path.iterdir()) == []


def test_a_page_whose_write_failed_is_cut_from_the_file_so_the_cursor_continues_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class FillsUp(io.FileIO):
        """A file whose disk fills up halfway through the second page."""

        writes = 0

        def write(self, data: Any) -> int:
            FillsUp.writes += 1
            if FillsUp.writes == 2:
                super().write(bytes(data)[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

    monkeypatch.setattr(exportcli, "open", lambda path, mode: FillsUp(path, "w"), raising=False)
    out = tmp_path / "jobs.jsonl"
    code = cli_run(export_args("--out", str(out), "--page-size", "10", "--quiet"),
                   PagedJobs(25))
    assert code == 2 and not out.exists()
    kept = Path(f"{out}.partial").read_text().splitlines()
    assert [json.loads(text)["id"] for text in kept] == list(range(25, 15, -1))
    err = capsys.readouterr().err
    assert "stopped after 10 jobs" in err and "--cursor 16" in err
    assert "No space left on device" in err


def cli_run(args: argparse.Namespace, client: PagedJobs) -> int:
    """`args` run as the CLI runs a command (its exit code), with `client`."""
    args.deadline, args.connect, args.api_token = 15.0, "http://127.0.0.1:9", None
    args.ca_file = args.cert_file = args.key_file = None
    return opscli.run(args, lambda _, parsed: exportcli.run(client, parsed))
