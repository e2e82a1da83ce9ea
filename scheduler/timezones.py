"""Time zones from the pinned `tzdata` package, seen as timelines of constant UTC offset.

Owns two things:
- `find_zone(name)`: an IANA name to a `ZoneInfo` built ONLY from the `tzdata` package (never the
  host's tz database, whose version differs between machines), validated against tzdata's own
  list of names, so that every replica computes the same local times on any host.
- `timeline_of(zone)`: the zone as a sorted list of transitions, each starting a segment of
  constant UTC offset. Cron arithmetic walks these segments: inside one segment wall time and
  real time move together; between two segments there is a gap (spring forward) or a repeat
  (fall back).

Transitions come from the TZif file's explicit list (checked against zoneinfo), and after its
last entry from probing zoneinfo day by day where the file's footer has a DST rule (tzdata ships
"slim" files: recent years exist only as a rule). Probing stops at `HORIZON_MS` (year 2200).

Must not: read the clock, the TZ environment variable, or any file outside the tzdata package.
The caches here are memoization of pure functions: a race between two threads can at worst
compute the same value twice, never change an answer.
"""

from __future__ import annotations

import io
import re
import struct
from bisect import bisect_right
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import NamedTuple
from zoneinfo import ZoneInfo

NEG_INF_MS = -(2**62)
POS_INF_MS = 2**62
HORIZON_MS = 7258118400000  # 2200-01-01T00:00:00Z: no transitions are looked for beyond it.
_HISTORY_MIN_S = -5364662400  # 1800-01-01T00:00:00Z: older transitions are ignored.
_PROBE_STEP_S = 86400  # DST rules never put two transitions less than a day apart.
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_NAME_RE = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")
_NAME_LENGTH_MAX = 64

# A shift between neighbouring segments, and any UTC offset, is below a day in tzdata (the
# largest, Alaska's 1867 change of date line, is 24 h); 48 h leaves room for any surprise.
OFFSET_SPAN_MS = 48 * 3600 * 1000


class Segment(NamedTuple):
    """Instants in [start_ms, end_ms) all have the UTC offset offset_ms."""

    start_ms: int
    end_ms: int
    offset_ms: int


def _offset_s(zone: ZoneInfo, instant_s: int) -> int:
    delta = (_EPOCH_UTC + timedelta(seconds=instant_s)).astimezone(zone).utcoffset()
    assert delta is not None
    return delta.days * 86400 + delta.seconds


