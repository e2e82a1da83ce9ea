"""Checker 10: membership (DESIGN.md §8.4; chaos/tier2/member_faults.py) and leaders.

Safety, in every scenario: never two leaders in one term (from every node's log: each node
logs the term in which it became leader). In the `members` scenario also: a second change
asked for while one was in progress was refused (409 `membership_change_in_progress`), a
removed node never led again (until it was added anew, with an empty data dir), every change
ended (done or aborted) once its faults were healed, and at the end every member names the
same members, which are the voters of its Raft configuration and the members the harness
expects. Lost writes, divergence and duplicate fires are the other checkers'.
"""

from __future__ import annotations

from typing import Any

from raftcron.chaos.tier2.checkers.data import CheckResult, RunData


def check_membership(run: RunData) -> CheckResult:
    result = CheckResult("membership and leaders", safety=True)
    leaders: list[dict[str, Any]] = run.setting("leaders", [])
    by_term: dict[int, set[str]] = {}
    for record in leaders:
        by_term.setdefault(int(record["term"]), set()).add(str(record["node"]))
    for term, nodes in sorted(by_term.items()):
        if len(nodes) > 1:
            result.violate(f"term {term} had {len(nodes)} leaders: {sorted(nodes)}")
    changes = [e for e in run.history if e.get("kind") == "member"]
    counts = {"leader_terms": len(by_term), "adds": 0, "removes": 0, "done": 0, "aborted": 0,
              "second_refused": 0, "second_after_first": 0, "second_unanswered": 0}
    for event in changes:
        op = event.get("op")
        if op == "begin":
            counts["adds" if event.get("action") == "add" else "removes"] += 1
        elif op == "conflict":
            _second_change(event, counts, result)
        elif op == "end":
            outcome = event.get("outcome")
            if outcome in ("done", "aborted"):
                counts[outcome] += 1
            else:
                result.violate(f"{event.get('action')} of {event.get('node')} did not end")
    _removed_never_lead(changes, leaders, result)
    _final_members(run.setting("members_final", None), result)
    result.counts = counts
    return result


def _second_change(event: dict[str, Any], counts: dict[str, int],
                   result: CheckResult) -> None:
    """A second change asked for while the first ran: refused with the right code; or begun,
    and then only after the first ended (the answering node's view says so)."""
    status, code = event.get("status"), event.get("code")
    what = f"a second change while {event.get('action')} of {event.get('node')} ran"
    if status == 409:
        if code == "membership_change_in_progress":
            counts["second_refused"] += 1
        else:
            result.violate(f"{what} was refused with {code}, not membership_change_in_progress")
    elif status in (200, 201, 202):
        if event.get("first_ended"):
            counts["second_after_first"] += 1
        else:
            result.violate(f"{what} began (HTTP {status}) while change {event.get('first')} "
                           "had not ended: two changes at once")
    elif isinstance(status, int) and 400 <= status < 500:
        result.violate(f"{what} got {status} {code}")
    else:
        counts["second_unanswered"] += 1  # no member answered in time (a fault held)


def _removed_never_lead(changes: list[dict[str, Any]], leaders: list[dict[str, Any]],
                       result: CheckResult) -> None:
    """From a removal's end to the node's next addition, it never becomes leader."""
    for index, event in enumerate(changes):
        if (event.get("op"), event.get("action"), event.get("outcome")) != (
                "end", "remove", "done"):
            continue
        node, since = event.get("node"), int(event["t"])
        back = next((int(e["t"]) for e in changes[index + 1:]
                     if e.get("op") == "begin" and e.get("action") == "add"
                     and e.get("node") == node), None)
        for record in leaders:
            at = int(record["t"])
            if record["node"] == node and at > since and (back is None or at < back):
                result.violate(f"{node} became leader in term {record['term']} after its "
                               "removal")


def _final_members(final: dict[str, Any] | None, result: CheckResult) -> None:
    if not final:
        return
    expected = sorted(final["expected"])
    for node, view in sorted(final["views"].items()):
        if view is None:
            result.violate(f"{node} did not say whom it counts as members at the end")
            continue
        named = sorted(m["node_id"] for m in view["members"] if m["state"] == "voter")
        if named != expected or sorted(view["voters"]) != expected or view["change"]:
            result.violate(f"{node} ends with members {named}, voters {view['voters']}, change "
                           f"{view['change']}; the cluster's members are {expected}")
