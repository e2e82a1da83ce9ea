"""A property-based fuzz of the whole API from `/openapi.json`, against a live node.

Schemathesis reads the document the node serves and, for every operation, sends the
documented examples, boundary and type-mutation cases (its coverage phase) and random valid
and invalid requests (its fuzzing phase). Every answer must be documented: no 5xx, a listed
status code, the documented media type, headers and body schema, a 4xx for a request the
document calls invalid, and a 401 without the bearer token. Afterwards the node must still
be ready and run a job end to end, every replica must hold the same state (an audit digest at
one log entry), and no log may show an error but known bugs. The fuzz talks to a follower of
a 3-node cluster (cluster.localcluster), so every write is forwarded to the leader. Putting
the cluster's settings is fuzzed alone, on a node of its own (`ALONE`).

Random text seldom parses as cron, so a second, hypothesis-driven test builds schedules that
do parse (cron fields, intervals, instants, DST zones, every policy) and puts, triggers,
backfills and previews each: the firing code runs inside the replicated state machine, where
an exception stops the node.

The fuzz runs schemathesis's CLI (its pytest plugin does not work with pytest 9), with the
hooks of fuzz_hooks.py. Environment: RAFTCRON_FUZZ_EXAMPLES (default 15) cases per operation
and phase, RAFTCRON_FUZZ_SCHEDULES (default 60) generated schedules, RAFTCRON_FUZZ_SEED a
seed (default: a fixed one, so CI runs the same cases; "random" for new ones, printed with
any failure).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from raftcron.cluster.dev.localcluster import FAST_RAFT, LocalCluster

from .livenode import REPO, TOKENS, LiveNode, Reply, wait_until

pytest.importorskip("schemathesis", reason="pip install raftcron[test]")

from raftcron.scheduler.limits import RETENTION_MS_DEFAULT, TIME_MS_MAX

from .fuzz_hooks import KNOWN_BUGS_SEEN, NODE_LOG, describe, known_bug

pytestmark = pytest.mark.processes  # starts processes: make integration

EXAMPLES = int(os.environ.get("RAFTCRON_FUZZ_EXAMPLES", "15"))
SCHEDULE_EXAMPLES = int(os.environ.get("RAFTCRON_FUZZ_SCHEDULES", "60"))
SEED = os.environ.get("RAFTCRON_FUZZ_SEED", "20261130")
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "ignored_auth",
]
FUZZ_TIMEOUT_S = 240
# A body the document calls invalid must get a 4xx; too many items is a 413 (DESIGN.md).
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]
"""


def seed(node: LiveNode) -> None:
    """Give the documented path examples something to hit: job 1 leased with token 1, and the
    schedule `nightly-report`."""
    assert node.request("POST", "/v1/jobs", {"task": "shell"}).json()["id"] == 1
    claim = {"worker": "w1", "max": 1, "lease_ms": 3_600_000}
    assert node.request("POST", "/v1/claims", claim).json()["jobs"][0]["token"] == 1
    schedule = {"cron": "0 0 * * *", "job": {"task": "report"}, "overlap": "forbid"}
    assert node.request("PUT", "/v1/schedules/nightly-report", schedule).status == 201


@dataclass
class Fuzzed:
    """The node the fuzz talks to, every replica, and their state digests at one log entry."""

    node: LiveNode
    replicas: list[LiveNode]
    digests: Callable[[], dict[str, str]]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    """A 3-node cluster whose follower is fuzzed, so writes are forwarded to the leader; the
    harness kills every node at exit, whatever the tests did."""
    tokens = {token: role for role, token in TOKENS.items()}
    directory = tmp_path_factory.mktemp("fuzzed")
    with LocalCluster(directory, tokens=tokens, raft=FAST_RAFT) as cluster:
        cluster.start()
        cluster.wait_ready()
        views = {
            member.node_id: LiveNode(
                member.log_path.parent,
                member.http_port,
                member.raft_port,
                log_name=member.log_path.name,
            )
            for member in cluster.nodes
        }
        [follower, *_] = cluster.followers()
        seed(views[follower.node_id])
        yield Fuzzed(views[follower.node_id], list(views.values()), cluster.audit)


# Adding or removing members changes the cluster under the fuzz (a random DELETE of this
# node's id removes it): those two are tested in tests/cluster/test_membership.py, and their
# documented examples in test_openapi.py.
LEFT_OUT = ("addMember", "removeMember")
# Putting settings changes the cluster under the fuzz too: a budget of 1 MiB (the least)
# refuses the later submits 507, and a short retention forgets jobs and fire keys that the
# later tests read back (a key forgotten stays forgotten when the retention is raised again).
# It is fuzzed alone, on a node of its own.
ALONE = ("putSettings",)