class ZoneTimeline:
    """The UTC offset of one zone over time, as segments between transitions."""

    __slots__ = ("_state", "zone")

    def __init__(self, zone: ZoneInfo, explicit_s: list[int], has_rule: bool) -> None:
        self.zone = zone
        kept = [
            t
            for t in explicit_s
            if _HISTORY_MIN_S < t < HORIZON_MS // 1000
            and _offset_s(zone, t - 1) != _offset_s(zone, t)
        ]
        first = kept[0] - 1 if kept else 0
        offsets = [_offset_s(zone, first)] + [_offset_s(zone, t) for t in kept]
        frontier_s = kept[-1] if kept else 0
        # One tuple, replaced whole: a reader never sees times and offsets of different lengths.
        self._state: tuple[tuple[int, ...], tuple[int, ...], int] = (
            tuple(t * 1000 for t in kept),
            tuple(o * 1000 for o in offsets),
            frontier_s * 1000 if has_rule else POS_INF_MS,
        )

    def segment(self, instant_ms: int) -> Segment:
        """The segment holding instant_ms; its ends are real transitions or +-infinity."""
        times, offsets, frontier_ms = self._state
        index = bisect_right(times, instant_ms)
        while index == len(times) and frontier_ms < HORIZON_MS:
            # The rule part of the zone is probed lazily, a year past the instant asked for.
            times, offsets, frontier_ms = self._extend(
                max(instant_ms, frontier_ms) + 366 * 86400000
            )
            index = bisect_right(times, instant_ms)
        start_ms = times[index - 1] if index else NEG_INF_MS
        end_ms = times[index] if index < len(times) else POS_INF_MS
        return Segment(start_ms, end_ms, offsets[index])

    def high_water_ms(self, instant_ms: int) -> int:
        """The latest wall time (as ms) shown at or before instant_ms: walls after a fall-back
        repeat, so this can exceed the wall time of instant_ms itself."""
        segment = self.segment(instant_ms)
        high_ms = instant_ms + segment.offset_ms
        start_ms = segment.start_ms
        for _ in range(16):
            if start_ms == NEG_INF_MS or instant_ms - start_ms >= OFFSET_SPAN_MS:
                return high_ms
            before = self.segment(start_ms - 1)
            high_ms = max(high_ms, before.end_ms - 1 + before.offset_ms)
            start_ms = before.start_ms
        return high_ms

    def first_passage_ms(self, wall_ms: int, not_before_ms: int) -> tuple[int, int]:
        """The first instant >= not_before_ms whose wall time is >= wall_ms, and the offset
        there. The caller guarantees that no instant before not_before_ms showed wall_ms. A
        wall time in a gap passes at the end of the gap; a repeated one at its first showing."""
        segment = self.segment(max(not_before_ms, wall_ms - OFFSET_SPAN_MS))
        for _ in range(64):
            if wall_ms < segment.start_ms + segment.offset_ms:
                return max(segment.start_ms, not_before_ms), segment.offset_ms
            if wall_ms < segment.end_ms + segment.offset_ms:
                return wall_ms - segment.offset_ms, segment.offset_ms
            segment = self.segment(segment.end_ms)
        raise RuntimeError(f"no passage of wall {wall_ms} in {self.zone.key}: broken timeline")

    def _extend(self, until_ms: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        times, offsets, frontier_ms = self._state
        new_times, new_offsets = list(times), list(offsets)
        at_s, offset_s = frontier_ms // 1000, offsets[-1] // 1000
        until_s = min(until_ms, HORIZON_MS) // 1000
        while at_s < until_s:
            probe_s = at_s + _PROBE_STEP_S
            if _offset_s(self.zone, probe_s) == offset_s:
                at_s = probe_s
                continue
            low_s, high_s = at_s, probe_s  # offset(low) is the old one, offset(high) is not
            while high_s - low_s > 1:
                middle_s = (low_s + high_s) // 2
                if _offset_s(self.zone, middle_s) == offset_s:
                    low_s = middle_s
                else:
                    high_s = middle_s
            offset_s = _offset_s(self.zone, high_s)
            new_times.append(high_s * 1000)
            new_offsets.append(offset_s * 1000)
            at_s = high_s
        state = (tuple(new_times), tuple(new_offsets), at_s * 1000)
        self._state = state
        return state


def _parse_tzif(data: bytes) -> tuple[list[int], bool]:
    """Explicit transition instants (Unix seconds) of a TZif file, and whether its footer
    carries a DST rule that continues after them (RFC 8536)."""
    if data[:4] != b"TZif":
        raise ValueError("not a TZif file")
    counts = struct.unpack(">6l", data[20:44])
    if data[4:5] == b"\x00":  # version 1: 32-bit times, no footer
        return list(struct.unpack(f">{counts[3]}l", data[44 : 44 + 4 * counts[3]])), True
    isut, isstd, leap, timecnt, typecnt, charcnt = counts
    header2 = 44 + timecnt * 5 + typecnt * 6 + charcnt + leap * 8 + isstd + isut
    isut, isstd, leap, timecnt, typecnt, charcnt = struct.unpack(
        ">6l", data[header2 + 20 : header2 + 44]
    )
    body = header2 + 44
    times = list(struct.unpack(f">{timecnt}q", data[body : body + 8 * timecnt]))
    footer_at = body + timecnt * 9 + typecnt * 6 + charcnt + leap * 12 + isstd + isut
    return times, b"," in data[footer_at:]


_tzdata_names: frozenset[str] = frozenset()
_zones: dict[str, ZoneInfo] = {}
_timelines: dict[str, ZoneTimeline] = {}


def zone_names() -> frozenset[str]:
    """Every zone name tzdata ships (its `zones` list, which matches its files exactly)."""
    global _tzdata_names
    if not _tzdata_names:
        text = resources.files("tzdata").joinpath("zones").read_text(encoding="ascii")
        _tzdata_names = frozenset(text.split())
    return _tzdata_names


def _zone_file(name: str) -> bytes | None:
    if len(name) > _NAME_LENGTH_MAX or not _NAME_RE.fullmatch(name):
        return None  # also rejects "..", absolute paths and backslashes
    if name not in zone_names():
        return None
    return resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).read_bytes()


def find_zone(name: str) -> ZoneInfo | None:
    """The tzdata zone called `name` (case-sensitive, as IANA spells it), or None."""
    zone = _zones.get(name)
    if zone is None:
        data = _zone_file(name)
        if data is None:
            return None
        zone = ZoneInfo.from_file(io.BytesIO(data), key=name)
        _zones[name] = zone
    return zone


def timeline_of(name: str) -> ZoneTimeline | None:
    """The offset timeline of the tzdata zone called `name`, or None if there is none."""
    timeline = _timelines.get(name)
    if timeline is None:
        zone = find_zone(name)
        data = _zone_file(name)
        if zone is None or data is None:
            return None
        explicit_s, has_rule = _parse_tzif(data)
        timeline = ZoneTimeline(zone, explicit_s, has_rule)
        _timelines[name] = timeline
    return timeline
