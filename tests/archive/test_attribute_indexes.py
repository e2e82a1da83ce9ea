"""Search attributes in a node's archive (cluster/archive, DESIGN.md §9.2): one SQLite index per
declared payload path, which a search on that path uses (EXPLAIN QUERY PLAN says so) and which
finds what a scan finds; built and dropped on the writer's thread when the state's setting
changes, kept across a reopen, and left alone until the state has said what it declares."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from raftcron.cluster.archive.query import document, spelled
from raftcron.cluster.archive.store import ArchiveError, ArchiveStore, Row
from raftcron.cluster.archive.writer import ArchiveWriter
from raftcron.cluster.http.common import HttpError
from raftcron.cluster.http.jobsearch import check_indexed
from raftcron.scheduler.search import JobFilter, PayloadFilter


def view(job_id: int) -> dict[str, Any]:
    payload: dict[str, Any] = {"customer": {"id": job_id % 7}, "region": "eu" if job_id % 2
                               else "us", "vip": job_id % 3 == 0, "total": job_id / 4}
    if job_id % 5 == 0:
        payload["customer"]["id"] = str(job_id % 7)  # the same digits, as text: no match
    if job_id % 11 == 0:
        payload = {}
    return {"id": job_id, "task": "invoice" if job_id % 4 else "refund", "queue": "q",
            "status": "succeeded", "schedule": None, "key": None, "error": None,
            "created_ms": job_id, "finished_ms": job_id + 1, "payload": payload,
            "history": [{"worker": "w1"}]}


def field(path: str, value: Any, op: str = "eq") -> PayloadFilter:
    return PayloadFilter(tuple(path.split(".")), op, value)


QUERIES = [
    JobFilter(payload=(field("customer.id", 3),)),
    JobFilter(payload=(field("customer.id", "3"),)),
    JobFilter(payload=(field("customer.id", 2, "gte"),)),
    JobFilter(payload=(field("customer.id", 2, "lte"),)),
    JobFilter(payload=(field("customer.id", 2, "gte"), field("customer.id", 4, "lte"))),
    JobFilter(payload=(field("customer.id", "4", "gte"),)),
    JobFilter(payload=(field("region", "us"),), task="refund"),
    JobFilter(payload=(field("vip", True),)),
    JobFilter(payload=(field("vip", False), field("customer.id", 1))),
    JobFilter(payload=(field("total", 10.5, "gte"),), status="succeeded"),
]
ATTRIBUTES = ["customer.id", "region", "total", "vip"]


def uses_an_attribute_index(plan: list[str]) -> bool:
    return any("USING INDEX jobs_attribute_" in line for line in plan)


def test_a_search_on_a_declared_path_uses_its_index_and_finds_what_a_scan_finds(
        tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path), durable=False)
    store.write([Row.of_view(view(job_id), 1) for job_id in range(1, 400)], 1)
    scanned = [store.search(query, before_id=None, limit=1_000) for query in QUERIES]
    assert all(found for found in scanned)  # each query finds something to compare
    assert not any(uses_an_attribute_index(store.plan(query)) for query in QUERIES)

    for path in ATTRIBUTES:
        store.add_attribute(path)
    assert store.attributes() == ATTRIBUTES
    reader = ArchiveStore(str(tmp_path), readonly=True)  # the API's connection sees them too
    for query, expected in zip(QUERIES, scanned, strict=True):
        for connection in (store, reader):
            assert uses_an_attribute_index(connection.plan(query)), (query, store.plan(query))
            assert connection.search(query, before_id=None, limit=1_000) == expected, query
            paged = connection.search(query, before_id=expected[2]["id"], limit=2)
            assert paged == expected[3:5], query
    # Rows written after the index is built are in it too.
    store.write([Row.of_view(view(job_id), 2) for job_id in range(400, 450)], 2)
    assert store.search(QUERIES[0], before_id=None, limit=1_000)[0]["id"] == 444

    store.drop_attribute("region")
    assert store.attributes() == ["customer.id", "total", "vip"]
    assert not uses_an_attribute_index(reader.plan(QUERIES[6]))
    store.close()
    reopened = ArchiveStore(str(tmp_path))
    assert reopened.attributes() == ["customer.id", "total", "vip"]
    reopened.close()
    reader.close()


def test_a_filter_on_null_or_an_undeclared_path_does_not_use_an_index(tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path), durable=False)
    store.add_attribute("customer.id")
    for query in (JobFilter(payload=(field("customer.id", None),)),
                  JobFilter(payload=(field("customer", 3),)),
                  JobFilter(payload=(field("customer.id.more", 3),))):
        assert not uses_an_attribute_index(store.plan(query)), query
    store.close()


@pytest.mark.parametrize("path", ["a b", "a'b", 'a"b', "a..b", "$.a", "a\n", ""])
def test_a_path_outside_the_grammar_never_reaches_the_sql(tmp_path: Path, path: str) -> None:
    store = ArchiveStore(str(tmp_path), durable=False)
    with pytest.raises(ValueError):
        store.add_attribute(path)
    assert store.attributes() == []
    store.close()


def test_the_writer_builds_and_drops_the_indexes_the_state_declares_on_its_own_thread(
        tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path), durable=False)
    store.write([Row.of_view(view(job_id), 1) for job_id in range(1, 50)], 1)
    threads: list[str] = []
    add = store.add_attribute

    def recorded_add(path: str, *, through_index: int) -> None:
        threads.append(threading.current_thread().name)
        add(path, through_index=through_index)

    store.add_attribute = recorded_add  # type: ignore[method-assign]
    writer = ArchiveWriter(store)
    writer.start()
    try:
        writer.set_attributes(("customer.id", "region"), 10)  # the Raft thread hands it over
        assert writer.wait_indexed(10)
        assert writer.indexed == {"customer.id", "region"} == set(store.attributes())
        assert threads == ["archive-writer"] * 2
        writer.set_attributes(("region", "vip"), 12)
        assert writer.wait_indexed(10)
        assert store.attributes() == ["region", "vip"]
        assert writer.summary()["indexed"] == ["region", "vip"]
    finally:
        writer.stop()


def test_a_restarted_writer_keeps_its_indexes_while_it_replays_older_entries(
        tmp_path: Path) -> None:
    """The path was declared by entry 40 and indexed; the node restarts from a snapshot of
    entry 30 and replays from 31: the setting of those entries (none declared) is history."""
    store = ArchiveStore(str(tmp_path), durable=False)
    store.add_attribute("customer.id", through_index=40)
    writer = ArchiveWriter(store)
    assert writer.indexed == {"customer.id"} and store.attributes_through() == 40
    for index in range(31, 41):
        writer.set_attributes((), index)  # replayed
        assert writer._index_change() is None  # what the writer's turn would change
    writer.start()
    try:
        writer.put(40, [])
        assert writer.wait_durable(40, 10)
        assert store.attributes() == ["customer.id"]
        writer.set_attributes(("customer.id",), 41)  # the replay reached the declaration
        assert writer.wait_indexed(10)
        writer.set_attributes((), 57)  # a new change of the setting
        assert writer.wait_indexed(10)
        assert store.attributes() == [] and store.attributes_through() == 57
    finally:
        writer.stop()


def test_a_build_that_fails_is_retried_later_and_writes_go_on_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("raftcron.cluster.archive.writer.INDEX_RETRY_S", 0.05)
    store = ArchiveStore(str(tmp_path), durable=False)
    failures = {"left": 1}
    add = store.add_attribute

    def failing_add(path: str, *, through_index: int) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise ArchiveError("cannot change the indexes of the archive: database or disk "
                               "is full")
        add(path, through_index=through_index)

    store.add_attribute = failing_add  # type: ignore[method-assign]
    writer = ArchiveWriter(store)
    writer.set_attributes(("customer.id",), 3)
    writer.start()
    try:
        writer.put(7, [])
        assert writer.wait_durable(7, 10)
        assert writer.wait_indexed(10)
        assert failures["left"] == 0 and store.attributes() == ["customer.id"]
        assert writer.problem is None  # the archive's writes never failed
    finally:
        writer.stop()


@pytest.mark.parametrize("filters, declared, indexed_here, status", [
    ({"payload.customer.id": "3"}, (), None, 400),  # not declared
    ({"payload.customer.id": "3"}, ("customer.id",), frozenset({"customer.id"}), None),
    ({"payload.customer.id": "null"}, ("customer.id",), frozenset({"customer.id"}), 400),
    ({"payload.customer.id": "3", "payload.note": "x"}, ("customer.id",),
     frozenset({"customer.id"}), 400),  # every filter without a range must be indexed
    ({"payload.customer.id": "3"}, ("customer.id",), frozenset(), 503),  # still building
    ({"payload.customer.id": "3"}, ("customer.id",), None, None),  # no archive searched
])
def test_a_payload_filter_without_a_range_needs_an_index_built_here(
        filters: dict[str, str], declared: tuple[str, ...], indexed_here: frozenset[str] | None,
        status: int | None) -> None:
    query = JobFilter.parse(filters.items())
    if status is None:
        check_indexed(query, declared, indexed_here)
        return
    with pytest.raises(HttpError) as refused:
        check_indexed(query, declared, indexed_here)
    assert (refused.value.status, refused.value.field) == (status, "created_from_ms")


# Values whose JSON spelling differs from their text, and the edges of SQLite's order.
TRICKY = ["", " ", "é", 'a"b', "c\\d", "\n", "\u2028", "\x7f", "/", "😀", "\x00", "INV-1",
          0, -1, 1, 0.5, -0.5, 2**53, -(2**53), 1e300, -1e300, True, False, None]


@pytest.mark.parametrize("indexed_path", [False, True])
def test_every_kind_of_value_is_found_as_the_filter_matches_it(
        tmp_path: Path, indexed_path: bool) -> None:
    views = []
    for job_id, value in enumerate(TRICKY, start=1):
        views.append({**view(job_id), "payload": {"a": value, "b": {"c": [value]}}})
    store = ArchiveStore(str(tmp_path), durable=False)
    if indexed_path:
        store.add_attribute("a")
    store.write([Row.of_view(each, 1) for each in views], 1)
    for value in TRICKY:
        for op in ("eq", "gte", "lte"):
            if op != "eq" and (isinstance(value, bool) or value is None):
                continue
            query = JobFilter(payload=(field("a", value, op),))
            found = [found["id"] for found in store.search(query, before_id=None, limit=100)]
            assert found == [each["id"] for each in reversed(views) if query.matches(each)], (
                value, op)
    store.close()


def test_a_document_spells_every_string_as_the_standard_encoder_and_takes_big_integers() -> None:
    """Rows are written with orjson; a search looks for a string's spelling (`spelled`), and
    a row encoded by the fallback (an integer beyond 64 bits) spells strings the same."""
    for text in [value for value in TRICKY if isinstance(value, str)]:
        assert spelled(text) == json.dumps(text, ensure_ascii=False), repr(text)
        view = {"id": 1, "payload": {"s": text}}
        assert document(view) == json.dumps(view, separators=(",", ":"), ensure_ascii=False)
    big = {"id": 2, "payload": {"n": 2**70, "s": "é"}}
    assert json.loads(document(big)) == big
