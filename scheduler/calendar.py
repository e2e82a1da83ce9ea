"""Recurrences: when a schedule fires.

Owns the three kinds of schedule time (`Cron`, `Every`, `At`), their parsing and validation,
and the arithmetic that turns them into fire instants (`next_fire_ms`, `fire_times_ms`) and
explains one (`describe_fire`). Times are ints of Unix milliseconds; cron resolution is the
second. `Every` (anchor_ms + k * interval_ms) and `At` are elapsed time and ignore DST.

Cron times are wall-clock times in the schedule's zone, with Vixie/ISC cron's DST rules:
- fixed second, minute and hour (`30 2 * * *`, `@daily`): each matching wall time fires once, at
  the first instant the zone's clock reaches it. So a time in a spring-forward gap fires at the
  end of the gap (several times of one gap fire once, together), and a time repeated at
  fall-back fires at its first occurrence only.
- `*` or a step in the second, minute or hour field (and `@hourly`): follows real time, firing
  at every instant whose wall clock matches; gap times are skipped, repeated times fire twice.

Cron's day fields combine as crontab(5) says (both restricted: either matches; either starting
with `*`: both must match), or by raftcron 0.1's rule for schedules put before it; a `Cron`
carries its `day_rule` (see `scheduler.cronexpr`).

Cron expressions are parsed and matched against naive wall times by `scheduler.cronexpr`;
this module maps those wall times to instants through the zone's offsets.

Must not: read a clock, use floats for time, depend on the host's zone or tz database, or keep
state that changes an answer (the caches only memoize). Cron fire times are searched between
1900 and 2200; `next_fire_ms` says None beyond.

Measured on the 2-core dev machine (Python 3.11, warm caches), per next_fire_ms call:
`*/5 * * * *` 4-5 us in UTC or America/New_York; `30 2 * * *` 5 us UTC, 6-9 us New York;
6-field `* * * * * *` 4-5 us UTC, 5-7 us New York; `0 30 2 * * *` 5-7 us UTC, 6-10 us New York.
1,000 schedules each firing every second: ~5 ms per second in all. fire_times_ms with limit
20,000: 4-7 ms for per-second or per-5-minute crons, 15-30 ms for a daily one (55 years of
days). Cold costs, once per process: parse_cron ~0.5 ms per new expression (croniter's check);
a zone's first use ~25 ms (probing its DST rule from its last explicit transition onwards).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from raftcron.scheduler.cronexpr import (
    CRON_YEAR_MAX,
    CRONTAB,
    CronSpec,
    day_rules_differ,
    spec_of,
    split_cron,
)
from raftcron.scheduler.cronexpr import RecurrenceError as RecurrenceError  # re-exported
from raftcron.scheduler.timezones import (
    HORIZON_MS,
    NEG_INF_MS,
    OFFSET_SPAN_MS,
    POS_INF_MS,
    ZoneTimeline,
    find_zone,
    timeline_of,
    zone_names,
)


@dataclass(frozen=True, slots=True)
class Cron:
    expr: str  # normalized text; the source of truth (the flags below are derived from it)
    has_seconds: bool  # 6 fields, seconds first (Quartz / Spring / Dkron)
    follows_real_time: bool  # '*' or '/' in the second, minute or hour field
    # How the day fields combine (cronexpr.DAY_RULES); CRONTAB whenever both rules agree on
    # this expression, so equal timings compare equal whatever rule they were put with.
    day_rule: str = CRONTAB


@dataclass(frozen=True, slots=True)
class Every:
    interval_ms: int
    anchor_ms: int  # fires at anchor_ms + k * interval_ms; 0 aligns "5m" to :00, :05, ...


@dataclass(frozen=True, slots=True)
class At:
    at_ms: int


Recurrence = Cron | Every | At

NOTE_MOVED = "moved to the end of the DST gap"
NOTE_FIRST = "first of two occurrences (DST fall-back); the repeat does not run"
NOTE_SECOND = "second occurrence (DST fall-back)"

_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_EPOCH_ORDINAL = _EPOCH_NAIVE.toordinal()
_ONE_MS = timedelta(milliseconds=1)
_DAY_S = 86400
_CRON_MIN_MS = -2208988800000  # 1900-01-01T00:00:00Z
_AT_MAX_MS = 253402128000000  # 9999-12-30T00:00:00Z: every zone can still show it
_DURATION_MAX_MS = 3650 * 86_400_000


# ---------------------------------------------------------------------------------- durations

_DURATION_RE = re.compile(r"(?:[0-9]{1,12}(?:ms|s|m|h|d) ?)+")
_DURATION_PART_RE = re.compile(r"([0-9]+)(ms|s|m|h|d)")
_UNIT_MS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}


def parse_duration_ms(value: str | int, *, field: str) -> int:
    """'250ms', '30s', '5m', '1h30m', '1h 30m', '2d' (units largest first, each once; whole
    numbers only) or an int of milliseconds. Must be > 0 and at most 3650 days."""
    hint = "(use e.g. 30s, 5m, 1h30m, 250ms)"
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise RecurrenceError(f"{field}: expected a duration {hint}, got {type(value).__name__}")
    if isinstance(value, int):
        if value <= 0:
            raise RecurrenceError(f"{field}: {value} must be a positive number of milliseconds")
        total_ms = value
    else:
        text = " ".join(value.split()) if value.isascii() else ""
        if not _DURATION_RE.fullmatch(text):
            raise RecurrenceError(f"{field}: {value!r} is not a duration {hint}")
        parts = [(int(number), _UNIT_MS[unit]) for number, unit in _DURATION_PART_RE.findall(text)]
        sizes = [size for _, size in parts]
        if sizes != sorted(set(sizes), reverse=True):
            raise RecurrenceError(f"{field}: {value!r} repeats or misorders its units {hint}")
        total_ms = sum(number * size for number, size in parts)
        if total_ms == 0:
            raise RecurrenceError(f"{field}: {value!r} must be greater than zero")
    if total_ms > _DURATION_MAX_MS:
        raise RecurrenceError(f"{field}: {value!r} is longer than the maximum of 3650d")
    return total_ms


def parse_every(value: str | int, *, anchor_ms: int = 0) -> Every:
    interval_ms = parse_duration_ms(value, field="every")
    if isinstance(anchor_ms, bool) or not isinstance(anchor_ms, int):
        raise RecurrenceError("every: anchor_ms must be an int of Unix milliseconds")
    return Every(interval_ms=interval_ms, anchor_ms=anchor_ms)


# ------------------------------------------------------------------------------ zones and at


def load_zone(name: str) -> ZoneInfo:
    """The IANA zone `name`, from the pinned tzdata package only (cached)."""
    zone = find_zone(name) if isinstance(name, str) else None
    if zone is None:
        similar = [known for known in zone_names() if known.lower() == str(name).lower()]
        hint = f" (did you mean {similar[0]!r}?)" if similar else ""
        raise RecurrenceError(f"tz: unknown time zone {name!r}{hint}")
    return zone


def _timeline(tz: ZoneInfo) -> ZoneTimeline:
    # By name, so a ZoneInfo from the host's database still gets tzdata's rules.
    key = getattr(tz, "key", None)
    timeline = timeline_of(key) if isinstance(key, str) else None
    if timeline is None:
        raise RecurrenceError(f"tz: {key!r} is not a tzdata zone; use load_zone()")
    return timeline


def _offset_ms(moment: datetime) -> int:
    delta = moment.utcoffset()
    assert delta is not None
    return delta // _ONE_MS


def parse_at(value: str | int, tz: ZoneInfo) -> At:
    """An ISO-8601 date-time (absolute with an offset or Z, else wall time in tz: a time in a
    gap moves to the end of the gap, a repeated one means its first occurrence), or Unix ms."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise RecurrenceError(f"at: expected an ISO-8601 date-time, got {type(value).__name__}")
    if isinstance(value, int):
        if not 0 <= value <= _AT_MAX_MS:
            raise RecurrenceError(f"at: {value} is not Unix milliseconds in 0..{_AT_MAX_MS}")
        return At(value)
    text = value.strip()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise RecurrenceError(f"at: {value!r} is not an ISO-8601 date-time") from None
    if not any(separator in text for separator in "Tt "):
        raise RecurrenceError(
            f"at: {value!r} is not an ISO-8601 date-time (no time of day; e.g. {text}T00:00:00Z)"
        )
    if moment.microsecond % 1000:
        raise RecurrenceError(f"at: {value!r} has more than millisecond precision")
    if moment.tzinfo is not None:
        at_ms = (moment - _EPOCH_UTC) // _ONE_MS
    else:
        at_ms = _first_instant_ms(_timeline(tz).zone, moment)
    if not 0 <= at_ms <= _AT_MAX_MS:
        raise RecurrenceError(f"at: {value!r} is outside 1970-01-01..9999-12-30")
    return At(at_ms)


