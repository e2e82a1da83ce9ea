"""`raftcron settings show | retention | budget | archive | search-attributes` and `raftcron
cluster finalize`: the cluster's replicated settings and its upgrade gate from a shell
(DESIGN.md §9.0, §9.1, §9.2; admin token to change them).

`settings retention` replaces the retention setting whole: each flag left out takes its
default, and `--queue NAME:OUTCOME:AGE:COUNT` (repeatable) gives a queue its own rule (`-` for a
field it takes from the cluster-wide rule). Ages take `30s`, `15m`, `24h`, `7d`; sizes
`512MiB`, `2GiB`. `settings search-attributes customer.id invoice.number` declares the payload
paths every archive indexes (the list replaces the setting; `--none` declares none). Exit codes
and output as the other operator commands (cluster/commandline/opscli.py).
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from raftcron.cluster.clients.client import Client
from raftcron.cluster.commandline.cliparts import UsageError, add_common
from raftcron.cluster.commandline.cliparts import duration_ms as _duration
from raftcron.cluster.commandline.cliparts import print_answer as _print
from raftcron.cluster.commandline.cliparts import table as _table
from raftcron.scheduler.settings import OUTCOMES

_SIZE_RE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|TiB)?\s*$")
_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def add_commands(commands: Any) -> None:
    settings = commands.add_parser(
        "settings", help="retention, the state budget, archive retention and search attributes: "
        "show, or change them (admin)")
    actions = settings.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_common(actions.add_parser(
        "show", help="every setting, and the state against its budget"))
    retention = actions.add_parser(
        "retention", help="how long and how many finished jobs are kept (replaces it whole)")
    add_common(retention)
    for outcome in OUTCOMES:
        retention.add_argument(f"--{outcome}-age", metavar="AGE",
                               help=f"keep {outcome} jobs this long (e.g. 24h, 7d)")
        retention.add_argument(f"--{outcome}-count", metavar="N", type=int,
                               help=f"keep the newest N {outcome} jobs")
    retention.add_argument("--queue", action="append", default=[],
                           metavar="NAME:OUTCOME:AGE:COUNT",
                           help="a queue's own rule for an outcome ('-' takes the cluster's)")
    budget = actions.add_parser("budget", help="the state budget, in bytes of the memory model")
    add_common(budget)
    budget.add_argument("size", help="e.g. 512MiB, 2GiB, or a number of bytes")
    archive = actions.add_parser(
        "archive", help="how long and how much every member's archive keeps (replaces it whole)")
    add_common(archive)
    archive.add_argument("--age", metavar="AGE", help="keep archived jobs this long (e.g. 30d)")
    archive.add_argument("--size", metavar="SIZE", help="keep at most this much (e.g. 10GiB)")
    attributes = actions.add_parser(
        "search-attributes", help="the payload paths every member's archive indexes, so a "
        "search finds archived jobs by them without a time range (replaces the list whole)")
    add_common(attributes)
    attributes.add_argument("paths", nargs="*", metavar="PATH",
                            help="a payload path, as in --payload PATH=VALUE (e.g. customer.id)")
    attributes.add_argument("--none", action="store_true",
                            help="declare none (every attribute's index is dropped)")


def add_finalize(actions: Any) -> None:
    """`raftcron cluster finalize` (added to the `cluster` command's actions)."""
    add_common(actions.add_parser(
        "finalize",
        help="turn this release's behaviour on for good, once every member runs it "
        "(retention and budget settings; older releases can no longer join)"))


def handle(client: Client, args: argparse.Namespace) -> None:
    if args.action == "show":
        view = client.request("GET", "/v1/settings")
        _print(args, view, lambda: describe(view))
        return
    if args.action == "retention":
        body = retention_body(args)
    elif args.action == "budget":
        body = {"bytes": size_bytes(args.size)}
    elif args.action == "search-attributes":
        body = {"paths": attribute_paths(args)}
    else:
        body = {}
        if args.age is not None:
            body["max_age_ms"] = _duration(args.age, "--age")
        if args.size is not None:
            body["max_bytes"] = size_bytes(args.size)
    section = args.action.replace("-", "_")
    view = client.request("PUT", f"/v1/settings/{section}", body, write=True)
    _print(args, view, lambda: describe(view))


def finalize(client: Client, args: argparse.Namespace) -> None:
    answer = client.request("POST", "/v1/cluster/finalize", {}, write=True)
    members = ", ".join(f"{m['node_id']} (level {m['release_level']})"
                        for m in answer.get("members", []))
    done = "finalized now" if answer.get("finalized_now") else "already finalized"
    _print(args, answer, lambda: f"cluster {done}: level {answer['level']}; members {members}\n"
           + describe(answer["settings"]))


def retention_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for outcome in OUTCOMES:
        rule: dict[str, int] = {}
        age = getattr(args, f"{outcome}_age")
        count = getattr(args, f"{outcome}_count")
        if age is not None:
            rule["max_age_ms"] = _duration(age, f"--{outcome}-age")
        if count is not None:
            rule["max_count"] = count
        if rule:
            body[outcome] = rule
    queues: dict[str, dict[str, dict[str, int]]] = {}
    for text in args.queue:
        parts = text.split(":")
        if len(parts) != 4 or parts[1] not in OUTCOMES:
            raise UsageError(f"--queue {text!r}: give NAME:OUTCOME:AGE:COUNT, OUTCOME one of "
                             f"{', '.join(OUTCOMES)} ('-' for a field the cluster's rule gives)")
        name, outcome, age, count = parts
        rule = {}
        if age != "-":
            rule["max_age_ms"] = _duration(age, f"--queue {name}")
        if count != "-":
            if not count.isdigit():
                raise UsageError(f"--queue {text!r}: COUNT must be a whole number or '-'")
            rule["max_count"] = int(count)
        queues.setdefault(name, {})[outcome] = rule
    if queues:
        body["queues"] = queues
    return body


def attribute_paths(args: argparse.Namespace) -> list[str]:
    if bool(args.paths) == args.none:
        raise UsageError("give the payload paths to index (e.g. customer.id invoice.number), "
                         "or --none for none")
    return list(args.paths)


def size_bytes(text: str) -> int:
    match = _SIZE_RE.match(text)
    if match is None:
        raise UsageError(f"size {text!r}: give a number of bytes, or one with B, KiB, MiB, GiB "
                         "or TiB (e.g. 512MiB)")
    return int(match.group(1)) * _UNITS[match.group(2)]


def describe(view: dict[str, Any]) -> str:
    usage = view.get("usage", {})
    used = usage.get("state_bytes", 0)
    if not view.get("finalized"):
        return (f"not finalized (level {view.get('level')}): the previous release's behaviour, "
                "finished jobs kept 7 days, no budget. Run `raftcron cluster finalize` once "
                f"every member runs this release.\nstate: {_mib(used)}\n")
    budget = view["budget"]["bytes"]
    lines = [f"budget: {_mib(budget)}; state: {_mib(used)} ({100 * used / budget:.0f}%)"]
    parts = usage.get("parts", {})
    lines += [f"  {part}: {_mib(size)}" for part, size in parts.items() if size]
    rows = []
    retention = view["retention"]
    for outcome in OUTCOMES:
        rule = retention[outcome]
        rows.append(["*", outcome, _age(rule["max_age_ms"]), rule["max_count"],
                     usage.get("kept", {}).get(outcome, "-")])
    for queue, rules in sorted(retention.get("queues", {}).items()):
        for outcome, rule in rules.items():
            rows.append([queue, outcome, _age(rule["max_age_ms"]), rule["max_count"], "-"])
    evicted = ", ".join(f"{reason} {n}" for reason, n in usage.get("evicted", {}).items())
    archive = view.get("archive")
    if archive is not None:
        kept = usage.get("archive", {}).get("bytes", 0)
        lines.append(f"archive: keeps {_age(archive['max_age_ms'])} or "
                     f"{_mib(archive['max_bytes'])}, whichever first; holds {_mib(kept)}")
    attributes = view.get("search_attributes")
    if attributes is not None:
        lines.append("search attributes: " + (", ".join(attributes["paths"]) or "none"))
    return ("\n".join(lines) + "\n"
            + _table(["QUEUE", "OUTCOME", "MAX AGE", "MAX COUNT", "KEPT"], rows)
            + f"evicted: {evicted or 'none'}; fires refused for space: "
              f"{usage.get('fires_refused', 0)}\n")


def _mib(size: int) -> str:
    return f"{size / (1 << 20):,.1f} MiB"


def _age(ms: int) -> str:
    for unit, span in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)):
        if ms and ms % span == 0:
            return f"{ms // span}{unit}"
    return f"{ms}ms"
