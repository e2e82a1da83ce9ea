"""Cron's day fields as crontab(5) states them (DESIGN.md §8.5), and the schedules put before.

crontab(5): "If both fields are restricted (i.e., do not start with *), the command will be run
when either field matches the current time." So a day field that starts with `*` (`*/2`
included) makes both fields required. raftcron 0.1 called a field restricted unless it covered
every day, so `0 0 */2 * 1` fired on odd days OR Mondays; a schedule put then keeps that
meaning (`day_rule: croniter`), because a replica replaying its old log entries must fire
exactly what the others fired from them.

The counting oracle here is independent of the code under test: whether a day matches is
written out from the rule's words with `datetime`, and a matching day holds the product of
the time sets.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import msgpack
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from raftcron.scheduler import codec, snapshot
from raftcron.scheduler.calendar import (
    RecurrenceError,
    count_fire_times_ms,
    fire_times_ms,
    load_zone,
    parse_cron,
)
from raftcron.scheduler.commands import PutSchedule
from raftcron.scheduler.cronexpr import CRONITER, CRONTAB, day_rules_differ
from raftcron.scheduler.driver import Driver
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.schedulespec import ScheduleSpec

UTC_ZONE = load_zone("UTC")
DAY_MS = 86_400_000


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def days(expr: str, rule: str = CRONTAB, *, start: str = "2026-01-01", count: int = 6) -> list[str]:
    fires = fire_times_ms(parse_cron(expr, rule), UTC_ZONE, ms(start) - 1, ms("2030-01-01"), count)
    return [datetime.fromtimestamp(f / 1000, UTC).strftime("%a %Y-%m-%d") for f in fires]


# 2026-01-01 is a Thursday.
@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        # '*/2' starts with '*': odd days that are also Mondays.
        ("0 0 */2 * 1", ["Mon 2026-01-05", "Mon 2026-01-19", "Mon 2026-02-09",
                         "Mon 2026-02-23", "Mon 2026-03-09", "Mon 2026-03-23"]),
        # Both restricted: the 13th OR a Friday.
        ("0 0 13 * 5", ["Fri 2026-01-02", "Fri 2026-01-09", "Tue 2026-01-13",
                        "Fri 2026-01-16", "Fri 2026-01-23", "Fri 2026-01-30"]),
        # '1-31' does not start with '*': restricted, so every day matches (either field).
        ("0 0 1-31 * 1", ["Thu 2026-01-01", "Fri 2026-01-02", "Sat 2026-01-03",
                          "Sun 2026-01-04", "Mon 2026-01-05", "Tue 2026-01-06"]),
        # '*/1' starts with '*': Mondays only.
        ("0 0 */1 * 1", ["Mon 2026-01-05", "Mon 2026-01-12", "Mon 2026-01-19",
                         "Mon 2026-01-26", "Mon 2026-02-02", "Mon 2026-02-09"]),
        # A starred day-of-week: the last day of the month when it is a Sun, Tue, Thu or Sat.
        ("0 0 L * */2", ["Sat 2026-01-31", "Sat 2026-02-28", "Tue 2026-03-31",
                         "Thu 2026-04-30", "Sun 2026-05-31", "Tue 2026-06-30"]),
        ("0 0 ? * 1", ["Mon 2026-01-05", "Mon 2026-01-12", "Mon 2026-01-19",
                       "Mon 2026-01-26", "Mon 2026-02-02", "Mon 2026-02-09"]),
        # Six fields; day-of-month 1, 16 and 31 that are Saturdays.
        ("0 0 0 */15 * sat", ["Sat 2026-01-31", "Sat 2026-05-16", "Sat 2026-08-01",
                              "Sat 2026-10-31", "Sat 2027-01-16", "Sat 2027-05-01"]),
    ],
)
def test_crontab_day_rule(expr: str, expected: list[str]) -> None:
    assert days(expr) == expected


def test_a_starred_day_field_makes_both_required_where_0_1_fired_either() -> None:
    assert days("0 0 */2 * 1", CRONITER) == [
        "Thu 2026-01-01", "Sat 2026-01-03", "Mon 2026-01-05", "Wed 2026-01-07",
        "Fri 2026-01-09", "Sun 2026-01-11",
    ]
    assert days("0 0 */1 * 1", CRONITER)[:3] == ["Thu 2026-01-01", "Fri 2026-01-02",
                                                  "Sat 2026-01-03"]


@pytest.mark.parametrize(
    ("expr", "differ"),
    [
        ("0 0 * * *", False), ("0 0 * * 1", False), ("0 0 13 * 5", False),
        ("0 0 1-31 * 1", False), ("@weekly", False), ("0 0 L * 1", False),
        ("0 0 */2 * 1", True), ("0 0 */1 * 1", True), ("0 0 L * */2", True),
        ("0 0 1 * */3", True), ("0 0 0 */15 * sat", True),
    ],
)
def test_the_rules_differ_only_where_a_restricted_looking_field_starts_with_a_star(
    expr: str, differ: bool
) -> None:
    assert day_rules_differ(expr) is differ


# ------------------------------------------------------------------------ counting, by oracle

DOM_TEXTS = st.sampled_from(["*", "?", "*/2", "*/3,15", "*/10", "1", "13", "1-31", "L",
                             "1,L", "5-20/5", "*/1"])
DOW_TEXTS = st.sampled_from(["*", "?", "*/2", "*/3", "1", "5", "0-6", "mon-fri", "sat,sun",
                             "1,*/3", "*/1"])
WEEKDAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


def _values(text: str, low: int, high: int, names: list[str] | None = None) -> set[int]:
    """The test's own expansion of a day field: numbers, names, ranges, steps, lists."""
    out: set[int] = set()
    for item in text.lower().split(","):
        base, _, step = item.partition("/")
        if base in ("*", "?"):
            first, last = low, high
        elif "-" in base:
            first, last = (_number(part, names) for part in base.split("-"))
        else:
            first = _number(base, names)
            last = high if step else first
        out.update(range(first, last + 1, int(step or 1)))
    return out


