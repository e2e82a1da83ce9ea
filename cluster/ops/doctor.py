"""`raftcron cluster doctor`: what in a running cluster needs a person, judged from each
member's own `GET /v1/cluster` (no I/O here: `opscli` asks, this decides).

A finding is a `problem` (the cluster cannot do part of its work, or will not soon: a member
down, no leader, a clock off, storage that cannot write or is nearly full, a member that names
another cluster: a node of another cluster in the members list, a state at its budget: new
jobs refused, a member of a release older than the finalized cluster's level) or a `warning`
(something to look at: a member far behind, a log not compacted, a snapshot older than a day
while entries came after it, mixed versions, a state near its budget, a cluster not finalized
though every member runs a release that can turn it on). The command exits non-zero when there
is any finding, so it can run from cron or a monitor.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

PROBLEM, WARNING = "problem", "warning"


@dataclass(frozen=True)
class Thresholds:
    max_lag_entries: int = 1_000  # applied entries behind the leader's commit index
    min_free_bytes: int = 1024**3  # free space on a data dir's filesystem
    max_log_entries: int = 1_000_000  # entries since the last compaction
    # A snapshot older than this while entries were applied after it: compaction has stopped
    # (PySyncObj makes one every raft.compaction_min_time_s, 10 min, when entries came).
    max_snapshot_age_s: float = 86_400.0
    # The state against its budget (DESIGN.md §9.1): a warning from this share on. At the
    # budget itself new jobs are refused once nothing finished is left to evict: a problem.
    budget_warn_pct: float = 80.0
    # Jobs that left the state and wait for the archive's writer: a few batches is normal.
    max_archive_pending_jobs: int = 20_000


@dataclass(frozen=True)
class Finding:
    severity: str
    node: str
    check: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def diagnose(
    views: dict[str, dict[str, Any] | None],
    thresholds: Thresholds = Thresholds(),
    errors: dict[str, str] | None = None,
) -> list[Finding]:
    """Findings for the members' own views (None: it did not answer; `errors` says why)."""
    findings: list[Finding] = []
    answered = {node: view for node, view in views.items() if view is not None}
    for node, view in views.items():
        if view is None:
            why = (errors or {}).get(node, "no answer")
            findings.append(Finding(PROBLEM, node, "reachable", f"does not answer ({why})"))
    leaders = {view["leader"] for view in answered.values()}
    leader = next(iter(leaders)) if len(leaders) == 1 else None
    if not answered:
        return findings
    if leader is None:
        detail = ("no member knows a leader" if leaders == {None}
                  else f"members name different leaders: {sorted(map(str, leaders))}")
        findings.append(Finding(PROBLEM, "*", "leader", detail))
    leader_view = None
    if leader is not None:
        leader_view = answered.get(leader)
        if leader_view is None:
            findings.append(Finding(PROBLEM, str(leader), "leader",
                                    "the leader the others name does not answer"))
        elif not leader_view.get("has_quorum", True):
            findings.append(Finding(PROBLEM, str(leader), "quorum",
                                    "the leader does not hear a majority"))
    for node, view in sorted(answered.items()):
        findings += _member(node, view, leader_view, thresholds)
    findings += _cluster_names(answered)
    findings += _upgrade_gate(answered, everyone_answered=len(answered) == len(views))
    versions = {view.get("version") for view in answered.values()}
    if len(versions) > 1:
        findings.append(Finding(WARNING, "*", "version",
                                f"members run different releases: {sorted(map(str, versions))} "
                                "(fine during a rolling upgrade, not after)"))
    return findings


