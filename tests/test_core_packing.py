"""scheduler/packing.py: `to_msgpack` gives the bytes `msgpack.packb(..., use_bin_type=True)`
gives (records, fingerprints and log entries must not change), small values and values far
past its starting buffer alike."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from raftcron.scheduler.packing import packer, to_msgpack

SCALARS = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
           | st.floats(allow_nan=False) | st.text() | st.binary())
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
                      max_leaves=40)


@settings(max_examples=300)
@given(VALUES)
def test_the_bytes_are_packb_s(value: Any) -> None:
    assert to_msgpack(value) == msgpack.packb(value, use_bin_type=True)


def test_values_past_the_starting_buffer_pack_whole() -> None:
    for size in (1023, 1024, 1025, 70_000, 300_000):
        value = {"blob": b"x" * size, "text": "y" * size, "list": list(range(size // 100))}
        assert to_msgpack(value) == msgpack.packb(value, use_bin_type=True)


@settings(max_examples=100)
@given(st.lists(VALUES, min_size=1, max_size=8))
def test_one_packer_for_many_values_gives_each_value_s_own_bytes(values: list[Any]) -> None:
    # The freezer packs every job a command finished with one Packer: each record's bytes
    # must not depend on what was packed before it (a record larger than the buffer included).
    pack = packer().pack
    values = [*values, {"blob": b"x" * 5_000}, *values]
    assert [pack(value) for value in values] == [to_msgpack(value) for value in values]