def _number(text: str, names: list[str] | None) -> int:
    return names.index(text) if names and text in names else int(text)


def oracle_day_matches(dom_text: str, dow_text: str, rule: str, day: date) -> bool:
    """crontab(5)'s words: a field is restricted unless it starts with '*' ('?' alike); both
    restricted: either matches, else both must (0.1's rule: restricted unless it covers all)."""
    last = (day.replace(day=28) + timedelta(days=4)).replace(day=1) - timedelta(days=1)
    dom_items = [item for item in dom_text.split(",") if item != "L"]
    dom_ok = (day.day in _values(",".join(dom_items), 1, 31) if dom_items else False) or (
        "L" in dom_text.split(",") and day == last
    )
    weekday = (day.weekday() + 1) % 7
    dow_ok = weekday in {v % 7 for v in _values(dow_text, 0, 6, WEEKDAYS)}
    if rule == CRONTAB:
        both = dom_text.startswith(("*", "?")) or dow_text.startswith(("*", "?"))
    else:
        full_dom = _values(",".join(dom_items), 1, 31) == set(range(1, 32)) if dom_items else False
        full_dow = {v % 7 for v in _values(dow_text, 0, 6, WEEKDAYS)} == set(range(7))
        dom_star = dom_text in ("*", "?") or (full_dom and "L" not in dom_text and "*" in dow_text)
        dow_star = dow_text in ("*", "?") or (full_dow and "*" in dom_text)
        both = dom_star or dow_star
    return (dom_ok and dow_ok) if both else (dom_ok or dow_ok)