def schemathesis_command(
    node: LiveNode, report_dir: Path, operations: tuple[str, ...] = ()
) -> list[str]:
    """The fuzz of every operation but LEFT_OUT and ALONE; of `operations` only when given."""
    config = report_dir / "schemathesis.toml"
    config.write_text(CONFIG)
    seed_option = [] if SEED == "random" else ["--seed", SEED]
    if operations:
        chosen = [option for op in operations for option in ("--include-operation-id", op)]
    else:
        chosen = [option for op in LEFT_OUT + ALONE for option in ("--exclude-operation-id", op)]
    return [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--no-color",
        "--config-file",
        str(config),
        "run",
        f"{node.base_url}/openapi.json",
        "--header",
        f"Authorization: Bearer {TOKENS['admin']}",
        "--phases",
        "examples,coverage,fuzzing",
        "--mode",
        "all",
        "--max-examples",
        str(EXAMPLES),
        *seed_option,
        "--checks",
        ",".join(CHECKS),
        "--workers",
        "1",
        "--request-timeout",
        "15",
        "--generation-database",
        "none",
        "--output-sanitize",
        "false",
        "--report",
        "junit",
        "--report-dir",
        str(report_dir),
        *chosen,
    ]


def run_schemathesis(
    node: LiveNode, report_dir: Path, operations: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.api.fuzz_hooks",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        NODE_LOG: str(node.log_path),
    }
    return subprocess.run(
        schemathesis_command(node, report_dir, operations),
        cwd=report_dir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=FUZZ_TIMEOUT_S,
        check=False,
    )


def test_every_operation_answers_as_documented(fuzzed: Fuzzed, tmp_path: Path) -> None:
    run = run_schemathesis(fuzzed.node, tmp_path)
    print(run.stdout, run.stderr)
    seen = tmp_path / KNOWN_BUGS_SEEN
    if seen.exists():
        print("known bugs seen (test that pins each, operation):\n" + seen.read_text())
    summary = "\n".join(run.stdout.splitlines()[-15:])
    assert run.returncode == 0, f"schemathesis found failures (full output above):\n{summary}"


def test_putting_settings_alone_answers_as_documented(
    fresh_node: Callable[[], LiveNode], tmp_path: Path
) -> None:
    node = fresh_node()
    run = run_schemathesis(node, tmp_path, ALONE)
    print(run.stdout, run.stderr)
    summary = "\n".join(run.stdout.splitlines()[-15:])
    assert run.returncode == 0, f"schemathesis found failures (full output above):\n{summary}"
    assert node.is_ready()
    assert unexplained_errors(node) == [], "\n\n".join(unexplained_errors(node)[:3])


# -- schedules that parse, so the firing code runs (random text seldom parses as cron) ---------

ZONES = (
    "UTC",
    "America/New_York",
    "Europe/Paris",
    "Australia/Lord_Howe",
    "Pacific/Kiritimati",
    "Pacific/Apia",
    "America/Santiago",
    "America/St_Johns",
    "Africa/Casablanca",
    "Antarctica/Troll",
)
YEAR_MS = 365 * 86_400_000


def cron_field(low: int, high: int) -> st.SearchStrategy[str]:
    number = st.integers(low, high)
    pair = st.tuples(number, number).map(sorted)
    return st.one_of(
        st.just("*"),
        number.map(str),
        pair.map(lambda ab: f"{ab[0]}-{ab[1]}"),
        st.integers(1, high - low + 1).map(lambda n: f"*/{n}"),
        st.tuples(pair, st.integers(1, 10)).map(lambda p: f"{p[0][0]}-{p[0][1]}/{p[1]}"),
        st.lists(number, min_size=2, max_size=4, unique=True).map(lambda v: ",".join(map(str, v))),
    )


def crons() -> st.SearchStrategy[str]:
    day = st.one_of(cron_field(1, 31), st.just("L"))
    weekday = st.one_of(cron_field(0, 7), st.sampled_from(["mon", "fri#2", "sun#5", "mon-fri"]))
    five = st.tuples(cron_field(0, 59), cron_field(0, 23), day, cron_field(1, 12), weekday)
    fields = st.one_of(five, st.tuples(cron_field(0, 59), five).map(lambda t: (t[0], *t[1])))
    macros = st.sampled_from(["@hourly", "@daily", "@weekly", "@monthly", "@yearly"])
    return st.one_of(fields.map(" ".join), macros)


def instants() -> st.SearchStrategy[int | str | None]:
    """Unix ms, a wall time in the schedule's zone, an absolute time, or null (not given)."""
    wall = st.datetimes(datetime(1970, 1, 2), datetime(9999, 12, 1)).map(
        lambda moment: moment.replace(microsecond=0).isoformat()
    )
    offset = st.sampled_from(["Z", "+05:30", "-03:00", "+14:00"])
    absolute = st.tuples(wall, offset).map("".join)
    return st.one_of(st.integers(0, TIME_MS_MAX), wall, absolute, st.none())


