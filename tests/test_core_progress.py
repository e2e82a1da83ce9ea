"""A running job's progress in the core: carried by a heartbeat, kept newest-only on the job,
recorded only once the cluster is finalized, carried by snapshots, counted in the memory model,
bounded, and never an event."""

import math

import msgpack
import pytest

from raftcron.scheduler import codec, limits
from raftcron.scheduler.commands import Heartbeat, wire_fingerprint
from raftcron.scheduler.driver import Driver, Refused
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.frozen import COMPACT_MARK, FrozenJob
from raftcron.scheduler.invariants import violations
from raftcron.scheduler.progress import ProgressReport
from raftcron.scheduler.snapshot import restore, snapshot
from raftcron.scheduler.views import job_view

T0 = 1_800_000_000_000


@pytest.fixture
def driver() -> Driver:
    d = Driver(now_ms=T0)
    d.finalize()
    return d


def running(driver: Driver, **fields: object) -> tuple[int, int]:
    job_id = driver.submit(**fields)
    [(claimed, token)] = driver.claim()
    assert claimed == job_id
    return job_id, token


def progress_of(driver: Driver, job_id: int) -> object:
    record = driver.state.table.get(job_id)
    assert record is not None
    return job_view(record)["progress"]


def test_a_heartbeat_records_its_progress_with_the_state_time_and_attempt(driver):
    job_id, token = running(driver)
    assert progress_of(driver, job_id) is None
    driver.tick(advance_ms=1_500)
    answer = driver.heartbeat(job_id, token, progress={
        "value": {"done": 3, "total": 10}, "message": "rows 3/10", "data": {"table": "orders"}})
    assert answer == {"lease_until_ms": driver.now_ms + 30_000}  # what a plain one answers
    assert progress_of(driver, job_id) == {
        "value": {"done": 3, "total": 10}, "message": "rows 3/10", "data": {"table": "orders"},
        "at_ms": driver.now_ms, "attempt": 1}
    assert violations(driver.state) == []


def test_the_newest_report_replaces_the_last_and_a_plain_heartbeat_keeps_it(driver):
    job_id, token = running(driver)
    driver.heartbeat(job_id, token, progress={"value": 0.25, "message": "a", "data": [1, 2]})
    driver.tick(advance_ms=1_000)
    driver.heartbeat(job_id, token, progress={"value": 0.5})
    driver.heartbeat(job_id, token)
    assert progress_of(driver, job_id) == {
        "value": 0.5, "message": None, "data": None, "at_ms": driver.now_ms, "attempt": 1}
    assert violations(driver.state) == []


def test_a_report_is_not_an_event(driver):
    job_id, token = running(driver)
    before = len(driver.state.events)
    for step in range(20):
        driver.heartbeat(job_id, token, progress={"value": step / 20})
    assert len(driver.state.events) == before


def test_a_stale_token_records_nothing(driver):
    job_id, token = running(driver)
    with pytest.raises(Refused) as refused:
        driver.heartbeat(job_id, token + 1, progress={"value": 0.5})
    assert refused.value.code == "stale_token"
    assert progress_of(driver, job_id) is None


def test_a_finished_job_keeps_its_last_report_and_a_new_attempt_starts_with_none(driver):
    job_id, token = running(driver, max_attempts=2, backoff={"initial_ms": 1_000})
    driver.heartbeat(job_id, token, progress={"value": 0.4, "message": "halfway, nearly"})
    driver.fail(job_id, token, "disk full")
    # Waiting for its retry, the job still says how far the failed attempt got, and which.
    assert progress_of(driver, job_id)["attempt"] == 1
    driver.tick(advance_ms=5_000)
    [(_, token)] = driver.claim()
    assert progress_of(driver, job_id) is None  # attempt 2 has reported nothing yet
    driver.heartbeat(job_id, token, progress={"value": 1})
    driver.complete(job_id, token, {"rows": 10})
    record = driver.state.table.get(job_id)
    assert isinstance(record, FrozenJob)
    assert job_view(record)["progress"] == {
        "value": 1, "message": None, "data": None, "at_ms": driver.now_ms, "attempt": 2}
    assert violations(driver.state) == []


# -- the upgrade gate ----------------------------------------------------------------------------


def test_before_the_cluster_is_finalized_a_report_is_ignored():
    driver = Driver(now_ms=T0)
    job_id, token = running(driver)
    answer = driver.heartbeat(job_id, token, progress={"value": 0.5, "message": "m"})
    assert answer == {"lease_until_ms": driver.now_ms + 30_000}
    assert progress_of(driver, job_id) is None
    driver.finalize()
    driver.heartbeat(job_id, token, progress={"value": 0.75})
    assert progress_of(driver, job_id)["value"] == 0.75


def previous_release_apply(driver: Driver, entry: bytes) -> None:
    """Apply a heartbeat entry as a member of the previous release does: its from_wire reads
    the fields it knows and ignores `progress`; the fingerprint is taken from the fields as
    decoded (codec.decode_request), the unknown one included."""
    _version, tag, fields = msgpack.unpackb(entry, raw=False)
    known = {k: v for k, v in fields.items() if k != "progress"}
    command = Heartbeat.from_wire(known)
    assert command.progress is None
    driver.state.apply(command, wire_fingerprint(tag, fields))


