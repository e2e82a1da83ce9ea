"""A job search (`scheduler/search.py`'s `JobFilter`) as SQL over the archive's rows: the same
answers as `JobFilter.matches` gives for the same jobs (tests/archive holds both to it).

Payload paths are written into the SQL as literals (each segment is checked to be letters,
digits, `_` or `-`, and quoted), never bound: SQLite uses an index on an expression only when
a query names the very same expression, and search attributes are such indexes
(`payload_value`). Such an index finds a number, a string or a boolean; `null` is what every
row without the field reads as too, so a filter on null is not an indexed one (`indexed`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from raftcron.scheduler.search import JobFilter, PayloadFilter

_SQL_OPERATORS = {"eq": "=", "gte": ">=", "lte": "<="}


def json_path(path: tuple[str, ...]) -> str:
    """The JSON path of a payload field in a row's document, as an SQL string literal. Each
    name is quoted as a JSON path key; the grammar of a path (`search.payload_path`: letters,
    digits, `_`, `-`) leaves no quote, backslash or dot to escape."""
    return "'$.payload" + "".join(f'."{segment}"' for segment in path) + "'"


def payload_value(path: tuple[str, ...]) -> str:
    """The SQL expression of a payload field's value: the very text a search attribute's index
    is built on (cluster/archive/store.py), so that the searches below use it."""
    return f"json_extract(doc, {json_path(path)})"


def indexed(wanted: PayloadFilter, attributes: Iterable[str]) -> bool:
    """Whether a search attribute's index answers `wanted` (its path is one of `attributes`,
    dotted, and its value not null)."""
    return wanted.value is not None and ".".join(wanted.path) in attributes


def where(query: JobFilter) -> tuple[str, list[Any]]:
    """The WHERE clause (without the word) and its parameters; "1" when nothing is asked."""
    clauses: list[str] = []
    params: list[Any] = []
    for name in ("status", "task", "queue", "schedule", "key", "worker"):
        value = getattr(query, name)
        if value is not None:
            clauses.append(f"{name} = ?")
            params.append(value)
    for column, low, high in (("created_ms", query.created_from_ms, query.created_to_ms),
                              ("finished_ms", query.finished_from_ms, query.finished_to_ms)):
        if low is not None:
            clauses.append(f"{column} >= ?")
            params.append(low)
        if high is not None:
            clauses.append(f"{column} <= ?")
            params.append(high)
    if query.error is not None:
        clauses.append("error IS NOT NULL AND instr(lower(error), lower(?)) > 0")
        params.append(query.error)
    for each in query.payload:
        clause, values = _payload(each)
        clauses.append(clause)
        params.extend(values)
    return (" AND ".join(f"({c})" for c in clauses) or "1"), params


def _payload(wanted: PayloadFilter) -> tuple[str, list[Any]]:
    path = json_path(wanted.path)
    value = wanted.value
    if value is None:
        return f"json_type(doc, {path}) = 'null'", []
    if isinstance(value, bool):
        # json_extract reads true as 1 and false as 0: the comparison lets a search
        # attribute's index find them (the type test keeps the numbers 1 and 0 out).
        return (f"json_type(doc, {path}) = '{'true' if value else 'false'}' AND "
                f"{payload_value(wanted.path)} = {int(value)}", [])
    number = isinstance(value, (int, float))
    kinds = "('integer', 'real')" if number else "('text')"
    found = payload_value(wanted.path)
    clause = f"json_type(doc, {path}) IN {kinds} AND {found} {_SQL_OPERATORS[wanted.op]} ?"
    if wanted.op != "eq":
        # The other end of the range: where the kind's values end in SQLite's order (NULL,
        # numbers, text, blobs). It holds for every value of the kind, so it changes no
        # answer; with both ends a search attribute's index reads only that kind's values,
        # and SQLite takes it rather than every row in id order.
        clause += f" AND {found} {_KIND_ENDS[number, wanted.op]}"
    elif not number:
        # A document holding this string spells it as `spelled` does: one without that text
        # cannot match, and looking for text costs half of reading the JSON (a day's scan
        # of 1 M rows by an undeclared field: 1.3 s instead of 2.6 s). Without its closing
        # quote: SQLite reads a string only up to a NUL, so "x" is also "x\u0000y".
        return f"instr(doc, ?) > 0 AND {clause}", [spelled(value)[:-1], value]
    return clause, [value]


def document(view: Mapping[str, Any]) -> str:
    """A row's document: the JSON of a job's view, each string in it spelled as `spelled`
    spells it (the search above relies on it). orjson: 1.7 us a job against 14 us for the
    standard library's, on every member for every job that leaves; they spell strings alike
    (a test holds them to it), and the standard one takes what orjson refuses (an integer
    beyond 64 bits)."""
    try:
        return orjson.dumps(view).decode()
    except TypeError:
        return json.dumps(view, separators=(",", ":"), ensure_ascii=False)


def spelled(text: str) -> str:
    return orjson.dumps(text).decode()


_KIND_ENDS = {
    (True, "gte"): "< ''",  # every number sorts before every text
    (True, "lte"): ">= -9e999",  # minus infinity
    (False, "gte"): "< x''",  # every text sorts before every blob
    (False, "lte"): ">= ''",
}
