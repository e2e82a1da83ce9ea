"""Checker 11: memory limits (chaos/tier2/memory_faults.py, DESIGN.md §9.3).

Two promises. A node whose state budget sits below its cgroup's limit, with room for the
snapshot writer's copied pages, is never OOM-killed, running or starting again: every OOM kill
the watcher saw (an `oom` event) must fall inside a squeeze of that node (an `oom` fault, from
its start until the kill it caused; a kill while the node starts again under the same limit
after it, a `restart_oom` event, is not one). And the squeeze
bites: each one ends with the node's main process dead of SIGKILL and its cgroup's `oom_kill`
count moved (an `oom_fault` event), or the nemesis proved nothing. What the node lost by dying
is judged by the jobs and convergence checkers, as after any other kill.
"""

from __future__ import annotations

from raftcron.chaos.tier2.checkers.data import CheckResult, RunData

MIB = 1 << 20


def check_memory(run: RunData) -> CheckResult:
    """OOM kills only where the nemesis squeezed, and every squeeze a real OOM kill."""
    result = CheckResult("memory limits", safety=False)
    # A squeeze's OOM kill is expected from its start until its kill was recorded (the
    # `oom_fault` event); one while the node starts again after it is not.
    killed_at = {e.get("id"): int(e["t"]) for e in run.history if e.get("kind") == "oom_fault"}
    squeezes = [(start, killed_at.get(event.get("id"), end), event)
                for start, end, event in run.faults() if event.get("fault") == "oom"]
    restarts = [e for e in run.history if e.get("kind") == "restart_oom"]
    counts: dict[str, float] = {
        "squeezes": len(squeezes), "main_oom_killed": 0, "mid_snapshot": 0,
        "writer_alive_at_kill": 0, "oom_kills": 0, "unexpected_oom_kills": 0,
        "restarts_oom_killed": len(restarts),
        "restarts_under_raised_limit": sum(
            1 for e in run.history if e.get("kind") == "oom_restart"
            and any(r.get("id") == e.get("id") for r in restarts))}
    for record in run.history:
        kind = record.get("kind")
        if kind == "oom":
            counts["oom_kills"] += 1
            node, at = record.get("node"), int(record["t"])
            inside = any(start <= at <= end + 1_000 and node in event.get("targets", ())
                         for start, end, event in squeezes)
            # The restart's own record holds the limit it started under and its peak (the
            # watcher may read the cgroup after the next start changed them).
            starting = next((r for r in restarts if r.get("node") == node
                             and abs(int(r["t"]) - at) <= 5_000), None)
            if not inside:
                counts["unexpected_oom_kills"] += 1
                seen = starting or record
                when = ("while it started again after a squeeze" if starting
                        else "outside any squeeze, running")
                result.violate(
                    f"{node} OOM-killed at {at} {when} (limit {_mib(seen.get('limit_bytes'))}"
                    f", peak usage {_mib(seen.get('max_usage_bytes'))})")
        elif kind == "oom_fault":
            if record.get("mid_snapshot"):
                counts["mid_snapshot"] += 1
            if record.get("writer_alive_at_kill"):
                counts["writer_alive_at_kill"] += 1
            if record.get("killed_by_sigkill") and int(record.get("oom_kills_moved") or 0) > 0:
                counts["main_oom_killed"] += 1
            else:
                result.violate(
                    f"{record.get('id')} squeeze of {record.get('node')} did not OOM-kill its "
                    f"main process (exit {record.get('exit_code')}, cgroup oom_kill moved by "
                    f"{record.get('oom_kills_moved')}, limit {_mib(record.get('limit_bytes'))})")
            if record.get("writer_outlived"):
                result.violate(f"{record.get('id')}: the snapshot writer outlived its "
                               "OOM-killed node")
    budget_phase = [r for r in run.history
                    if r.get("kind") == "memory_usage" and r.get("phase") == "budget"]
    for name, field in (("budget_phase_peak_usage_mib", "max_usage_bytes"),
                        ("budget_phase_peak_anonymous_mib", "anonymous_peak_bytes")):
        peaks = [int(r[field]) for r in budget_phase if isinstance(r.get(field), int)]
        if peaks:
            counts[name] = round(max(peaks) / MIB, 1)
    result.counts = counts
    return result


def _mib(value: object) -> str:
    return "?" if not isinstance(value, int) else f"{value / MIB:.1f} MiB"