def _cluster_names(answered: dict[str, dict[str, Any]]) -> list[Finding]:
    """Members that name different clusters ([cluster] name): with a majority name, each
    member naming another; else one finding listing them all. A member of a release before
    cluster names says none and is not judged."""
    names = {node: view["cluster_name"] for node, view in answered.items()
             if view.get("cluster_name") is not None}
    if len(set(names.values())) < 2:
        return []
    (most, count), *_ = Counter(names.values()).most_common()
    if 2 * count > len(names):
        return [Finding(PROBLEM, node, "cluster",
                        f"says it is of cluster {name!r}, the other members of {most!r}: a node "
                        "of another cluster in the members list (or a config with another "
                        "[cluster] name)")
                for node, name in sorted(names.items()) if name != most]
    groups = "; ".join(f"{name!r}: {', '.join(sorted(n for n in names if names[n] == name))}"
                       for name in sorted(set(names.values())))
    return [Finding(PROBLEM, "*", "cluster", f"members name different clusters ({groups}): "
                    "nodes of other clusters in the members list, or configs that disagree")]


def _upgrade_gate(answered: dict[str, dict[str, Any]], *,
                  everyone_answered: bool) -> list[Finding]:
    """The upgrade gate (DESIGN.md §9.0) against the releases the members run. The cluster's
    level is the highest a member applied: a Finalize is for good, so one member that applied
    it means the log holds it. A member of a release before the gate names no level: when no
    member names one, there is nothing to judge."""
    states = {node: view.get("state") or {} for node, view in answered.items()}
    levels = [_int_or_none(state.get("level")) for state in states.values()]
    level = max((known for known in levels if known is not None), default=None)
    if level is None:
        return []
    releases = {node: _int_or_none(view.get("release_level")) for node, view in answered.items()}
    if any(state.get("finalized") for state in states.values()):
        return [Finding(PROBLEM, node, "release",
                        f"runs {_release(release)} but the cluster is finalized at level {level}: "
                        "an older release cannot follow it (it refuses the cluster's snapshots "
                        "and entries); upgrade it")
                for node, release in sorted(releases.items())
                if release is None or release < level]
    known = [release for release in releases.values() if release is not None]
    if everyone_answered and len(known) == len(releases) and min(known) > level:
        return [Finding(WARNING, "*", "finalize",
                        f"the cluster is not finalized (level {level}, the previous release's "
                        f"behaviour: no budget, fixed retention) though every member runs "
                        f"release level {min(known)} or more: run `raftcron cluster finalize`")]
    return []


def _release(release: int | None) -> str:
    if release is None:
        return "a release before the upgrade gate (its view names no release level)"
    return f"release level {release}"


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _budget(node: str, view: dict[str, Any], thresholds: Thresholds) -> list[Finding]:
    """The member's state against its budget (DESIGN.md §9.1); none before the cluster is
    finalized (`budget_bytes` None) or from a release before budgets."""
    state = view.get("state") or {}
    used = _int_or_none(state.get("state_bytes"))
    budget = _int_or_none(state.get("budget_bytes"))
    if used is None or budget is None or budget <= 0:
        return []
    # Whole percent, rounded down: 99.7% is "99%", never a "100%" that is only a warning.
    figures = (f"the state is {100 * used // budget}% of its budget "
               f"({used / 1024**2:.1f} MiB of {budget / 1024**2:.1f} MiB)")
    if used >= budget:
        return [Finding(PROBLEM, node, "budget",
                        f"{figures}: new jobs are refused (507 state_full) while nothing "
                        f"finished is left to evict; {_MAKE_ROOM}")]
    if 100 * used >= thresholds.budget_warn_pct * budget:
        return [Finding(WARNING, node, "budget",
                        f"{figures}, at or over {thresholds.budget_warn_pct:g}%: new jobs are "
                        f"refused once they no longer fit; {_MAKE_ROOM}")]
    return []


_MAKE_ROOM = ("finish or cancel work, lower retention (raftcron settings retention), or raise "
              "the budget (raftcron settings budget SIZE)")


