"""A job search means the same over the state and over the archive: `JobFilter.matches` on job
views and the archive's SQL (cluster/archive/query.py) find the same jobs, for random jobs and
random filters (hypothesis); and a filter that cannot be read is refused naming its
parameter."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftcron.cluster.archive.paging import merge_page
from raftcron.cluster.archive.store import ArchiveStore, Row
from raftcron.scheduler import jobs as j
from raftcron.scheduler.commands import Ack
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.search import JobFilter, PayloadFilter
from raftcron.scheduler.views import job_view, search_jobs

NAMES = ["a", "b", "Bé", "c-d"]
scalars = st.one_of(
    st.integers(-5, 5), st.floats(-5, 5, allow_nan=False, allow_infinity=False).map(
        lambda x: round(x, 1)),
    st.sampled_from(["x", "y", "5", "Ünï", "", 'a"b', "c\\d", "\n", "\u2028", "\x7f/"]),
    st.booleans(), st.none())
payloads = st.recursive(
    scalars, lambda inner: st.dictionaries(st.sampled_from(NAMES), inner, max_size=3),
    max_leaves=6)


@st.composite
def views(draw: Any, job_id: int) -> dict[str, Any]:
    status = draw(st.sampled_from(j.STATUSES))
    created = draw(st.integers(0, 100))
    finished = draw(st.one_of(st.none(), st.integers(created, 200)))
    workers = draw(st.lists(st.sampled_from(["w1", "w2"]), max_size=2))
    return {
        "id": job_id, "task": draw(st.sampled_from(["t1", "t2"])),
        "queue": draw(st.sampled_from(["q1", "q2"])), "status": status,
        "schedule": draw(st.sampled_from([None, "s1"])), "key": draw(st.sampled_from([None, "k"])),
        "error": draw(st.sampled_from([None, "Boom at Ünï", "timeout", "BOOM"])),
        "created_ms": created, "finished_ms": finished,
        "payload": draw(payloads),
        "history": [{"worker": worker} for worker in workers],
    }


@st.composite
def filters(draw: Any) -> JobFilter:
    def maybe(values: Any) -> Any:
        return draw(st.one_of(st.none(), values))

    payload = draw(st.lists(st.builds(
        PayloadFilter,
        st.lists(st.sampled_from(NAMES), min_size=1, max_size=2).map(tuple),
        st.sampled_from(["eq", "eq", "gte", "lte"]), scalars,
    ).filter(lambda f: f.op == "eq" or not (isinstance(f.value, bool) or f.value is None)),
        max_size=2))
    return JobFilter(
        status=maybe(st.sampled_from(j.STATUSES)), task=maybe(st.just("t1")),
        queue=maybe(st.just("q2")), schedule=maybe(st.just("s1")), key=maybe(st.just("k")),
        worker=maybe(st.sampled_from(["w1", "w2"])),
        created_from_ms=maybe(st.integers(0, 100)), created_to_ms=maybe(st.integers(0, 100)),
        finished_from_ms=maybe(st.integers(0, 200)), finished_to_ms=maybe(st.integers(0, 200)),
        error=maybe(st.sampled_from(["boom", "ÜNÏ", "ünï", "out"])), payload=tuple(payload))


# Search attributes: paths of NAMES an index can be built on (the API's grammar has no "é").
attribute_paths = st.lists(st.lists(st.sampled_from(["a", "b", "c-d"]), min_size=1,
                                    max_size=2).map(".".join), unique=True, max_size=3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_archive_finds_what_the_filter_matches(data: st.DataObject) -> None:
    """With and without search attributes' indexes (built before the rows are written, or
    over them): an index changes how SQLite finds the rows, never which."""
    jobs = [data.draw(views(job_id)) for job_id in range(1, data.draw(st.integers(0, 25)) + 1)]
    query = data.draw(filters())
    before = data.draw(st.one_of(st.none(), st.integers(1, 30)))
    limit = data.draw(st.integers(1, 30))
    attributes = data.draw(attribute_paths)
    indexed_first = data.draw(st.booleans())
    with tempfile.TemporaryDirectory() as folder:
        store = ArchiveStore(folder, durable=False)
        for path in attributes if indexed_first else ():
            store.add_attribute(path)
        store.write([Row.of_view(view, 1) for view in jobs], 1)
        for path in () if indexed_first else attributes:
            store.add_attribute(path)
        found = [view["id"] for view in store.search(query, before_id=before, limit=limit)]
        store.close()
    expected = [view["id"] for view in sorted(jobs, key=lambda v: -v["id"])
                if query.matches(view) and (before is None or view["id"] < before)][:limit]
    assert found == expected


# Values of every kind, the edges of SQLite's order among them (NULL, numbers, text) first.
numbers = st.one_of(st.sampled_from([0, -1, 1, 0.5, -0.5, -2**53, 2**53, 1e300, -1e300]),
                    st.integers(-2**53, 2**53), st.floats(allow_nan=False, allow_infinity=False))
texts = st.one_of(st.sampled_from(["", " ", "0", "1", "a", "z", "é", "zz", 'a"', "\\", "\t"]),
                  st.text(max_size=3))
KINDS = {"number": numbers, "text": texts, "bool": st.booleans(), "null": st.none()}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_an_indexed_path_finds_what_the_filter_matches(data: st.DataObject) -> None:
    """One declared path, every kind of value in it, and ranges on it: where a range's other
    end is added for the index (cluster/archive/query.py), no answer changes."""
    def value(kinds: tuple[str, ...] = tuple(KINDS)) -> Any:
        return data.draw(KINDS[data.draw(st.sampled_from(kinds))])

    # Mostly rows the index holds: {"a": value}; some without it, some not even an object.
    payloads = {"a": lambda: {"a": value()}, "none": lambda: {}, "top": value}
    shapes = st.sampled_from(["a", "a", "a", "none", "top"])
    jobs = [{**data.draw(views(job_id)), "payload": payloads[data.draw(shapes)]()}
            for job_id in range(1, data.draw(st.integers(1, 25)) + 1)]
    held = [job["payload"]["a"] for job in jobs if isinstance(job["payload"], dict)
            and "a" in job["payload"]]
    wanted = []
    for _ in range(data.draw(st.integers(1, 2))):
        op = data.draw(st.sampled_from(["eq", "gte", "lte"]))
        kinds = tuple(KINDS) if op == "eq" else ("number", "text")
        allowed = [v for v in held if op == "eq" or not isinstance(v, bool | None)]
        # Often a value a row holds: what must be found, found by every kind's rule.
        if allowed and data.draw(st.booleans()):
            wanted.append(PayloadFilter(("a",), op, data.draw(st.sampled_from(allowed))))
        else:
            wanted.append(PayloadFilter(("a",), op, value(kinds)))
    query = JobFilter(payload=tuple(wanted))
    with tempfile.TemporaryDirectory() as folder:
        store = ArchiveStore(folder, durable=False)
        store.add_attribute("a")
        store.write([Row.of_view(view, 1) for view in jobs], 1)
        found = [view["id"] for view in store.search(query, before_id=None, limit=30)]
        store.close()
    assert found == [view["id"] for view in reversed(jobs) if query.matches(view)]


def test_a_query_string_reads_as_the_filter_it_names() -> None:
    query = JobFilter.parse([
        ("status", "failed"), ("task", "invoice"), ("payload.customer.id", "42"),
        ("payload.name", '"42"'), ("payload.total.gte", "9.5"), ("payload.vip", "true"),
        ("payload.note", "late"), ("finished_from_ms", "1000"), ("limit", "5")],
        ignore=("limit",))
    assert query.status == "failed" and query.task == "invoice"
    assert query.finished_from_ms == 1000 and query.has_time_range
    assert query.payload == (
        PayloadFilter(("customer", "id"), "eq", 42), PayloadFilter(("name",), "eq", "42"),
        PayloadFilter(("total",), "gte", 9.5), PayloadFilter(("vip",), "eq", True),
        PayloadFilter(("note",), "eq", "late"))
    view = {"id": 1, "task": "invoice", "queue": "q", "status": "failed", "schedule": None,
            "key": None, "error": None, "created_ms": 5, "finished_ms": 1500, "history": [],
            "payload": {"customer": {"id": 42}, "name": "42", "total": 10, "vip": True,
                        "note": "late"}}
    assert query.matches(view)
    assert not query.matches({**view, "payload": {**view["payload"], "name": 42}})


@pytest.mark.parametrize("pairs, field", [
    ([("status", "done")], "status"),
    ([("colour", "red")], "colour"),
    ([("task", "a"), ("task", "b")], "task"),
    ([("created_from_ms", "yesterday")], "created_from_ms"),
    ([("finished_to_ms", "-1")], "finished_to_ms"),
    ([("payload.", "1")], "payload."),
    ([("payload.a b", "1")], "payload.a b"),
    ([("payload." + ".".join("x" * 9), "1")], "payload." + ".".join("x" * 9)),
    ([("payload.vip.gte", "true")], "payload.vip.gte"),
    ([("payload.n", str(2**63))], "payload.n"),  # SQLite's integers are of 64 bits
    ([("payload.n.lte", str(-(2**63) - 1))], "payload.n.lte"),
    ([("error", "x" * 257)], "error"),
])
def test_a_filter_it_cannot_read_is_refused_naming_the_parameter(
        pairs: list[tuple[str, str]], field: str) -> None:
    with pytest.raises(Invalid) as refused:
        JobFilter.parse(pairs)
    assert refused.value.field == field


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_paging_across_the_boundary_finds_every_job_once_as_jobs_leave_between_pages(
        data: st.DataObject) -> None:
    """Jobs finish and are evicted into the archive between (and before) the pages; a walk
    down the pages finds each job once, whatever the page size, the state's scan bound and
    the pages' byte bound (jobs of different sizes: a page of large ones ends early)."""
    d = Driver()
    d.finalize()
    ids: list[int] = []
    for _ in range(data.draw(st.integers(1, 4))):
        size = data.draw(st.sampled_from([0, 100, 3_000]))
        ids += d.submit_many(data.draw(st.integers(1, 12)), queue="q", max_attempts=1,
                             payload={"blob": "x" * size})
    query = JobFilter(queue="q")
    limit = data.draw(st.integers(1, 7))
    scan_max = data.draw(st.integers(1, 9))
    bytes_max = data.draw(st.one_of(st.none(), st.integers(1, 12_000)))
    seen: list[int] = []
    cursor: int | None = None
    with tempfile.TemporaryDirectory() as folder:
        store = ArchiveStore(folder, durable=False)
        d.state.leaving = []
        for _ in range(400):
            finishing = data.draw(st.integers(0, 5))
            claimed = d.claim(queues=("q",), max=finishing)
            d.claim(queues=("q",), max=0, acks=tuple(
                Ack(job_id, token, "succeeded") for job_id, token in claimed))
            kept = data.draw(st.integers(0, 10))
            d.put_settings("retention", {"succeeded": {"max_count": kept}})
            d.tick(advance_ms=1)
            store.write([Row.of_view(job_view(job), 1, seq) for seq, job in d.state.leaving], 1)
            d.state.leaving = []
            live, floor = search_jobs(d.state, query, before_id=cursor, limit=limit,
                                      scan_max=scan_max, bytes_max=bytes_max)
            archived, archive_floor = store.search_within(
                query, before_id=cursor, limit=limit, min_id=floor, bytes_max=bytes_max)
            page, cursor = merge_page((live, archived), floor=max(floor, archive_floor),
                                      limit=limit)
            seen += [view["id"] for view in page]
            if cursor is None:
                break
        store.close()
    assert seen == sorted(ids, reverse=True)


