"""`raftcron chaos run [--smoke] [--seed N] [--scenario NAME ...] [--minutes M] [--keep]`.

Runs tier 2 of CHAOS.md: real `raftcron node` processes and workers under faults, a recorded
history per scenario, the checkers, and a report. Exit status: 0 when every checker passed,
1 on any safety violation or harness error, 2 when only a liveness bound was missed.

Also `raftcron chaos cleanup` (remove the namespaces and processes a crashed run left) and
`raftcron chaos worker ...` (the worker process the suite starts; not for people).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path

DEFAULT_OUT = Path("data/chaos")


def build_parser() -> argparse.ArgumentParser:
    """`raftcron chaos`'s words (also read by the CLI reference, docs/reference/cli.md)."""
    parser = argparse.ArgumentParser(prog="raftcron chaos")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run scenarios and check them")
    run.add_argument("--smoke", action="store_true",
                     help="the CI smoke: kill, pause, isolate the leader; whole-cluster restart")
    run.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    run.add_argument("--scenario", action="append", default=[], metavar="NAME",
                     help="run only these scenarios (repeatable)")
    run.add_argument("--minutes", type=float, default=4.0,
                     help="fault phase per scenario in the full run (default 4)")
    run.add_argument("--keep", action="store_true", help="keep nodes' Raft data of passing runs")
    run.add_argument("--transport", choices=["auto", "netns", "relay"], default="auto",
                     help="netns: namespaces (root); relay: the in-process loopback relay")
    run.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where run folders go")
    run.add_argument("--list", action="store_true", help="list the scenarios and exit")
    check = commands.add_parser("check", help="run the checkers again on a kept run folder")
    check.add_argument("folders", type=Path, nargs="+", metavar="FOLDER")
    commands.add_parser("cleanup", help="remove what a crashed run left behind")
    commands.add_parser("worker", help="(internal) a worker process", add_help=False)
    return parser


def _parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_known_args(argv)[0]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        from raftcron.chaos.tier2.workload import worker_main

        return worker_main(argv[1:])
    args = _parse(argv)
    if args.command == "check":
        return _check(args.folders)
    if args.command == "cleanup":
        from raftcron.chaos.tier2.netns import remove_leftovers

        removed = remove_leftovers() if os.geteuid() == 0 else []  # slots no live run holds
        if os.geteuid() == 0:  # memory cgroups of a run that is gone (memory scenario)
            from raftcron.chaos.tier2.memory_faults import remove_leftover_groups

            removed += remove_leftover_groups()
        print(f"removed: {', '.join(removed) or 'nothing'}")
        return 0
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from raftcron.chaos.tier2 import report
    from raftcron.chaos.tier2.scenarios import FULL, SCENARIOS, eprint, prune, run_scenario

    if args.list:
        for scenario in SCENARIOS.values():
            print(f"{scenario.name:11} {scenario.description}")
        return 0
    names = args.scenario or (["smoke"] if args.smoke else FULL)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        eprint(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = (args.out / f"{stamp}-seed{seed}").resolve()
    eprint(f"chaos: seed {seed}, scenarios {', '.join(names)}, folder {root}")
    root.mkdir(parents=True, exist_ok=True)
    # The harness's own clients log every failover; keep that in the run folder, not on screen.
    handler = logging.FileHandler(root / "harness.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    # Ctrl-C and SIGTERM unwind through every finally: processes, namespaces, rules go.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)  # also when started with SIGINT ignored (`cmd &`)
    outcomes = []
    interrupted = False
    for name in names:
        scenario = SCENARIOS[name]
        duration_s = 0.0 if scenario.smoke else args.minutes * 60
        eprint(f"chaos: {name} - {scenario.description}")
        try:
            outcome = run_scenario(
                scenario, seed=seed, duration_s=duration_s, folder=root / name,
                transport=args.transport, progress=_progress,
            )
        except KeyboardInterrupt:
            interrupted = True
            break
        _progress("")
        outcomes.append(outcome)
        eprint(f"chaos: {name}: {report.verdict(outcome)} "
               f"({sum(outcome.faults.values())} faults, {outcome.elapsed_s:.0f} s)")
        prune(outcome, args.keep)
    print(report.render(outcomes, seed), flush=True)
    if interrupted:
        eprint(f"chaos: interrupted; seed {seed}; folder {root}")
        return 130
    if any(not o.safety_ok for o in outcomes):
        eprint(f"chaos: SAFETY VIOLATION or harness error; seed {seed}; kept {root}")
        return 1
    if any(not o.ok for o in outcomes):
        eprint(f"chaos: liveness bound missed; seed {seed}; kept {root}")
        return 2
    return 0


def _check(folders: list[Path]) -> int:
    """Re-judge kept runs (history.jsonl, final.json, sink.sqlite in each scenario folder)."""
    import json

    from raftcron.chaos.tier2 import checkers, history, workload

    status = 0
    for folder in folders:
        if not (folder / "final.json").exists():
            continue
        final = json.loads((folder / "final.json").read_text())
        data = checkers.RunData(
            history=history.load(folder / "history.jsonl"), jobs=final["jobs"],
            schedules=final["schedules"], cluster_events=final["events"],
            digests=final["digests"], sink=workload.read_sink(folder / "sink.sqlite"),
            settings=final["settings"],
        )
        print(f"== {folder}")
        for result in checkers.check_all(data):
            print(f"   [{'ok' if result.ok else 'FAIL'}] {result.name}: {result.counts}")
            for violation in result.violations:
                print(f"       - {violation}")
            if not result.ok:
                status = 1
    return status


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _progress(text: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + text)
    elif text:
        sys.stderr.write(text + "\n")
    with contextlib.suppress(Exception):
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