def _member(node: str, view: dict[str, Any], leader_view: dict[str, Any] | None,
            thresholds: Thresholds) -> list[Finding]:
    found = []
    if leader_view is not None:
        lag = int(leader_view["commit_index"]) - int(view["applied_index"])
        if lag > thresholds.max_lag_entries:
            found.append(Finding(WARNING, node, "lag",
                                 f"{lag} entries behind the leader's commit index"))
    clock = view.get("clock")
    if clock is not None and clock.get("skewed"):
        found.append(Finding(PROBLEM, node, "clock",
                             f"its clock is {clock.get('skew_ms')} ms off the majority's "
                             f"(max_skew_ms {clock.get('max_skew_ms')}): fix its time sync"))
    storage = view.get("storage") or {}
    if storage and not storage.get("healthy", True):
        found.append(Finding(PROBLEM, node, "storage",
                             f"cannot write: {storage.get('problem')}"))
    free = storage.get("free_bytes")
    if free is not None and free < thresholds.min_free_bytes:
        found.append(Finding(PROBLEM, node, "disk",
                             f"{free / 1024**2:.0f} MiB free on the data dir's filesystem "
                             f"(under {thresholds.min_free_bytes / 1024**2:.0f} MiB)"))
    entries = storage.get("log_entries")
    if entries is not None and entries > thresholds.max_log_entries:
        found.append(Finding(WARNING, node, "log",
                             f"{entries} entries since the last compaction (is compaction "
                             "running? see raft.compaction_min_entries)"))
    age_s = storage.get("snapshot_age_s")
    since = int(view["applied_index"]) - int(storage.get("snapshot_index") or 0)
    if age_s is not None and age_s > thresholds.max_snapshot_age_s and since > 0:
        # A quiet cluster keeps its last snapshot as long as nothing new comes: not a finding.
        found.append(Finding(WARNING, node, "snapshot",
                             f"the last snapshot is {_age(age_s)} old and {since} entries were "
                             f"applied since (over {_age(thresholds.max_snapshot_age_s)}): is "
                             "compaction failing? (action=snapshot_failed in its log)"))
    archive = view.get("archive") or {}
    pending = archive.get("pending_jobs") or 0
    if pending > thresholds.max_archive_pending_jobs:
        found.append(Finding(WARNING, node, "archive",
                             f"{pending:,} jobs wait for its archive's writer (over "
                             f"{thresholds.max_archive_pending_jobs:,}): is its disk slow? "
                             "applying slows to what the archive can write"))
    missing = archive.get("missing_jobs") or 0
    if missing:
        waiting = archive.get("unanswered_gap")
        found.append(Finding(WARNING, node, "archive",
                             f"its archive misses {missing:,} jobs (it installed a snapshot past "
                             "their evictions) and fills them from a peer; meanwhile it asks a "
                             "peer for what it cannot answer"
                             + ("" if not waiting else f"; no member could give jobs numbered "
                                f"{waiting[0]:,} to {waiting[1] - 1:,} yet")))
    return found + _budget(node, view, thresholds)


def rows(views: dict[str, dict[str, Any] | None]) -> list[list[Any]]:
    """The table `raftcron cluster doctor` prints: one row per member."""
    leader_commit = max((v["commit_index"] for v in views.values() if v is not None and
                         v["role"] == "leader"), default=None)
    out = []
    for node, view in sorted(views.items()):
        if view is None:
            out.append([node, "unreachable", "-", "-", "-", "-", "-", "-", "-", "-"])
            continue
        storage = view.get("storage") or {}
        clock = view.get("clock") or {}
        free = storage.get("free_bytes")
        age = storage.get("snapshot_age_s")
        out.append([
            node,
            view["role"],
            view["term"],
            "-" if leader_commit is None else leader_commit - view["applied_index"],
            "-" if clock.get("skew_ms") is None else f"{clock['skew_ms']} ms",
            "-" if free is None else f"{free / 1024**3:.1f} GiB",
            storage.get("log_entries", "-"),
            "-" if age is None else _age(age),
            _archive_cell(view.get("archive")),
            view.get("version", "-"),
        ])
    return out


def _archive_cell(archive: dict[str, Any] | None) -> str:
    """Rows, size on disk and the oldest row's age: `1,204,311 / 310 MiB / 6.0d`."""
    if archive is None or "rows" not in archive:
        return "off" if archive is None else "?"
    oldest = archive.get("oldest_finished_ms")
    age = "-" if oldest is None else _age(max(0.0, time.time() - oldest / 1000))
    return f"{archive['rows']:,} / {archive['file_bytes'] / 1024**2:.0f} MiB / {age}"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"
