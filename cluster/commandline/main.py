"""The `raftcron` command: `node`, `worker`, the client and operator commands, the tools
(`demo`, `bench`, `storage`) and the chaos suite (`raftcron chaos run|check|cleanup`)."""

from __future__ import annotations

import argparse
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    """Every command but `chaos`'s own words (the suite parses those: chaos.__main__): what
    `main` parses, and what the CLI reference (docs/reference/cli.md) and the docs' tests read."""
    parser = argparse.ArgumentParser(
        prog="raftcron", description="A distributed job scheduler on Raft."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    node = commands.add_parser("node", help="run one cluster member")
    node.add_argument(
        "--config",
        default=os.environ.get("RAFTCRON_CONFIG"),
        help="TOML config file (env RAFTCRON_CONFIG); without one, the config comes from "
        "RAFTCRON_* variables alone (raftcron config env lists them)",
    )
    node.add_argument(
        "--rejoin-empty",
        nargs="?",
        const="yes",
        default="no",
        choices=["yes", "no", "auto"],
        metavar="auto",
        help="this node lost its data: start empty, catch up from the leader, and vote only "
        "once caught up (refused if the data dir still holds a log). =auto (a Kubernetes pod): "
        "with an empty data dir, ask the peers and rejoin only if they hold a cluster that "
        "lists this node (docs/operations/kubernetes.md)",
    )
    node.add_argument(
        "--ask-peers-s",
        type=_ask_peers_s,
        default=None,
        metavar="SECONDS",
        help="with --rejoin-empty=auto: ask the peers at most this long (default 20); "
        "undecided then, the node exits 75 without starting",
    )
    from raftcron.cluster.worker import cli as worker_cli

    worker = commands.add_parser(
        "worker", help="claim and run jobs (Python handlers, built-in shell task)"
    )
    worker_cli.add_arguments(worker)
    demo = commands.add_parser("demo", help="a local 3-node cluster, a worker and sample schedules")
    from raftcron.cluster.dev import demo as demo_module

    demo_module.add_arguments(demo)
    bench = commands.add_parser(
        "bench", help="measure a local (or running) cluster: throughput, latency, failover"
    )
    from raftcron.cluster.dev.bench import run as bench_run

    bench_run.add_arguments(bench)
    storage = commands.add_parser(
        "storage", help="check, repair or migrate a node's data dir (offline)"
    )
    from raftcron.cluster.storage import tool as storage_tool

    storage_tool.add_arguments(storage)
    restore = commands.add_parser(
        "restore", help="fill a new node's empty data dir from a backup (offline)"
    )
    from raftcron.cluster.ops import backup as backup_module

    backup_module.add_restore_arguments(restore)
    from raftcron.cluster.commandline import opsargs

    opsargs.add_commands(commands)
    config_command = commands.add_parser(
        "config", help="the node's config: env lists every key's RAFTCRON_* variable"
    )
    config_command.add_argument("what", choices=["env"])
    config_command.add_argument("--json", action="store_true", help="print JSON")
    from raftcron.cluster.commandline import notifycli, settingscli

    notifycli.add_commands(commands)
    settingscli.add_commands(commands)
    commands.add_parser(
        "chaos", help="the chaos suite: run | check FOLDER | cleanup (raftcron chaos --help)",
        add_help=False,
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["chaos"]:  # its own parser: every word after `chaos` is the suite's
        from raftcron.chaos.__main__ import main as chaos_main

        return chaos_main(words[1:])
    from raftcron.cluster.commandline import notifycli, opsargs, opscli, settingscli
    from raftcron.cluster.dev import demo as demo_module
    from raftcron.cluster.dev.bench import run as bench_run
    from raftcron.cluster.ops import backup as backup_module
    from raftcron.cluster.storage import tool as storage_tool
    from raftcron.cluster.worker import cli as worker_cli

    words, command_words = opsargs.split_command(words)
    args = parser.parse_args(words)
    if args.command in ("submit", "jobs", "schedules", "queues", "cluster", "audit", "backup"):
        args.argv = command_words
        return opscli.run(args)
    if args.command == "notifications":
        return opscli.run(args, notifycli.handle)
    if args.command == "settings":
        return opscli.run(args, settingscli.handle)
    if command_words:
        parser.error(f"{args.command}: unexpected arguments after --: {' '.join(command_words)}")
    if args.command == "bench":
        return bench_run.run(args)
    if args.command == "storage":
        return storage_tool.run(args)
    if args.command == "restore":
        return backup_module.run_restore(args)
    if args.command == "demo":
        return demo_module.run(args)
    if args.command == "worker":
        return int(worker_cli.run(args))
    if args.command == "config":
        return _print_config_variables(as_json=args.json)
    if args.command == "node":
        from raftcron.cluster import node as node_module
        from raftcron.cluster.membership.startmode import ASK_S_DEFAULT

        if args.ask_peers_s is not None and args.rejoin_empty != "auto":
            parser.error("node: --ask-peers-s goes with --rejoin-empty=auto")
        auto = args.rejoin_empty == "auto"
        return node_module.run(
            args.config or None, rejoin_empty=args.rejoin_empty == "yes",
            ask_peers_s=(args.ask_peers_s or ASK_S_DEFAULT) if auto else None)
    parser.error(f"unknown command {args.command}")
    return 2


def _ask_peers_s(text: str) -> float:
    from raftcron.cluster.membership.startmode import ASK_S_MAX

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= ASK_S_MAX:
        raise argparse.ArgumentTypeError(f"must be in (0, {ASK_S_MAX:g}], not {text}")
    return value


def _print_config_variables(*, as_json: bool) -> int:
    """`raftcron config env`: every key's variable, the file key it stands for, its default
    (from the config's schema, so the list cannot drift from what a node reads)."""
    import json

    from raftcron.cluster import config, configenv
    from raftcron.cluster.commandline.cliparts import table

    rows = configenv.table(config.KEYS)
    if as_json:
        names = ("variable", "key", "kind", "default")
        print(json.dumps([dict(zip(names, row, strict=True)) for row in rows], indent=2))
    else:
        print(table(["VARIABLE", "FILE KEY", "KIND", "DEFAULT"], rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
