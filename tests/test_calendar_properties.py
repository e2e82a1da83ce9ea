"""Properties of scheduler.calendar over random cron expressions, zones and start times.

The oracles are independent of the code under test:
- croniter iterating naive datetimes (pure calendar arithmetic) for which wall times an
  expression matches, checked in UTC where wall time is real time;
- a wall-clock oracle written here from zoneinfo alone: each candidate wall time in a window is
  mapped to instants with fold=0/1 and a round trip (a gap time has none, a repeated time two),
  then the DST rules of DESIGN.md section 3 are applied as stated.
Zone transitions (for picking start times near them) are found here by probing zoneinfo.
"""

import functools
import io
from datetime import UTC, datetime, timedelta
from importlib import resources
from zoneinfo import ZoneInfo

import pytest
from croniter import CroniterBadDateError, croniter
from hypothesis import assume, given
from hypothesis import strategies as st

from raftcron.scheduler.calendar import (
    NOTE_FIRST,
    NOTE_MOVED,
    RecurrenceError,
    count_fire_times_ms,
    describe_fire,
    fire_times_ms,
    load_zone,
    next_fire_ms,
    parse_cron,
    parse_duration_ms,
    parse_every,
)
from raftcron.scheduler.timezones import timeline_of

DST_ZONES = [
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "Africa/Cairo",
    "America/Santiago",
    "Australia/Sydney",
    "America/Havana",
]
MINUTE_MS, HOUR_MS = 60_000, 3_600_000
EPOCH = datetime(1970, 1, 1)
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
WEEKDAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


# ------------------------------------------------------------------- zones, independently


@functools.cache
def tzdata_zone(name: str) -> ZoneInfo:
    data = resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).read_bytes()
    return ZoneInfo.from_file(io.BytesIO(data), key=name)


def offset_ms(zone: ZoneInfo, instant_ms: int) -> int:
    moment = datetime.fromtimestamp(instant_ms // 1000, UTC).astimezone(zone)
    return int(moment.utcoffset().total_seconds()) * 1000


@functools.cache
def transitions(name: str) -> list[tuple[int, int, int]]:
    """(instant_ms, offset before, offset after) of every transition in 2024-2030 (these
    zones change at most twice a year, so probing once a day finds them all)."""
    zone, found, day_ms = tzdata_zone(name), [], 24 * HOUR_MS
    at = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp()) * 1000
    end = int(datetime(2031, 1, 1, tzinfo=UTC).timestamp()) * 1000
    while at < end:
        if offset_ms(zone, at) != offset_ms(zone, at + day_ms):
            low, high = at, at + day_ms
            while high - low > 1000:
                middle = (low + high) // 2000 * 1000
                same = offset_ms(zone, middle) == offset_ms(zone, low)
                low, high = (middle, high) if same else (low, middle)
            found.append((high, offset_ms(zone, low), offset_ms(zone, high)))
        at += day_ms
    return found


