"""Every config key is described on the reference page (cluster/dev/configabout.py): a key added to
the schema without a description, or a description left for a key that is gone, fails here."""

from __future__ import annotations

from raftcron.cluster import config
from raftcron.cluster.dev import configabout
from raftcron.cluster.dev.docsgen import config_page


def test_every_key_of_the_schema_has_a_description_and_none_is_left_over() -> None:
    keys = {key.path for key in config.KEYS}
    described = set(configabout.ABOUT)
    assert keys - described == set(), "keys without a description in cluster/dev/configabout.py"
    assert described - keys == set(), "descriptions of keys the schema does not have"
    assert all(len(text) > 20 and text.rstrip().endswith(".")
               for text in configabout.ABOUT.values())


def test_the_reference_page_shows_each_description_beside_its_key() -> None:
    page = config_page()
    assert "| file key | variable | kind | default | what it does |" in page
    row = next(line for line in page.splitlines() if line.startswith("| `raft.tick_ms` |"))
    assert "The leader proposes a Tick at least this often" in row
    assert row.count(" | ") == 4  # five cells: the description's text has no bare pipe