def test_a_page_of_large_jobs_ends_at_its_byte_bound_and_the_next_goes_on_below() -> None:
    """30 jobs of 3 KB payloads, 10 of them archived: with a bound of 10 KB each half ends
    after 4 jobs (the one that crosses it included), so a page holds at most 8 of the 20
    asked for; a page is never empty, and the walk finds every job once."""
    d = Driver()
    d.finalize()
    ids = d.submit_many(30, queue="q", max_attempts=1, payload={"blob": "x" * 3_000})
    d.state.leaving = []
    claimed = d.claim(queues=("q",), max=10)
    d.claim(queues=("q",), max=0, acks=tuple(Ack(job_id, token, "succeeded")
                                             for job_id, token in claimed))
    d.put_settings("retention", {"succeeded": {"max_count": 0}})
    d.tick(advance_ms=1)
    query = JobFilter(queue="q")
    with tempfile.TemporaryDirectory() as folder:
        store = ArchiveStore(folder, durable=False)
        store.write([Row.of_view(job_view(job), 1, seq) for seq, job in d.state.leaving], 1)
        assert len(store.search(query, before_id=None, limit=100)) == 10
        seen: list[int] = []
        sizes: list[int] = []
        cursor: int | None = None
        for _ in range(30):
            live, floor = search_jobs(d.state, query, before_id=cursor, limit=20,
                                      bytes_max=10_000)
            archived, archive_floor = store.search_within(
                query, before_id=cursor, limit=20, min_id=floor, bytes_max=10_000)
            assert len(live) <= 4 and len(archived) <= 4
            page, cursor = merge_page((live, archived), floor=max(floor, archive_floor),
                                      limit=20)
            assert page
            sizes.append(len(page))
            seen += [view["id"] for view in page]
            if cursor is None:
                break
        store.close()
    assert seen == sorted(ids, reverse=True)
    assert max(sizes) <= 8 and len(sizes) >= 30 // 8


def test_a_filter_object_reads_as_the_query_string_does_with_json_payload_values() -> None:
    """The purge's filter (a JSON object): the same filter as the query string's names give,
    a payload value being its JSON value (42 a number, "42" a string)."""
    given = JobFilter.from_object({"task": "invoice", "created_from_ms": 5, "status": "failed",
                                   "payload": {"customer.id": 42, "name": "42",
                                               "total.gte": 1.5}})
    assert given == JobFilter.parse([("task", "invoice"), ("created_from_ms", "5"),
                                     ("status", "failed"), ("payload.customer.id", "42"),
                                     ("payload.name", '"42"'), ("payload.total.gte", "1.5")])
    for bad, field in (({"task": 5}, "filter.task"),
                       ({"created_from_ms": "5"}, "filter.created_from_ms"),
                       ({"owner": "me"}, "filter.owner"),
                       ({"payload": {"a..b": 1}}, "filter.payload.a..b"),
                       ({"payload": 3}, "filter.payload"),
                       ({"status": "done"}, "filter.status")):
        with pytest.raises(Invalid) as error:
            JobFilter.from_object(bad)
        assert error.value.field == field, bad