def test_a_member_of_the_previous_release_reaches_the_same_state_before_finalizing():
    ours, theirs = Driver(now_ms=T0), Driver(now_ms=T0)
    for driver in (ours, theirs):
        running(driver)
    beat = Heartbeat("beat-1", 1, 1, None, ProgressReport(0.5, "exporting", {"rows": 10}))
    entry = codec.encode(beat)
    command, fingerprint = codec.decode_request(entry)
    assert command == beat
    ours.state.apply(command, fingerprint)
    previous_release_apply(theirs, entry)
    assert snapshot(ours.state) == snapshot(theirs.state)
    # The repeat of the request is answered alike too (the fingerprints agree).
    assert ours.state.apply(command, fingerprint) == theirs.state.apply(command, fingerprint)


# -- snapshots and the memory model ---------------------------------------------------------------


def test_snapshots_carry_the_progress_of_running_and_finished_jobs(driver):
    finished_id, token = running(driver)
    driver.heartbeat(finished_id, token, progress={"value": 1, "data": {"n": 1}})
    driver.complete(finished_id, token)
    running_id, token = running(driver)
    driver.heartbeat(running_id, token, progress={"value": {"done": 1, "total": 4}})
    plain_id, _ = running(driver)
    blob = snapshot(driver.state)
    restored = restore(blob)
    assert snapshot(restored) == blob
    for job_id in (finished_id, running_id, plain_id):
        assert job_view(restored.table.get(job_id)) == job_view(driver.state.table.get(job_id))
    assert restored.state_bytes() == driver.state.state_bytes()
    assert violations(restored) == []


def test_a_record_without_progress_keeps_the_compact_format_it_had(driver):
    job_id, token = running(driver)
    driver.complete(job_id, token)
    fields = msgpack.unpackb(driver.state.table.get(job_id)._packed, raw=False)
    assert fields[0] == COMPACT_MARK and len(fields) == 33
    other, token = running(driver)
    driver.heartbeat(other, token, progress={"value": 0.1})
    driver.complete(other, token)
    fields = msgpack.unpackb(driver.state.table.get(other)._packed, raw=False)
    assert len(fields) == 34


def test_a_report_is_counted_in_the_state_and_replaced_rather_than_added(driver):
    # The jobs' part of the state (each heartbeat's request id is counted apart from it).
    job_id, token = running(driver)
    plain = driver.state.table.bytes
    data = "x" * 900
    driver.heartbeat(job_id, token, progress={"value": 0.1, "data": data})
    once = driver.state.table.bytes
    assert once - plain > 900
    driver.heartbeat(job_id, token, progress={"value": 0.2, "data": data})
    assert driver.state.table.bytes == once
    driver.heartbeat(job_id, token, progress={"value": 0.3})
    assert plain < driver.state.table.bytes < once
    assert violations(driver.state) == []


# -- bounds ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("report", "field", "code"),
    [
        ({}, "progress.value", "invalid"),
        ({"value": 1.5}, "progress.value", "invalid"),
        ({"value": -0.1}, "progress.value", "invalid"),
        ({"value": math.nan}, "progress.value", "invalid"),
        ({"value": True}, "progress.value", "invalid"),
        ({"value": "50%"}, "progress.value", "invalid"),
        ({"value": {"done": 5, "total": 3}}, "progress.value.done", "invalid"),
        ({"value": {"done": 0, "total": 0}}, "progress.value.total", "invalid"),
        ({"value": {"done": -1, "total": 3}}, "progress.value.done", "invalid"),
        ({"value": {"done": 1}}, "progress.value.total", "invalid"),
        ({"value": {"done": 1, "total": 2, "of": 3}}, "progress.value.of", "invalid"),
        ({"value": 0.5, "percent": 50}, "progress.percent", "invalid"),
        ({"value": 0.5, "message": "m" * 201}, "progress.message", "invalid"),
        ({"value": 0.5, "message": 7}, "progress.message", "invalid"),
        ({"value": 0.5, "data": "d" * 1_100}, "progress.data", "too_large"),
        ({"value": 0.5, "data": {"x": math.inf}}, "progress.data", "invalid"),
        ("half", "progress", "invalid"),
    ],
)
def test_a_report_out_of_bounds_is_refused_naming_its_field(report, field, code):
    with pytest.raises(Invalid) as refused:
        Heartbeat.from_wire({"job_id": 1, "token": 1, "progress": report})
    assert (refused.value.field, refused.value.code) == (field, code)


def test_the_largest_report_fits_its_bounds(driver):
    job_id, token = running(driver)
    data = "d" * (limits.PROGRESS_DATA_BYTES_MAX - 3)  # a str8 header of 3 bytes
    report = {"value": {"done": 2**62, "total": 2**63 - 1}, "message": "é" * 200, "data": data}
    driver.heartbeat(job_id, token, progress=report)
    assert progress_of(driver, job_id)["message"] == "é" * 200
    assert len(driver.state.table.get(job_id).progress) < 2_000


def test_the_counts_of_a_report_are_kept_in_one_key_order():
    one = ProgressReport.parse({"value": {"total": 4, "done": 1}})
    other = ProgressReport.parse({"value": {"done": 1, "total": 4}})
    assert one.packed(5, 1) == other.packed(5, 1)
