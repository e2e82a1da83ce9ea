"""The tools' TOML writer (cluster/dev/tomlwrite.py): what it writes reads back the same, and a
node config written by it loads as the original does."""

import dataclasses
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftcron.cluster import config
from raftcron.cluster.dev import tomlwrite

REPO = Path(__file__).resolve().parent.parent

keys = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8)
scalars = (
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
)
values = scalars | st.lists(scalars, max_size=3)
flat = st.dictionaries(keys, values | st.dictionaries(keys, scalars, max_size=3), max_size=4)
documents = st.dictionaries(
    keys,
    values | st.dictionaries(keys, values, max_size=4) | st.lists(flat, min_size=1, max_size=3),
    max_size=6,
)


@given(documents)
def test_what_it_writes_reads_back_the_same(document):
    assert tomllib.loads(tomlwrite.dumps(document)) == document


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("local-*/n*.toml")))
def test_a_shipped_config_rewritten_loads_as_the_original(path, tmp_path):
    raw = tomllib.loads(path.read_text())
    raw["data_dir"] = str(config.load(path).data_dir)  # the copy lives in another folder
    copy = tmp_path / path.name
    copy.write_text(tomlwrite.dumps(raw))
    original = config.load(path)
    assert dataclasses.replace(config.load(copy), source=original.source) == original


def test_it_refuses_what_a_config_cannot_hold():
    with pytest.raises(TypeError, match="NoneType"):
        tomlwrite.dumps({"a": None})
