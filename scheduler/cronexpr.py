"""Cron expressions: fields parsed into sets, and the search for matching wall-clock times.

Owns the grammar (5 fields, 6 with seconds first, macros; names, ranges, lists, steps, `?`,
`L` in day-of-month, `mon#2` in day-of-week), the rule that combines the two day fields
(crontab(5)'s, or raftcron 0.1's for schedules put before it: `DAY_RULES`) and a small matcher
over the expanded sets that walks naive wall times. croniter validates every expression too,
so an expression accepted here is one croniter accepts, but croniter's stateful iterator is
not used: a shared cached iterator would race between the Raft thread and API readers, and
the matcher is about 10x faster. Time zones and DST are `scheduler.calendar`'s part; this
module knows only walls.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from datetime import date, datetime

from croniter import croniter


class RecurrenceError(ValueError):
    """An invalid schedule time; the message names the field and the problem."""


_EPOCH_ORDINAL = datetime(1970, 1, 1).toordinal()
_DAY_S = 86400
CRON_YEAR_MAX = 2200  # wall times from this year on are not searched
_YEAR_MAX_WALL_S = (date(CRON_YEAR_MAX, 1, 1).toordinal() - _EPOCH_ORDINAL) * _DAY_S

# ----------------------------------------------------------------------------- cron fields

_FIELDS = (  # name, lowest, highest (day-of-week also takes 7 for Sunday)
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_NAMES = {
    "month": {name: number for number, name in enumerate(_MONTHS, start=1)},
    "day-of-week": {name: number for number, name in enumerate(_WEEKDAYS)},
}
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_ITEM_RE = re.compile(r"(\*|[a-z0-9]{1,9})(?:-([a-z0-9]{1,9}))?(?:/([0-9]{1,4}))?")
_CRON_LENGTH_MAX = 256
Field = tuple[frozenset[int], bool, frozenset[tuple[int, int]]]  # values, 'L', 'weekday#n'


def split_cron(expr: object) -> tuple[str, list[str], bool]:
    """Normalized text, the six field texts (second first) and whether seconds were given."""
    if not isinstance(expr, str):
        raise RecurrenceError(f"cron: expected a string, got {type(expr).__name__}")
    if not expr.isascii() or not expr.strip() or len(expr) > _CRON_LENGTH_MAX:
        raise RecurrenceError(f"cron: {expr!r} must be 1-{_CRON_LENGTH_MAX} ASCII characters")
    text = " ".join(expr.split())
    if text.startswith("@"):
        macro = text.lower()
        if macro == "@reboot":
            raise RecurrenceError("cron: '@reboot' is not supported: schedules fire at times")
        if macro not in _MACROS:
            known = ", ".join(_MACROS)
            raise RecurrenceError(f"cron: unknown macro {text!r} (use one of {known})")
        return macro, ["0", *_MACROS[macro].split()], False
    fields = text.split(" ")
    if len(fields) not in (5, 6):
        raise RecurrenceError(
            f"cron: {text!r} has {len(fields)} fields; expected 5 (minute hour day-of-month "
            "month day-of-week) or 6 (second minute hour day-of-month month day-of-week)"
        )
    return text, (fields if len(fields) == 6 else ["0", *fields]), len(fields) == 6


def _field_error(name: str, token: str) -> RecurrenceError:
    if token == "h" or token.startswith("h("):
        problem = "uses 'H' (hash) syntax, which is not supported: write the values"
    elif token == "r" or token.startswith("r("):
        problem = "uses 'R' (random) syntax, which is not supported: write the values"
    elif re.fullmatch(r"[0-9]+w|w[0-9]+|lw", token):
        problem = f"has {token!r}: 'W' (nearest weekday) is not supported"
    elif re.fullmatch(r"[0-9]*l|l[0-9]*", token):
        problem = f"has {token!r}: 'L' is supported only alone, in day-of-month"
    else:
        names = ", a name (jan, mon ...)" if name in _NAMES else ""
        problem = f"has {token!r}, which is not a number{names}, range (a-b) or step (*/n, a-b/n)"
    return RecurrenceError(f"cron: field '{name}' {problem}")


def _field_value(name: str, token: str, lowest: int, highest: int) -> int:
    if token.isdigit():
        value = int(token)
        if not lowest <= value <= highest:
            raise RecurrenceError(
                f"cron: field '{name}' value {value} is out of range {lowest}-{highest}"
            )
        return value
    if token in _NAMES.get(name, {}):
        return _NAMES[name][token]
    raise _field_error(name, token)


def _parse_item(name: str, item: str, lowest: int, highest: int) -> range:
    # '*' and 'a/n' stop at Saturday (6) in day-of-week, as croniter's do.
    top = 6 if name == "day-of-week" else highest
    match = _ITEM_RE.fullmatch(item)
    if match is None:
        raise _field_error(name, item)
    start, end, step = match.groups()
    if start == "*":
        if end is not None:
            raise _field_error(name, item)
        first, last = lowest, top
    else:
        first = _field_value(name, start, lowest, highest)
        last = first if step is None else top
        if end is not None:
            last = _field_value(name, end, lowest, highest)
            # croniter reads 'a-a' as the whole field, and 'b-a' wraps around: both surprise.
            if last <= first:
                how = "has equal ends" if last == first else "is reversed"
                raise RecurrenceError(f"cron: field '{name}' range {item!r} {how}")
        elif first > last:
            raise RecurrenceError(f"cron: field '{name}' step start {first} is past {top}")
    if step is not None and int(step) == 0:
        raise RecurrenceError(f"cron: field '{name}' step in {item!r} must be at least 1")
    return range(first, last + 1, int(step or 1))


def _parse_field(index: int, text: str) -> Field:
    name, lowest, highest = _FIELDS[index]
    text = text.lower()
    if text == "?" and name in ("day-of-month", "day-of-week"):
        text = "*"  # Quartz's "no specific value"
    values: set[int] = set()
    last_day = False
    nth: set[tuple[int, int]] = set()
    for item in text.split(","):
        if item == "l" and name == "day-of-month":
            last_day = True
        elif "#" in item and name == "day-of-week":
            weekday, _, week = item.partition("#")
            if not week.isdigit() or not 1 <= int(week) <= 5:
                raise RecurrenceError(f"cron: field '{name}' {item!r}: the week must be 1-5")
            nth.add((_field_value(name, weekday, lowest, highest) % 7, int(week)))
        else:
            values.update(_parse_item(name, item, lowest, highest))
    if name == "day-of-week":
        values = {value % 7 for value in values}
        if nth and values:
            raise RecurrenceError(f"cron: field '{name}' cannot mix 'day#week' with other days")
    return frozenset(values), last_day, frozenset(nth)


# ---------------------------------------------------------------------------- cron matcher


def _month_length(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


class CronSpec:
    """A cron expression expanded to sets, and the search for its next matching wall time.

    Wall times are naive local times counted as ms since 1970-01-01T00:00 on the wall clock.
    """

    __slots__ = (
        "_day_cache",
        "_per_day",
        "day_and",
        "dom",
        "dom_last",
        "dow",
        "dow_nth",
        "hours",
        "minutes",
        "months",
        "real_time",
        "seconds",
    )

    def __init__(self, fields: list[Field], day_and: bool, real_time: bool) -> None:
        self.seconds, self.minutes, self.hours = (tuple(sorted(f[0])) for f in fields[:3])
        self.dom, self.dom_last, _ = fields[3]
        self.months = fields[4][0]
        self.dow, _, self.dow_nth = fields[5]
        self.day_and = day_and
        self.real_time = real_time
        # Matching days of a month depend only on its length and first weekday: <= 28 keys.
        self._day_cache: dict[int, tuple[int, ...]] = {}
        self._per_day = len(self.seconds) * len(self.minutes) * len(self.hours)

    def walls_after(self, after_wall_ms: int, year_max: int = CRON_YEAR_MAX) -> Iterator[int]:
        """Matching wall times strictly after after_wall_ms, ascending, before year_max."""
        day, time_s = divmod(after_wall_ms // 1000 + 1, _DAY_S)
        today = date.fromordinal(day + _EPOCH_ORDINAL)
        year, month, mday = today.year, today.month, today.day
        while year < year_max:
            if month in self.months:
                days = self._days_of(year, month)
                month_day = date(year, month, 1).toordinal() - _EPOCH_ORDINAL - 1
                for match in days[bisect_left(days, mday) :]:
                    day_ms = (month_day + match) * _DAY_S * 1000
                    for second in self._times_from(time_s if match == mday else 0):
                        yield day_ms + second * 1000
            year, month = (year, month + 1) if month < 12 else (year + 1, 1)
            mday, time_s = 1, 0

    def next_wall_ms(self, after_wall_ms: int, year_max: int = CRON_YEAR_MAX) -> int | None:
        return next(self.walls_after(after_wall_ms, year_max), None)

    def count_walls(self, after_wall_ms: int, until_wall_ms: int) -> int:
        """How many matching wall times lie in (after_wall_ms, until_wall_ms], before
        CRON_YEAR_MAX, counted without visiting them: a matching day holds the product of the
        time sets, so only the two end days are partial (a day of every-second times: O(1),
        where walking them costs 86,400 steps)."""
        first_s = after_wall_ms // 1000 + 1
        last_s = min(until_wall_ms // 1000, _YEAR_MAX_WALL_S - 1)
        if last_s < first_s:
            return 0
        first_day, first_time = divmod(first_s, _DAY_S)
        last_day, last_time = divmod(last_s, _DAY_S)
        if first_day == last_day:
            if not self._day_matches(first_day):
                return 0
            return self._times_through(last_time) - self._times_through(first_time - 1)
        count = self._per_day * self._days_matching(first_day + 1, last_day - 1)
        if self._day_matches(first_day):
            count += self._per_day - self._times_through(first_time - 1)
        if self._day_matches(last_day):
            count += self._times_through(last_time)
        return count

    def _day_matches(self, day: int) -> bool:
        today = date.fromordinal(day + _EPOCH_ORDINAL)
        return today.month in self.months and today.day in self._days_of(today.year, today.month)

    def _days_matching(self, first_day: int, last_day: int) -> int:
        """Matching days in [first_day, last_day] (days since 1970-01-01), month by month."""
        if last_day < first_day:
            return 0
        start = date.fromordinal(first_day + _EPOCH_ORDINAL)
        year, month = start.year, start.month
        count = 0
        while year < CRON_YEAR_MAX:  # last_day is before it: the loop ends by the return
            month_day = date(year, month, 1).toordinal() - _EPOCH_ORDINAL - 1  # its day 0
            if month_day + 1 > last_day:
                return count
            if month in self.months:
                days = self._days_of(year, month)
                low, high = first_day - month_day, last_day - month_day
                count += bisect_right(days, high) - bisect_left(days, low)
            year, month = (year, month + 1) if month < 12 else (year + 1, 1)
        return count

    def _times_through(self, time_s: int) -> int:
        """How many matching seconds of a day lie in [0, time_s] (0 for time_s < 0)."""
        if time_s < 0:
            return 0
        hour, rest = divmod(time_s, 3600)
        minute, second = divmod(rest, 60)
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        h = bisect_left(hours, hour)
        count = h * len(minutes) * len(seconds)
        if h < len(hours) and hours[h] == hour:
            m = bisect_left(minutes, minute)
            count += m * len(seconds)
            if m < len(minutes) and minutes[m] == minute:
                count += bisect_right(seconds, second)
        return count

    def matches_day(self, mday: int, length: int, weekday: int) -> bool:
        """weekday counts from Sunday = 0, as cron does."""
        dom_ok = mday in self.dom or (self.dom_last and mday == length)
        dow_ok = weekday in self.dow or (weekday, (mday - 1) // 7 + 1) in self.dow_nth
        return (dom_ok and dow_ok) if self.day_and else (dom_ok or dow_ok)

    def _days_of(self, year: int, month: int) -> tuple[int, ...]:
        length = _month_length(year, month)
        first_weekday = (date(year, month, 1).weekday() + 1) % 7
        key = length * 7 + first_weekday
        days = self._day_cache.get(key)
        if days is None:
            days = tuple(
                mday
                for mday in range(1, length + 1)
                if self.matches_day(mday, length, (first_weekday + mday - 1) % 7)
            )
            self._day_cache[key] = days
        return days

    def _times_from(self, start_s: int) -> Iterator[int]:
        """Matching seconds of a day from start_s on, ascending."""
        hour, rest = divmod(start_s, 3600)
        minute, second = divmod(rest, 60)
        for h in self.hours[bisect_left(self.hours, hour) :]:
            minutes = (
                self.minutes if h > hour else self.minutes[bisect_left(self.minutes, minute) :]
            )
            for m in minutes:
                base_s = h * 3600 + m * 60
                if h > hour or m > minute:
                    seconds = self.seconds
                else:
                    seconds = self.seconds[bisect_left(self.seconds, second) :]
                for s in seconds:
                    yield base_s + s


# The two rules for combining day-of-month and day-of-week. Both say: when both fields are
# restricted a day matching either fires, otherwise both must match. They differ on what
# "restricted" means (DESIGN.md §8.5):
# - CRONTAB, crontab(5) and Vixie cron: a field is unrestricted when its text starts with '*'
#   (so '*/2' is unrestricted: `0 0 */2 * 1` fires on odd days that are Mondays); '?' too.
# - CRONITER, raftcron 0.1's rule (croniter's): unrestricted only when the field covers every
#   value ('*', '?', '1-31' beside a '*'...), so `0 0 */2 * 1` fired on odd days OR Mondays.
# A schedule records the rule it was put with (scheduler/schedulespec.py): a replica that
# replays an old entry must compute the fire times the other replicas computed from it.
CRONTAB = "crontab"
CRONITER = "croniter"
DAY_RULES = (CRONTAB, CRONITER)


def _days_and(rule: str, dom_text: str, dow_text: str, dom: Field, dow: Field) -> bool:
    """Whether a day must match both day fields (else either), under `rule`."""
    if rule == CRONTAB:
        return dom_text.startswith(("*", "?")) or dow_text.startswith(("*", "?"))
    dom_star = dom_text in ("*", "?") or (len(dom[0]) == 31 and not dom[1] and "*" in dow_text)
    dow_star = dow_text in ("*", "?") or (len(dow[0]) == 7 and "*" in dom_text)
    return dom_star or dow_star


def day_rules_differ(expr: str) -> bool:
    """Whether the two day rules give `expr` different days (then a schedule must say which)."""
    return spec_of(expr, CRONTAB).day_and != spec_of(expr, CRONITER).day_and


def _compile(expr: str, day_rule: str) -> CronSpec:
    if day_rule not in DAY_RULES:
        raise RecurrenceError(f"day_rule: {day_rule!r} is not one of {', '.join(DAY_RULES)}")
    normalized, texts, has_seconds = split_cron(expr)
    fields = [_parse_field(index, text) for index, text in enumerate(texts)]
    dom_text, dow_text = texts[3].lower(), texts[5].lower()
    nth = fields[5][2]
    # The same refusal under either rule: 'mon#2' beside a restricted day-of-month.
    if nth and dom_text not in ("*", "?"):
        raise RecurrenceError("cron: 'day#week' in day-of-week needs '*' in day-of-month")
    croniter_text = " ".join(texts if has_seconds else texts[1:])
    try:
        croniter.expand(croniter_text, second_at_beginning=has_seconds)
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise RecurrenceError(f"cron: {normalized!r} is rejected by croniter: {error}") from error
    real_time = any("*" in text or "/" in text for text in texts[:3])
    day_and = _days_and(day_rule, dom_text, dow_text, fields[3], fields[5])
    spec = CronSpec(fields, day_and, real_time)
    # The Gregorian calendar repeats every 400 years: no match in 400 years means never.
    if spec.next_wall_ms(946684800000, year_max=2400) is None:
        raise RecurrenceError(f"cron: {normalized!r} can never fire (no such date)")
    return spec


_specs: dict[tuple[str, str], CronSpec] = {}


def spec_of(expr: str, day_rule: str = CRONTAB) -> CronSpec:
    spec = _specs.get((expr, day_rule))
    if spec is None:
        spec = _compile(expr, day_rule)
        if len(_specs) >= 4096:
            _specs.clear()
        _specs[(expr, day_rule)] = spec
    return spec
