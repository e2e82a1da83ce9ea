"""Search attributes in the core (scheduler/settings.py, DESIGN.md §9.2): the payload paths every
member's archive indexes are a replicated setting like the others: refused before the upgrade
gate opens, replaced whole after, shown by `GET /v1/settings`, the same after the wire and a
snapshot, and validated naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from raftcron.scheduler import codec
from raftcron.scheduler.driver import Driver, Refused
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.gate import Finalize, PutSettings
from raftcron.scheduler.settings import (
    SEARCH_ATTRIBUTES_MAX,
    SearchAttributes,
    Settings,
    parse_section,
)
from raftcron.scheduler.snapshot import digest, restore, snapshot
from raftcron.scheduler.views import settings_view


def test_search_attributes_are_refused_before_the_gate_and_replaced_whole_after() -> None:
    d = Driver()
    with pytest.raises(Refused) as refused:
        d.put_settings("search_attributes", {"paths": ["customer.id"]})
    assert refused.value.code == "not_finalized"
    assert settings_view(d.state)["search_attributes"] is None
    assert d.state.settings.search_attributes.paths == ()  # what the writer is handed

    d.finalize()
    assert settings_view(d.state)["search_attributes"] == {"paths": []}
    d.put_settings("search_attributes", {"paths": ["invoice.number", "customer.id"]})
    assert settings_view(d.state)["search_attributes"] == {
        "paths": ["customer.id", "invoice.number"]}  # name order, whatever order was sent
    d.put_settings("search_attributes", {"paths": ["region"]})
    assert d.state.settings.search_attributes == SearchAttributes(("region",))
    assert d.state.settings.archive == Settings().archive  # the other sections stay


def test_a_new_cluster_seeds_its_search_attributes_from_the_config() -> None:
    d = Driver()
    d.finalize(search_attributes={"paths": ["customer.id"]})
    assert d.state.settings.search_attributes.paths == ("customer.id",)


def test_search_attributes_are_the_same_after_the_wire_and_a_snapshot() -> None:
    attributes = SearchAttributes(("a-b.c_d", "customer.id"))
    put = PutSettings("put-1", "search_attributes", attributes)
    assert codec.decode(codec.encode(put)) == put
    finalize = Finalize("fin-1", settings=Settings(search_attributes=attributes))
    assert codec.decode(codec.encode(finalize)) == finalize

    d = Driver()
    d.finalize()
    d.put_settings("search_attributes", attributes.to_wire())
    copy = restore(snapshot(d.state))
    assert copy.settings.search_attributes == attributes
    assert digest(copy) == digest(d.state)


@pytest.mark.parametrize("value, field", [
    ({"paths": "customer.id"}, "search_attributes.paths"),
    ({"paths": ["customer id"]}, "search_attributes.paths[0]"),
    ({"paths": ["ok", "a..b"]}, "search_attributes.paths[1]"),
    ({"paths": [".a"]}, "search_attributes.paths[0]"),
    ({"paths": ["a'b"]}, "search_attributes.paths[0]"),
    ({"paths": ['a"b']}, "search_attributes.paths[0]"),
    ({"paths": ["a\n"]}, "search_attributes.paths[0]"),
    ({"paths": ["$.a"]}, "search_attributes.paths[0]"),
    ({"paths": [".".join("x" * 9)]}, "search_attributes.paths[0]"),
    ({"paths": ["x" * 65]}, "search_attributes.paths[0]"),
    ({"paths": [".".join(["x" * 64] * 4)]}, "search_attributes.paths[0]"),  # 259 characters
    ({"paths": [""]}, "search_attributes.paths[0]"),
    ({"paths": [42]}, "search_attributes.paths[0]"),
    ({"paths": ["a", "b", "a"]}, "search_attributes.paths[2]"),
    ({"paths": [f"p{n}" for n in range(SEARCH_ATTRIBUTES_MAX + 1)]}, "search_attributes.paths"),
    ({"path": ["a"]}, "search_attributes.path"),
    ([], "search_attributes"),
])
def test_a_search_attribute_it_cannot_index_is_refused_naming_the_field(
        value: Any, field: str) -> None:
    with pytest.raises(Invalid) as refused:
        parse_section("search_attributes", value)
    assert refused.value.field == field


def test_the_most_a_setting_holds_is_accepted() -> None:
    # 16 paths of 4 names of 62 characters: 251 characters each.
    paths = [".".join([f"{n:02d}" + "x" * 60] * 4) for n in range(SEARCH_ATTRIBUTES_MAX)]
    parsed = parse_section("search_attributes", {"paths": paths})
    assert isinstance(parsed, SearchAttributes) and len(parsed.paths) == SEARCH_ATTRIBUTES_MAX