def _first_instant_ms(zone: ZoneInfo, wall: datetime) -> int:
    """The first instant whose wall clock in zone reaches the naive `wall`."""
    wall_ms = (wall - _EPOCH_NAIVE) // _ONE_MS
    early_ms = _offset_ms(wall.replace(tzinfo=zone, fold=0))  # offset before a transition
    late_ms = _offset_ms(wall.replace(tzinfo=zone, fold=1))  # offset after it
    if early_ms >= late_ms:
        return wall_ms - early_ms  # unique, or the first of two occurrences
    # In a gap: the transition lies in (wall - late, wall - early]; find it to the ms.
    low_ms, high_ms = wall_ms - late_ms, wall_ms - early_ms
    while high_ms - low_ms > 1:
        middle_ms = (low_ms + high_ms) // 2
        if _offset_ms((_EPOCH_UTC + middle_ms * _ONE_MS).astimezone(zone)) == late_ms:
            high_ms = middle_ms
        else:
            low_ms = middle_ms
    return high_ms


def _format_local(zone: ZoneInfo, instant_ms: int) -> str:
    moment = (_EPOCH_UTC + instant_ms * _ONE_MS).astimezone(zone)
    return moment.isoformat(timespec="milliseconds" if instant_ms % 1000 else "seconds")