def schedules() -> st.SearchStrategy[dict[str, Any]]:
    recurrence = st.one_of(
        st.fixed_dictionaries({"cron": crons()}),
        st.fixed_dictionaries(
            {
                "every": st.one_of(
                    st.integers(1_000, 10 * YEAR_MS), st.sampled_from(["1s", "90m", "1d 2h"])
                )
            }
        ),
        st.fixed_dictionaries({"at": instants().filter(lambda at: at is not None)}),
    )
    chain = [{"name": "a", "task": "t"}, {"name": "b", "task": "t", "after": ["a"]}]
    options = st.fixed_dictionaries(
        {},
        optional={
            "tz": st.sampled_from(ZONES),
            "start_at": instants(),
            "end_at": instants(),
            "misfire": st.sampled_from(["fire_once", "fire_all", "skip"]),
            "max_catchup": st.integers(1, 1_000),
            "overlap": st.sampled_from(["allow", "forbid", "replace", "buffer_one"]),
            "jitter_ms": st.integers(0, 86_400_000),
            "retain": st.integers(1, 100_000),
            "paused": st.booleans(),
        },
    )
    target = st.sampled_from([{"job": {"task": "t"}}, {"workflow": {"jobs": chain}}])
    return st.tuples(recurrence, options, target).map(merged)


def merged(parts: tuple[Any, ...]) -> dict[str, Any]:
    return {key: value for part in parts for key, value in part.items()}


def answered(reply: Reply, *allowed: int, what: str) -> Reply:
    assert reply.status in allowed, reply
    event(f"{what} {reply.status}")
    return reply


@settings(max_examples=SCHEDULE_EXAMPLES, deadline=None, database=None)
@given(
    spec=schedules(),
    backfill_from_ms=st.integers(0, TIME_MS_MAX - 21 * YEAR_MS),
    backfill_years=st.integers(0, 20),
    preview_from_ms=st.integers(0, TIME_MS_MAX),
    force=st.booleans(),
)
def test_valid_schedules_fire_trigger_backfill_and_preview_without_a_5xx(
    fuzzed: Fuzzed,
    spec: dict[str, Any],
    backfill_from_ms: int,
    backfill_years: int,
    preview_from_ms: int,
    force: bool,
) -> None:
    node, name = fuzzed.node, f"gen-{uuid.uuid4().hex[:12]}"
    put = node.request("PUT", f"/v1/schedules/{name}", spec)
    if answered(put, 200, 201, 400, what="put").status == 400:
        return  # a spec that can never fire, or end_at before start_at
    trigger = node.request("POST", f"/v1/schedules/{name}/trigger", {"force": force})
    answered(trigger, 201, 202, 409, what="trigger")
    window = {"from_ms": backfill_from_ms, "to_ms": backfill_from_ms + backfill_years * YEAR_MS + 1}
    backfill = node.request("POST", f"/v1/schedules/{name}/backfill", window)
    if backfill_from_ms < time.time() * 1000 - RETENTION_MS_DEFAULT:
        answered(backfill, 400, 413, what="backfill past the retention")
    else:
        answered(backfill, 200, 413, what="backfill")
    path = f"/v1/schedules/{name}/preview?count=20&from_ms={preview_from_ms}"
    answered(node.request("GET", path), 200, what="preview")
    answered(node.request("GET", f"/v1/schedules/{name}"), 200, what="get")


def test_the_cluster_is_still_healthy_after_the_fuzz(fuzzed: Fuzzed) -> None:
    node = fuzzed.node
    for replica in fuzzed.replicas:
        assert replica.is_running(), replica.log_tail()
        wait_until(replica.is_ready, deadline_s=10, what=f"{replica.base_url} ready")
    queue = "after-the-fuzz"
    submitted = node.request("POST", "/v1/jobs", {"task": "t", "queue": queue})
    assert submitted.status == 201, submitted
    claim = {"worker": "w-after", "queues": [queue], "wait_ms": 5_000}
    [job] = node.request("POST", "/v1/claims", claim).json()["jobs"]
    assert job["id"] == submitted.json()["id"]
    done = {"token": job["token"], "result": {"ok": True}}
    assert node.request("POST", f"/v1/jobs/{job['id']}/complete", done).status == 200
    wait_until(
        lambda: status_of(node, job["id"]) == "succeeded",
        deadline_s=5,
        what="the job reads back succeeded",
    )


def status_of(node: LiveNode, job_id: int) -> str:
    return str(node.request("GET", f"/v1/jobs/{job_id}?consistent=1").json()["status"])


def test_every_replica_has_the_same_state_after_the_fuzz(fuzzed: Fuzzed) -> None:
    digests = fuzzed.digests()
    assert len(set(digests.values())) <= 1, digests


def unexplained_errors(node: LiveNode) -> list[str]:
    """The errors a node logged, but known bugs' and aiohttp's own parser refusing a malformed
    request (a NUL in a header) before any route runs: it answers 400 itself and logs the
    refusal at error level."""
    return [
        f"{node.log_path.name}: {describe(record)[:2_000]}"
        for record in node.errors_logged()
        if known_bug(500, [record]) is None
        and not str(record.get("msg", "")).startswith("Error handling request")
    ]


def test_no_replica_logged_an_error_but_known_bugs(fuzzed: Fuzzed) -> None:
    unexplained = [error for replica in fuzzed.replicas for error in unexplained_errors(replica)]
    assert unexplained == [], "\n\n".join(unexplained[:3])
