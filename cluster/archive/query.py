"""A job search (`scheduler/search.py`'s `JobFilter`) as SQL over the archive's rows: the same
answers as `JobFilter.matches` gives for the same jobs (tests/archive holds both to it).

Payload paths are written into the SQL as literals (each segment is checked to be letters,
digits, `_` or `-`, and quoted), never bound: SQLite uses an index on an expression only when
a query names the very same expression, and search attributes are such indexes.
"""

from __future__ import annotations

from typing import Any

from raftcron.scheduler.search import JobFilter, PayloadFilter

_SQL_OPERATORS = {"eq": "=", "gte": ">=", "lte": "<="}


def json_path(path: tuple[str, ...]) -> str:
    """The JSON path of a payload field in a row's document, as an SQL string literal."""
    return "'$.payload" + "".join(f'."{segment}"' for segment in path) + "'"


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
        return f"json_type(doc, {path}) = '{'true' if value else 'false'}'", []
    kinds = "('integer', 'real')" if isinstance(value, (int, float)) else "('text')"
    operator = _SQL_OPERATORS[wanted.op]
    return (f"json_type(doc, {path}) IN {kinds} AND json_extract(doc, {path}) {operator} ?",
            [value])