def local_wall(zone: ZoneInfo, instant_ms: int) -> datetime:
    return (datetime.fromtimestamp(instant_ms // 1000, UTC).astimezone(zone)).replace(tzinfo=None)


def to_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


# ------------------------------------------------------------------------ cron strategies


def field_items(low: int, high: int, top: int, names: list[str] | None = None):
    value = st.integers(low, high)
    pair = st.tuples(value, value).filter(lambda p: p[0] < p[1])
    kinds = [
        value.map(str),
        pair.map(lambda p: f"{p[0]}-{p[1]}"),
        st.integers(1, top - low + 2).map(lambda n: f"*/{n}"),
        st.tuples(pair, st.integers(1, 12)).map(lambda p: f"{p[0][0]}-{p[0][1]}/{p[1]}"),
        st.tuples(st.integers(low, top), st.integers(1, 20)).map(lambda p: f"{p[0]}/{p[1]}"),
    ]
    if names:
        named = st.tuples(st.sampled_from(names), st.sampled_from(names))
        kinds.append(st.sampled_from(names))
        kinds.append(named.filter(lambda p: names.index(p[0]) < names.index(p[1])).map("-".join))
    return st.one_of(kinds)


def field(low: int, high: int, top: int | None = None, names: list[str] | None = None):
    items = st.lists(
        field_items(low, high, high if top is None else top, names), min_size=1, max_size=3
    )
    return st.one_of(st.just("*"), items.map(",".join))


NTH_WEEKDAYS = st.lists(
    st.tuples(st.sampled_from(WEEKDAYS), st.integers(1, 5)), min_size=1, max_size=2
).map(lambda pairs: ",".join(f"{day}#{week}" for day, week in pairs))
# Day fields that start with '*' but do not cover every day ('*/2'): crontab(5) reads them as
# unrestricted, so the other day field must match too (DESIGN.md §8.5).
STARRED_DAYS = st.sampled_from(["*/2", "*/3,15", "*/10", "*/2,4"])
FIELD_STRATEGIES = (
    field(0, 59),  # second
    field(0, 59),  # minute
    field(0, 23),  # hour
    st.one_of(field(1, 31), st.sampled_from(["L", "1,L", "?", "15,L"]), STARRED_DAYS),
    field(1, 12, names=MONTHS),
    st.one_of(field(0, 7, top=6, names=WEEKDAYS), st.just("?"), st.sampled_from(["*/2", "*/3"])),
)


@st.composite
def cron_expressions(draw) -> str:
    """Any expression this module accepts: numbers, names, ranges, lists, steps, L, #, ?."""
    second, minute, hour, dom, month, dow = (draw(strategy) for strategy in FIELD_STRATEGIES)
    if draw(st.integers(0, 9)) == 0:
        dom, dow = "*", draw(NTH_WEEKDAYS)
    fields = [minute, hour, dom, month, dow]
    return " ".join([second, *fields] if draw(st.booleans()) else fields)


def crontab_for_croniter(expr: str) -> tuple[str, bool]:
    """The expression and `day_or` with which croniter follows crontab(5)'s day rule: both
    day fields must match when either starts with '*' (or is '?'), else either may. croniter
    ORs only when neither field expands to '*', and it expands a field covering every day
    to '*' when the other holds a '*' ('1-31' beside '1,*/2'): then every day matches."""
    fields = expr.split()
    dom, dow = fields[-3].lower(), fields[-1].lower()
    if dom.startswith(("*", "?")) or dow.startswith(("*", "?")):
        return expr, False
    expanded = croniter.expand(expr, second_at_beginning=len(fields) == 6)[0]
    if expanded[2] == ["*"] or expanded[4] == ["*"]:
        fields[-3] = fields[-1] = "*"
        return " ".join(fields), False
    return expr, True


def expand(text: str, low: int, top: int) -> set[int]:
    """The test's own expansion of a time-of-day field (numbers, ranges, steps, lists, *)."""
    values: set[int] = set()
    for item in text.split(","):
        base, _, step = item.partition("/")
        if base == "*":
            first, last = low, top
        elif "-" in base:
            first, last = (int(part) for part in base.split("-"))
        else:
            first = int(base)
            last = top if step else first
        values.update(range(first, last + 1, int(step or 1)))
    return values


def fixed_items(values: list[int]):
    """Numbers and ranges only: a fixed field (no '*', no step)."""
    single = st.sampled_from(values).map(str)
    pair = st.tuples(st.sampled_from(values), st.sampled_from(values)).filter(lambda p: p[0] < p[1])
    items = st.one_of(single, single, pair.map(lambda p: f"{p[0]}-{p[1]}"))
    return st.lists(items, min_size=1, max_size=3).map(",".join)


def wildcard_items(low: int, high: int, values: list[int]):
    items = st.one_of(st.sampled_from(values).map(str), field_items(low, high, high))
    return st.one_of(st.just("*"), st.lists(items, min_size=1, max_size=3).map(",".join))


@st.composite
def dst_cases(draw):
    """A zone, one of its transitions, a start near it, and a time-of-day cron (fixed or
    wildcard, half each) whose hours and minutes cluster around the transition's wall times."""
    zone_name = draw(st.sampled_from(DST_ZONES))
    instant, before, after = draw(st.sampled_from(transitions(zone_name)))
    has_seconds = draw(st.booleans())
    walls = [(instant + offset) // MINUTE_MS for offset in (before, after)]  # local, in minutes
    inside = min(walls) + draw(st.integers(0, abs(walls[0] - walls[1]) - 1))  # in the gap/repeat
    hours = sorted({(wall // 60 + d) % 24 for wall in [*walls, inside] for d in (-1, 0, 1)})
    minutes = sorted({wall % 60 for wall in [*walls, inside]} | {0, 15, 30, 45, 59})
    seconds = [0, 1, 30, 59]
    if draw(st.sampled_from(["fixed", "wildcard"])) == "fixed":  # numbers and ranges only
        hour = draw(st.one_of(st.just(str(inside // 60 % 24)), fixed_items(hours)))
        minute = draw(st.one_of(st.just(str(inside % 60)), fixed_items(minutes)))
        second = draw(fixed_items(seconds))
    else:
        hour, minute = draw(wildcard_items(0, 23, hours)), draw(wildcard_items(0, 59, minutes))
        second = draw(st.one_of(st.integers(5, 30).map(lambda n: f"*/{n}"), fixed_items(seconds)))
    second = second if has_seconds else "0"
    window_ms = 90 * MINUTE_MS if has_seconds else 6 * HOUR_MS
    start = instant + draw(st.integers(-window_ms * 9 // 10, window_ms // 4))
    expr = f"{second} {minute} {hour} * * *" if has_seconds else f"{minute} {hour} * * *"
    sets = (expand(second, 0, 59), expand(minute, 0, 59), expand(hour, 0, 23))
    return zone_name, expr, sets, start, start + window_ms


def oracle_fires(zone_name: str, expr: str, sets, after_ms: int, until_ms: int) -> list[int]:
    """Fire instants in (after_ms, until_ms] by the DST rules, from zoneinfo alone."""
    zone = tzdata_zone(zone_name)
    seconds, minutes, hours = sets
    real_time = any(
        c in part for part in expr.split()[: 3 if len(expr.split()) == 6 else 2] for c in "*/"
    )
    changes = [
        (t, b, a) for t, b, a in transitions(zone_name) if after_ms - 2 * HOUR_MS < t <= until_ms
    ]
    offsets = [offset_ms(zone, after_ms)] + [a for _, _, a in changes]
    step_ms = 1000 if len(expr.split()) == 6 else MINUTE_MS
    wall_ms = (after_ms + min(offsets)) // step_ms * step_ms
    fires: set[int] = set()
    while wall_ms <= until_ms + max(offsets):
        wall = EPOCH + timedelta(milliseconds=wall_ms)
        if wall.second in seconds and wall.minute in minutes and wall.hour in hours:
            shown = [wall.replace(tzinfo=zone, fold=fold) for fold in (0, 1)]
            real = sorted({to_ms(m) for m in shown if local_wall(zone, to_ms(m)) == wall})
            if real_time:
                fires.update(real)
            elif real:
                fires.add(real[0])  # the first occurrence only
            else:  # a gap: the end of the gap, which lies between the two readings
                low, high = sorted(to_ms(m) for m in shown)
                fires.update(t for t, b, a in changes if low < t <= high and a > b)
        wall_ms += step_ms
    return sorted(fire for fire in fires if after_ms < fire <= until_ms)


# ----------------------------------------------------------------------------- properties

UTC_ZONE = load_zone("UTC")


@given(
    expr=cron_expressions(),
    start_ms=st.integers(
        to_ms(datetime(1990, 1, 1, tzinfo=UTC)), to_ms(datetime(2150, 1, 1, tzinfo=UTC))
    ),
)
def test_wall_times_agree_with_croniter(expr, start_ms):
    has_seconds = len(expr.split()) == 6
    start = EPOCH + timedelta(milliseconds=start_ms)
    oracle_expr, day_or = crontab_for_croniter(expr)
    try:
        cron = parse_cron(expr)
    except RecurrenceError as error:
        assert "can never fire" in str(error)
        with pytest.raises(CroniterBadDateError):
            croniter(
                oracle_expr, start, day_or=day_or, second_at_beginning=has_seconds,
                max_years_between_matches=400,
            ).get_next(datetime)
        return
    expected = croniter(oracle_expr, start, day_or=day_or, second_at_beginning=has_seconds)
    after_ms = start_ms
    for _ in range(4):
        after_ms = next_fire_ms(cron, UTC_ZONE, after_ms)
        assert EPOCH + timedelta(milliseconds=after_ms) == expected.get_next(datetime)


@given(case=dst_cases())
def test_fire_times_match_the_wall_clock_oracle_near_dst_transitions(case):
    zone_name, expr, sets, after_ms, until_ms = case
    fires = fire_times_ms(parse_cron(expr), load_zone(zone_name), after_ms, until_ms, 100_000)
    assert fires == oracle_fires(zone_name, expr, sets, after_ms, until_ms)


@given(case=dst_cases())
def test_counted_fire_times_match_the_oracle_near_dst_transitions(case):
    zone_name, expr, sets, after_ms, until_ms = case
    cron = parse_cron(expr)
    count = count_fire_times_ms(cron, load_zone(zone_name), after_ms, until_ms)
    crosses = any(after_ms < t <= until_ms for t, _, _ in transitions(zone_name))
    if count is None:  # only a fixed time across an offset change is left to listing
        assert not cron.follows_real_time and crosses
    else:
        assert count == len(oracle_fires(zone_name, expr, sets, after_ms, until_ms))


@given(
    expr=cron_expressions(),
    zone_name=st.sampled_from([*DST_ZONES, "UTC", "Asia/Tokyo"]),
    data=st.data(),
)
def test_counted_fire_times_equal_the_listed_ones_and_add_up(expr, zone_name, data):
    try:
        cron = parse_cron(expr)
    except RecurrenceError:
        assume(False)
    zone = load_zone(zone_name)
    after_ms = data.draw(st.integers(to_ms(datetime(1990, 1, 1)), to_ms(datetime(2190, 1, 1))))
    middle_ms = after_ms + data.draw(st.integers(0, 40 * 86_400_000))
    until_ms = middle_ms + data.draw(st.integers(0, 40 * 86_400_000))
    count = count_fire_times_ms(cron, zone, after_ms, until_ms)
    if count is None:
        assert not cron.follows_real_time
        return
    listed = fire_times_ms(cron, zone, after_ms, until_ms, 20_001)
    assert count == len(listed) if len(listed) <= 20_000 else count > 20_000
    halves = [
        count_fire_times_ms(cron, zone, *span)
        for span in ((after_ms, middle_ms), (middle_ms, until_ms))
    ]
    if None not in halves:
        assert count == halves[0] + halves[1]


@given(
    interval_ms=st.integers(1, 10**9),
    anchor_ms=st.integers(-(10**12), 10**13),
    after_ms=st.integers(0, 10**13),
    span_ms=st.integers(0, 10**10),
)
def test_counted_every_times_equal_the_listed_ones(interval_ms, anchor_ms, after_ms, span_ms):
    every = parse_every(interval_ms, anchor_ms=anchor_ms)
    count = count_fire_times_ms(every, UTC_ZONE, after_ms, after_ms + span_ms)
    listed = fire_times_ms(every, UTC_ZONE, after_ms, after_ms + span_ms, 10_001)
    assert count == len(listed) if len(listed) <= 10_000 else count > 10_000


@given(expr=cron_expressions(), zone_name=st.sampled_from(DST_ZONES), data=st.data())
def test_chained_next_fire_equals_fire_times_and_strictly_increases(expr, zone_name, data):
    try:
        cron = parse_cron(expr)
    except RecurrenceError:
        assume(False)
    instant, _, _ = data.draw(st.sampled_from(transitions(zone_name)))
    after_ms = instant + data.draw(st.integers(-3 * 86_400_000, 86_400_000))
    zone = load_zone(zone_name)
    fires = fire_times_ms(cron, zone, after_ms, after_ms + 800 * 86_400_000, 12)
    chained, at = [], after_ms
    while len(chained) < len(fires):
        at = next_fire_ms(cron, zone, at)
        chained.append(at)
    assert chained == fires
    assert all(a < b for a, b in zip([after_ms, *fires], fires, strict=False))
    gaps = {t for t, before, after in transitions(zone_name) if after > before}
    has_seconds = len(expr.split()) == 6
    for fire in fires:
        wall = local_wall(tzdata_zone(zone_name), fire)
        oracle_expr, day_or = crontab_for_croniter(expr)
        matches = croniter.match(
            oracle_expr, wall, day_or=day_or, second_at_beginning=has_seconds
        ) and (
            has_seconds or wall.second == 0
        )
        assert matches or (not cron.follows_real_time and fire in gaps), (fire, wall)
    if not cron.follows_real_time:
        walls = [local_wall(tzdata_zone(zone_name), fire) for fire in fires]
        assert len(set(walls)) == len(walls)  # a fixed time never fires twice


@given(zone_name=st.sampled_from(DST_ZONES), data=st.data())
def test_a_fixed_time_in_a_gap_fires_exactly_at_the_end_of_the_gap(zone_name, data):
    gaps = [(t, b, a) for t, b, a in transitions(zone_name) if a > b]
    instant, before, after = data.draw(st.sampled_from(gaps))
    wall = local_wall(tzdata_zone(zone_name), instant - 1000) + timedelta(seconds=1)  # gap start
    wall += timedelta(seconds=data.draw(st.integers(0, (after - before) // 1000 - 1)))
    expr = f"{wall.second} {wall.minute} {wall.hour} * * *"
    if wall.second == 0 and data.draw(st.booleans()):
        expr = f"{wall.minute} {wall.hour} * * *"
    cron, zone = parse_cron(expr), load_zone(zone_name)
    after_ms = instant - data.draw(st.integers(1, 20 * HOUR_MS))
    assert next_fire_ms(cron, zone, after_ms) == instant
    assert describe_fire(cron, zone, instant)[1] == NOTE_MOVED


@given(zone_name=st.sampled_from(DST_ZONES), data=st.data())
def test_a_repeated_time_fires_twice_if_wildcard_and_once_if_fixed(zone_name, data):
    repeats = [(t, b, a) for t, b, a in transitions(zone_name) if a < b]
    instant, before, after = data.draw(st.sampled_from(repeats))
    first_wall = local_wall(tzdata_zone(zone_name), instant)  # the repeat starts here
    wall = first_wall + timedelta(
        minutes=data.draw(st.integers(0, (before - after) // MINUTE_MS - 1))
    )
    zone, window = load_zone(zone_name), (instant - 3 * HOUR_MS, instant + 3 * HOUR_MS)
    first, second = (
        to_ms(wall.replace(tzinfo=UTC)) - before,
        to_ms(wall.replace(tzinfo=UTC)) - after,
    )
    wildcard = fire_times_ms(parse_cron(f"{wall.minute} * * * *"), zone, *window, 100)
    assert first in wildcard and second in wildcard
    fixed = parse_cron(f"{wall.minute} {wall.hour} * * *")
    assert [f for f in fire_times_ms(fixed, zone, *window, 100) if f in (first, second)] == [first]
    assert describe_fire(fixed, zone, first)[1] == NOTE_FIRST


@given(
    interval_ms=st.integers(1, 10**9),
    anchor_ms=st.integers(-(10**12), 10**13),
    after_ms=st.integers(0, 10**13),
)
def test_every_fires_on_its_grid_and_chains(interval_ms, anchor_ms, after_ms):
    every = parse_every(interval_ms, anchor_ms=anchor_ms)
    fires = fire_times_ms(every, UTC_ZONE, after_ms, after_ms + 20 * interval_ms, 50)
    assert len(fires) == 20
    assert fires[0] > after_ms >= fires[0] - interval_ms
    assert all((fire - anchor_ms) % interval_ms == 0 for fire in fires)
    assert next_fire_ms(every, UTC_ZONE, after_ms) == fires[0]


@given(
    parts=st.lists(st.integers(0, 99), min_size=5, max_size=5),
    keep=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_durations_add_up_their_parts(parts, keep):
    units = [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)]
    chosen = [
        (number, unit, size)
        for number, (unit, size), k in zip(parts, units, keep, strict=True)
        if k
    ]
    total = sum(number * size for number, _, size in chosen)
    assume(total > 0)
    text = " ".join(f"{number}{unit}" for number, unit, _ in chosen)
    assert parse_duration_ms(text, field="every") == total
    assert parse_duration_ms(text.replace(" ", ""), field="every") == total


@given(
    zone_name=st.sampled_from([*DST_ZONES, "Pacific/Apia", "Asia/Tokyo", "UTC", "Europe/Dublin"]),
    instant_ms=st.integers(-2_208_988_800_000, 7_258_118_399_999),  # 1900 .. 2199
)
def test_zone_timeline_segments_agree_with_zoneinfo(zone_name, instant_ms):
    timeline = timeline_of(zone_name)
    segment = timeline.segment(instant_ms)
    zone = tzdata_zone(zone_name)
    assert segment.start_ms <= instant_ms < segment.end_ms
    assert segment.offset_ms == offset_ms(zone, instant_ms)
    for edge in (segment.start_ms, segment.end_ms):
        if abs(edge) < 2**60:  # a real transition: the offset changes there
            assert offset_ms(zone, edge - 1000) != offset_ms(zone, edge)