def parse_cron(expr: str, day_rule: str = CRONTAB) -> Cron:
    """5 fields (minute hour day-of-month month day-of-week), 6 (second first) or a macro.

    Fields take numbers, names (jan, mon), ranges a-b, lists a,b, steps */n a/n a-b/n, '*';
    '?' in the day fields; 'L' (last day) in day-of-month; 'mon#2' (second Monday) in
    day-of-week. Day-of-week 0 and 7 are Sunday. `day_rule` says how the two day fields
    combine (crontab(5) by default; `cronexpr.CRONITER` is raftcron 0.1's rule).
    """
    cron = _crons.get((expr, day_rule))
    if cron is None:
        normalized, _, has_seconds = split_cron(expr)
        spec = spec_of(normalized, day_rule)
        rule = day_rule if day_rules_differ(normalized) else CRONTAB
        cron = Cron(normalized, has_seconds, spec.real_time, rule)
        if len(_crons) >= 4096:
            _crons.clear()
        _crons[(expr, day_rule)] = cron
    return cron


# Parsed expressions, by the text given: a restore parses every schedule again, and 100k
# schedules share few expressions (splitting one is ~20 us of regular expressions). A Cron is
# frozen, so schedules may share one.
_crons: dict[tuple[str, str], Cron] = {}


# ------------------------------------------------------------------------------ fire times


