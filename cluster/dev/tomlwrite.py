"""Writing node configs as TOML (the standard library reads TOML but does not write it).

Only what node configs hold: strings, booleans, integers, floats, arrays of those, tables of
them (`[api]`, `[raft]`...), an inline table inside a table (`tokens = {...}`), and arrays of
tables (`[[peers]]`).
"""

from __future__ import annotations

from typing import Any


def toml_value(value: object) -> str:
    """A TOML literal for a str, bool, int or float, an array or an inline table of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as a TOML value")


def dumps(document: dict[str, Any]) -> str:
    """The document as TOML: its plain keys first, then its tables and arrays of tables."""
    lines = [f"{_key(k)} = {toml_value(v)}" for k, v in document.items() if not _is_table(v)]
    for key, value in document.items():
        if isinstance(value, dict):
            lines += ["", f"[{_key(key)}]"]
            lines += [f"{_key(k)} = {toml_value(v)}" for k, v in value.items()]
        elif _is_table(value):
            for table in value:
                lines += ["", f"[[{_key(key)}]]"]
                lines += [f"{_key(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _is_table(value: object) -> bool:
    return isinstance(value, dict) or (
        isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)
    )


def _key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if bare else _string(key)


def _string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped, the rest as is
    (JSON's escapes would write characters beyond U+FFFF as surrogate pairs, which TOML
    refuses)."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'