@given(
    dom=DOM_TEXTS,
    dow=DOW_TEXTS,
    hours=st.sampled_from(["0", "*/6", "9-17", "*"]),
    rule=st.sampled_from([CRONTAB, CRONITER]),
    after_ms=st.integers(ms("2000-01-01"), ms("2150-01-01")),
    span_ms=st.integers(0, 200 * DAY_MS),
)
def test_counted_fire_times_match_the_day_oracle_and_the_listed_times(
    dom: str, dow: str, hours: str, rule: str, after_ms: int, span_ms: int
) -> None:
    expr = f"30 {hours} {dom} * {dow}"
    cron = parse_cron(expr, rule)
    until_ms = after_ms + span_ms
    per_day = sorted(_values(hours, 0, 23))
    expected = 0
    day = datetime.fromtimestamp(after_ms // DAY_MS * DAY_MS / 1000, UTC).date()
    while (day_ms := ms(day.isoformat())) <= until_ms:
        if oracle_day_matches(dom, dow, rule, day):
            expected += sum(after_ms < day_ms + (h * 60 + 30) * 60_000 <= until_ms for h in per_day)
        day += timedelta(days=1)
    assert count_fire_times_ms(cron, UTC_ZONE, after_ms, until_ms) == expected
    assert len(fire_times_ms(cron, UTC_ZONE, after_ms, until_ms, 100_000)) == expected


@given(dom=DOM_TEXTS, dow=DOW_TEXTS, zone=st.sampled_from(["America/New_York", "Asia/Tokyo"]),
       after_ms=st.integers(ms("2020-01-01"), ms("2040-01-01")))
def test_every_listed_fire_is_on_a_day_the_oracle_accepts(
    dom: str, dow: str, zone: str, after_ms: int
) -> None:
    expr = f"*/20 3 {dom} * {dow}"
    try:
        cron = parse_cron(expr)
    except RecurrenceError:
        assume(False)
    tz = load_zone(zone)
    for fire in fire_times_ms(cron, tz, after_ms, after_ms + 90 * DAY_MS, 200):
        local = datetime.fromtimestamp(fire / 1000, tz)
        assert oracle_day_matches(dom, dow, CRONTAB, local.date()), (expr, local)


# ------------------------------------------------------------------ schedules carry their rule


def spec(**fields: object) -> ScheduleSpec:
    return ScheduleSpec.parse({"job": {"task": "t"}, **fields})


def test_a_schedule_put_through_the_api_follows_crontab() -> None:
    put = spec(cron="0 0 */2 * 1")
    assert put.day_rule == CRONTAB
    assert put.to_wire()["day_rule"] == CRONTAB  # named: the rules read this one differently


def test_a_common_expression_is_the_same_command_as_before_the_rule() -> None:
    put = spec(cron="0 0 * * 1")
    assert "day_rule" not in put.to_wire()
    # ... so a wire form without it means the same under either rule.
    assert ScheduleSpec.from_wire(put.to_wire()) == put


def test_a_spec_on_the_wire_without_a_rule_keeps_0_1s_meaning() -> None:
    old = ScheduleSpec.from_wire({"cron": "0 0 */2 * 1", "job": {"task": "t"}})
    assert old.day_rule == CRONITER
    assert old.to_wire()["day_rule"] == CRONITER  # read back and put again: still 0.1's
    assert ScheduleSpec.parse(old.to_wire()) == old


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"every": "1h", "day_rule": "crontab"}, "day_rule: applies to cron schedules only"),
        ({"cron": "0 0 * * 1", "day_rule": "vixie"},
         "day_rule: must be one of crontab, croniter, not 'vixie'"),
        ({"cron": "0 0 * * 1", "day_rule": 1}, "day_rule: must be one of crontab, croniter"),
    ],
)
def test_a_bad_day_rule_is_refused_naming_it(fields: dict[str, object], message: str) -> None:
    with pytest.raises(Invalid) as raised:
        spec(**fields)
    assert str(raised.value).startswith(message)


def _old_put(name: str, expr: str) -> PutSchedule:
    """A PutSchedule as raftcron 0.1 wrote it to the log (no day_rule anywhere)."""
    wire = [1, PutSchedule.TAG, {"request_id": f"old-{name}", "name": name,
                                 "spec": {"cron": expr, "job": {"task": "t"}}}]
    command = codec.decode(msgpack.packb(wire, use_bin_type=True))
    assert isinstance(command, PutSchedule)
    return command


def test_a_replayed_log_entry_fires_what_it_fired_before_and_a_new_put_follows_crontab() -> None:
    start_ms = ms("2026-01-01")
    d = Driver(now_ms=start_ms)
    d.ok(_old_put("old", "0 0 */2 * 1"))
    d.put_schedule("new", cron="0 0 */2 * 1")
    d.tick(start_ms)
    for day in range(1, 22):
        d.tick(start_ms + day * DAY_MS)
    fired = {
        name: [datetime.fromtimestamp(job.fire_time_ms / 1000, UTC).day
               for job in d.state.table if job.schedule == name]
        for name in ("old", "new")
    }
    assert fired["new"] == [5, 19]
    assert fired["old"] == [3, 5, 7, 9, 11, 12, 13, 15, 17, 19, 21]
    # A snapshot keeps each schedule's rule, and a replica rebuilt from it fires the same.
    restored = Driver(snapshot.restore(snapshot.snapshot(d.state)))
    assert restored.state.schedules["old"].spec.day_rule == CRONITER
    assert restored.state.schedules["new"].spec.day_rule == CRONTAB
    for step in (d, restored):
        step.tick(start_ms + 40 * DAY_MS)
    assert snapshot.digest(restored.state) == snapshot.digest(d.state)
