"""The report at the end of a chaos run: one table row per scenario, then every violation.

Columns (CHAOS.md): faults injected, fires expected / seen / duplicated, jobs acknowledged /
lost, stale writes rejected / accepted, worst re-run delay, worst failover, what a state
budget refused (submits and workflows answered 507 / fire times), the finished jobs evicted /
the acknowledged ones read back from every node's archive; then each checker's
verdict and counts, the seed, and the folder holding the history, fault log and node logs.
It only formats `Outcome`s; it decides nothing.
"""

from __future__ import annotations

from collections import Counter

from raftcron.chaos.tier2.checkers import CheckResult
from raftcron.chaos.tier2.scenarios import Outcome

COLUMNS = [
    ("scenario", 10), ("faults", 6), ("fires exp/seen/dup", 18), ("jobs ack/lost", 13),
    ("stale rej/acc", 13), ("worst rerun", 11), ("worst failover", 14),
    ("refused sub/fire", 16), ("evicted/archived", 16), ("verdict", 9),
]


def _result(outcome: Outcome, name: str) -> CheckResult | None:
    return next((r for r in outcome.results if r.name == name), None)


def _count(result: CheckResult | None, key: str) -> str:
    if result is None:
        return "-"
    value = result.counts.get(key)
    return "-" if value is None else str(value)


def _ms(result: CheckResult | None, key: str) -> str:
    if result is None or result.counts.get(key) is None:
        return "-"
    return f"{result.counts[key] / 1000:.1f} s"


def verdict(outcome: Outcome) -> str:
    if outcome.error is not None:
        return "ERROR"
    if not outcome.safety_ok:
        return "UNSAFE"
    return "ok" if outcome.ok else "LIVENESS"


def row(outcome: Outcome) -> list[str]:
    fires = _result(outcome, "exactly-once firing")
    lost = _result(outcome, "no lost job")
    fencing = _result(outcome, "fenced completion and effects")
    rerun = _result(outcome, "lease re-run bound")
    live = _result(outcome, "liveness")
    return [
        outcome.scenario,
        str(sum(outcome.faults.values())),
        f"{_count(fires, 'expected')}/{_count(fires, 'seen')}/{_count(fires, 'duplicated')}",
        f"{_count(lost, 'acknowledged')}/{_count(lost, 'lost')}",
        f"{_count(fencing, 'stale_rejected')}/{_count(fencing, 'stale_accepted')}",
        _ms(rerun, "worst_rerun_ms"),
        _ms(live, "worst_failover_ms"),
        f"{_count(lost, 'refused')}/{_count(fires, 'refused')}",
        f"{_count(lost, 'evictions')}/{_count(lost, 'archived_acknowledged')}",
        verdict(outcome),
    ]


def table(outcomes: list[Outcome]) -> str:
    widths = [max(w, len(h)) for h, w in COLUMNS]
    rows = [row(o) for o in outcomes]
    for cells in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]
    line = "  ".join(h.ljust(w) for (h, _), w in zip(COLUMNS, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) for cells in rows]
    total_faults = sum(sum(o.faults.values()) for o in outcomes)
    out.append(f"total faults injected: {total_faults}")
    return "\n".join(out)


def details(outcome: Outcome) -> str:
    lines = [
        f"== {outcome.scenario}: {verdict(outcome)} in {outcome.elapsed_s:.0f} s, seed "
        f"{outcome.seed}, transport {outcome.transport}",
        f"   folder: {outcome.folder}",
        "   faults: " + ", ".join(f"{k}={v}" for k, v in sorted(outcome.faults.items())),
    ]
    lines += [f"   note: {note}" for note in outcome.notes]
    if outcome.error:
        lines.append(f"   harness error: {outcome.error}")
    for result in outcome.results:
        kind = "safety" if result.safety else "liveness"
        counts = ", ".join(f"{k}={v}" for k, v in result.counts.items())
        lines.append(f"   [{'ok' if result.ok else 'FAIL'}] {result.name} ({kind}): {counts}")
        lines += [f"       - {v}" for v in result.violations]
    for text in outcome.tables:
        lines += ["", *(f"   {line}" for line in text.splitlines())]
    return "\n".join(lines)


def render(outcomes: list[Outcome], seed: int) -> str:
    parts = [table(outcomes), ""]
    parts += [details(o) for o in outcomes]
    kinds: Counter[str] = Counter()
    for outcome in outcomes:
        kinds.update(outcome.faults)
    parts.append("")
    parts.append("faults by kind: " + ", ".join(f"{k}={v}" for k, v in sorted(kinds.items())))
    failed = [o for o in outcomes if not o.ok]
    parts.append(f"seed: {seed}" + (f"  (replay: raftcron chaos run --seed {seed} "
                                    + " ".join(f"--scenario {o.scenario}" for o in failed) + ")"
                                    if failed else ""))
    return "\n".join(parts)