def _cron_fires(cron: Cron, tz: ZoneInfo, after_ms: int) -> Iterator[int]:
    """Fire instants of cron after after_ms, ascending and distinct, until the horizon."""
    spec = spec_of(cron.expr, cron.day_rule)
    timeline = _timeline(tz)
    after_ms = max(after_ms, _CRON_MIN_MS)
    segment = timeline.segment(after_ms)
    if segment.end_ms == POS_INF_MS and after_ms - segment.start_ms >= OFFSET_SPAN_MS:
        return _fixed_offset_fires(spec, segment.offset_ms, after_ms)  # UTC, or no DST any more
    if spec.real_time:
        return _real_time_fires(spec, timeline, after_ms)
    return _fixed_time_fires(spec, timeline, after_ms)


def _fixed_offset_fires(spec: CronSpec, offset_ms: int, after_ms: int) -> Iterator[int]:
    for wall_ms in spec.walls_after(after_ms + offset_ms):
        yield wall_ms - offset_ms


def _real_time_fires(spec: CronSpec, timeline: ZoneTimeline, after_ms: int) -> Iterator[int]:
    """Every instant whose wall clock matches: one segment of constant offset at a time."""
    segment = timeline.segment(after_ms)
    floor_wall_ms = after_ms + segment.offset_ms
    while True:
        for wall_ms in spec.walls_after(floor_wall_ms):
            if wall_ms - segment.offset_ms >= segment.end_ms:
                break
            yield wall_ms - segment.offset_ms
        else:
            return  # no wall time left before the horizon
        if segment.end_ms >= HORIZON_MS:
            return
        # The next segment starts over at its own first wall time: after a fall-back that is
        # below the walls already fired, which is how the repeated hour fires again.
        segment = timeline.segment(segment.end_ms)
        floor_wall_ms = segment.start_ms + segment.offset_ms - 1


def _fixed_time_fires(spec: CronSpec, timeline: ZoneTimeline, after_ms: int) -> Iterator[int]:
    """Each matching wall time once, at the first instant the clock reaches it."""
    floor_wall_ms = timeline.high_water_ms(after_ms)  # walls up to here were reached already
    not_before_ms = after_ms + 1
    segment = timeline.segment(after_ms)
    for wall_ms in spec.walls_after(floor_wall_ms):
        if wall_ms <= floor_wall_ms:
            continue  # reached when the clock jumped over a gap: it fired with the gap's end
        offset_ms = segment.offset_ms
        if segment.start_ms + offset_ms <= wall_ms < segment.end_ms + offset_ms:
            instant_ms = wall_ms - offset_ms  # the usual case: in the segment of the last fire
        else:
            instant_ms, offset_ms = timeline.first_passage_ms(wall_ms, not_before_ms)
            segment = timeline.segment(instant_ms)
        yield instant_ms
        floor_wall_ms, not_before_ms = instant_ms + offset_ms, instant_ms + 1


def _every_first_ms(every: Every, after_ms: int) -> int:
    return (
        every.anchor_ms
        + ((after_ms - every.anchor_ms) // every.interval_ms + 1) * every.interval_ms
    )


def next_fire_ms(rec: Recurrence, tz: ZoneInfo, after_ms: int) -> int | None:
    """The first fire instant strictly after after_ms, or None if there is none."""
    match rec:
        case At(at_ms=at_ms):
            return at_ms if at_ms > after_ms else None
        case Every():
            return _every_first_ms(rec, after_ms)
        case Cron():
            return next(_cron_fires(rec, tz, after_ms), None)
    raise TypeError(f"not a recurrence: {rec!r}")


def fire_times_ms(
    rec: Recurrence, tz: ZoneInfo, after_ms: int, until_ms: int, limit: int
) -> list[int]:
    """Fire instants in (after_ms, until_ms], ascending: the oldest `limit` of them."""
    if limit <= 0 or until_ms <= after_ms:
        return []
    match rec:
        case At(at_ms=at_ms):
            return [at_ms] if after_ms < at_ms <= until_ms else []
        case Every(interval_ms=interval_ms):
            first_ms = _every_first_ms(rec, after_ms)
            count = max(0, min(limit, (until_ms - first_ms) // interval_ms + 1))
            return list(range(first_ms, first_ms + count * interval_ms, interval_ms))
        case Cron():
            fires: list[int] = []
            for instant_ms in _cron_fires(rec, tz, after_ms):
                if instant_ms > until_ms:
                    break
                fires.append(instant_ms)
                if len(fires) == limit:
                    break
            return fires
    raise TypeError(f"not a recurrence: {rec!r}")


def count_fire_times_ms(rec: Recurrence, tz: ZoneInfo, after_ms: int, until_ms: int) -> int | None:
    """How many fire instants fire_times_ms would list in (after_ms, until_ms], counted
    without listing them. None where only listing can tell: a fixed-time cron whose span
    crosses a UTC offset change (gap times merge at the gap's end, repeats fire once)."""
    if until_ms <= after_ms:
        return 0
    match rec:
        case At(at_ms=at_ms):
            return 1 if after_ms < at_ms <= until_ms else 0
        case Every(interval_ms=interval_ms):
            return max(0, (until_ms - _every_first_ms(rec, after_ms)) // interval_ms + 1)
        case Cron():
            return _count_cron_fires(rec, tz, after_ms, until_ms)
    raise TypeError(f"not a recurrence: {rec!r}")


def _count_cron_fires(cron: Cron, tz: ZoneInfo, after_ms: int, until_ms: int) -> int | None:
    spec = spec_of(cron.expr, cron.day_rule)
    timeline = _timeline(tz)
    after_ms = max(after_ms, _CRON_MIN_MS)
    if until_ms <= after_ms:
        return 0
    segment = timeline.segment(after_ms)
    if segment.end_ms > until_ms and not spec.real_time:
        # One offset throughout: the walls not reached yet, as _fixed_time_fires walks them.
        return spec.count_walls(timeline.high_water_ms(after_ms), until_ms + segment.offset_ms)
    if not spec.real_time:
        return None
    # As _real_time_fires: each segment's walls, the repeated ones again after a fall-back.
    floor_wall_ms = after_ms + segment.offset_ms
    count = 0
    for _ in range(4 * (CRON_YEAR_MAX - 1900)):  # at most a few offset changes a year
        last_ms = min(until_ms, segment.end_ms - 1)
        count += spec.count_walls(floor_wall_ms, last_ms + segment.offset_ms)
        if segment.end_ms > until_ms or segment.end_ms >= HORIZON_MS:
            return count
        segment = timeline.segment(segment.end_ms)
        floor_wall_ms = segment.start_ms + segment.offset_ms - 1
    return None  # more offset changes than any zone has: let listing decide


def describe_fire(rec: Recurrence, tz: ZoneInfo, fire_ms: int) -> tuple[str, str | None]:
    """The fire's local time in tz ("2026-03-08T03:00:00-04:00", ms shown when not zero) and a
    DST note: None, NOTE_MOVED, NOTE_FIRST (fixed times) or NOTE_SECOND (real-time)."""
    timeline = _timeline(tz)
    local = _format_local(timeline.zone, fire_ms)
    if not isinstance(rec, Cron) or not _CRON_MIN_MS <= fire_ms < HORIZON_MS:
        return local, None
    spec = spec_of(rec.expr, rec.day_rule)
    segment = timeline.segment(fire_ms)
    wall_ms = fire_ms + segment.offset_ms
    if segment.start_ms == NEG_INF_MS:
        return local, None
    if spec.real_time:
        repeated = wall_ms <= timeline.high_water_ms(segment.start_ms - 1)
        return local, NOTE_SECOND if repeated else None
    if fire_ms == segment.start_ms:
        gap_start_ms = fire_ms + timeline.segment(fire_ms - 1).offset_ms
        matched_ms = spec.next_wall_ms(gap_start_ms - 1)
        if matched_ms is not None and matched_ms < wall_ms:
            return local, NOTE_MOVED
    if segment.end_ms < HORIZON_MS:
        later = timeline.segment(segment.end_ms)
        if segment.end_ms + later.offset_ms <= wall_ms:
            return local, NOTE_FIRST
    return local, None
