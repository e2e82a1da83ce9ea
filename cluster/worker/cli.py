"""`raftcron worker`: the command line of the worker runtime.

Every flag has an environment fallback (`RAFTCRON_*`, named in `--help`); a flag wins over its
variable. The API token's variable is `RAFTCRON_API_TOKEN`, never `RAFTCRON_TOKEN`: that name
is the fencing token a shell job finds in its environment.

`main(argv)` parses and runs; `add_arguments(parser)` and `run(args)` let the top-level
`raftcron` command mount the same flags as its `worker` subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from raftcron.cluster.clients import tls
from raftcron.cluster.telemetry import logs, tracing
from raftcron.cluster.worker.runtime import Worker
from raftcron.cluster.worker.tasks import default_registry
from raftcron.scheduler import limits

log = logging.getLogger("raftcron.worker")
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


def _env(name: str, default: Any = None) -> Any:
    value = os.environ.get(name)
    return default if value is None or value == "" else value


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, not {value}")
        return value

    return convert


def _list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--connect",
        default=_env("RAFTCRON_CONNECT"),
        metavar="URL,URL",
        help="node URLs, comma-separated; the worker fails over between them "
        "(env RAFTCRON_CONNECT; required)",
    )
    add(
        "--queues",
        type=_list,
        default=_env("RAFTCRON_QUEUES", "default"),
        metavar="Q,Q",
        help="queues to claim from, comma-separated (env RAFTCRON_QUEUES; default: default)",
    )
    add(
        "--concurrency",
        type=_bounded_int(1, 10_000),
        default=_env("RAFTCRON_CONCURRENCY", "4"),
        metavar="N",
        help="jobs run at once (env RAFTCRON_CONCURRENCY; default 4)",
    )
    add(
        "--import",
        dest="imports",
        action="append",
        metavar="MODULE",
        help="module(s) registering tasks with @cluster.worker.task, comma-separated or "
        "repeated (env RAFTCRON_IMPORT)",
    )
    add(
        "--path",
        default=_env("RAFTCRON_PATH", "."),
        metavar="DIR",
        help="folder put first on sys.path before importing (env RAFTCRON_PATH; default .)",
    )
    add(
        "--name",
        default=_env("RAFTCRON_WORKER_NAME"),
        help="this worker's name in job histories (env RAFTCRON_WORKER_NAME; default: host-pid)",
    )
    add(
        "--lease-ms",
        metavar="MS",
        type=_bounded_int(limits.LEASE_MS_MIN, limits.LEASE_MS_MAX),
        default=_env("RAFTCRON_LEASE_MS", "30000"),
        help="lease of a claimed job; heartbeats every third of it "
        "(env RAFTCRON_LEASE_MS; default 30000)",
    )
    add(
        "--wait-ms",
        metavar="MS",
        type=_bounded_int(0, 30_000),
        default=_env("RAFTCRON_WAIT_MS", "5000"),
        help="how long one claim long-polls (env RAFTCRON_WAIT_MS; default 5000)",
    )
    add(
        "--timeout-ms",
        metavar="MS",
        type=_bounded_int(1, limits.TIMEOUT_MS_MAX),
        default=_env("RAFTCRON_TIMEOUT_MS"),
        help="time limit of a job that sets none (env RAFTCRON_TIMEOUT_MS; default: none)",
    )
    add(
        "--drain-timeout-ms",
        metavar="MS",
        type=_bounded_int(0, limits.DAY_MS),
        default=_env("RAFTCRON_DRAIN_TIMEOUT_MS", "30000"),
        help="on SIGTERM, how long running jobs may finish before they are stopped "
        "(env RAFTCRON_DRAIN_TIMEOUT_MS; default 30000)",
    )
    add(
        "--api-token",
        metavar="TOKEN",
        default=_env("RAFTCRON_API_TOKEN"),
        help="bearer token with the worker role (env RAFTCRON_API_TOKEN; prefer it: a command "
        "line is readable by every user of the host)",
    )
    for flag, env, what in tls.FLAGS:
        add(flag, metavar="FILE", default=_env(env), help=f"{what} (env {env})")
    add(
        "--allow-shell",
        action="store_true",
        default=str(_env("RAFTCRON_ALLOW_SHELL", "")).lower() in TRUE_WORDS,
        help="serve the built-in shell task: whoever may submit to --queues then runs "
        "commands on this worker (env RAFTCRON_ALLOW_SHELL=1; default off)",
    )
    add(
        "--shell-env",
        metavar="NAME,NAME",
        default=_env("RAFTCRON_SHELL_ENV", ""),
        help="worker environment variables shell commands also see, besides PATH, HOME and "
        "LANG; never RAFTCRON_* (env RAFTCRON_SHELL_ENV)",
    )
    add(
        "--no-shell",
        action="store_true",
        default=str(_env("RAFTCRON_NO_SHELL", "")).lower() in TRUE_WORDS,
        help="never serve the shell task, even with --allow-shell (env RAFTCRON_NO_SHELL=1)",
    )
    add(
        "--allow-http-task",
        action="store_true",
        default=str(_env("RAFTCRON_ALLOW_HTTP_TASK", "")).lower() in TRUE_WORDS,
        help="serve the built-in http task: whoever may submit to --queues then makes this "
        "worker call the --http-task-hosts from inside its network "
        "(env RAFTCRON_ALLOW_HTTP_TASK=1; default off)",
    )
    add(
        "--http-task-hosts",
        metavar="HOST,HOST",
        default=_env("RAFTCRON_HTTP_TASK_HOSTS", ""),
        help="hosts the http task may call: api.example.com, *.example.com (subdomains), "
        "or * for any; required with --allow-http-task (env RAFTCRON_HTTP_TASK_HOSTS)",
    )
    add(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default=_env("RAFTCRON_LOG_LEVEL", "info"),
        help="(env RAFTCRON_LOG_LEVEL; default info)",
    )


def import_modules(names: Sequence[str], path: str | None) -> None:
    if path:
        folder = os.path.abspath(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)
    for name in names:
        importlib.import_module(name)


def build_worker(args: argparse.Namespace) -> Worker:
    hosts = _list(args.http_task_hosts)
    if hosts and not args.allow_http_task:
        raise ValueError("--http-task-hosts is given but the http task is not allowed "
                         "(--allow-http-task)")
    return Worker(
        args.connect,
        queues=args.queues,
        concurrency=args.concurrency,
        name=args.name,
        lease_ms=args.lease_ms,
        wait_ms=args.wait_ms,
        drain_timeout_ms=args.drain_timeout_ms,
        timeout_ms=args.timeout_ms,
        token=args.api_token,
        tasks=default_registry,
        shell=args.allow_shell and not args.no_shell,
        shell_env=() if args.no_shell else _list(args.shell_env),
        http_hosts=hosts if args.allow_http_task else None,
        ca_file=args.ca_file,
        cert_file=args.cert_file,
        key_file=args.key_file,
    )


def run(args: argparse.Namespace) -> int:
    """Run a worker from parsed arguments; the process exit code."""
    logs.setup(args.log_level)
    if not args.connect:
        print("raftcron worker: --connect URL[,URL...] is required (or RAFTCRON_CONNECT)")
        return 2
    modules = [m for item in (args.imports or [_env("RAFTCRON_IMPORT", "")]) for m in _list(item)]
    try:
        import_modules(modules, args.path)
        worker = build_worker(args)
    except (ImportError, ValueError) as error:
        print(f"raftcron worker: {type(error).__name__}: {error}")
        return 2
    try:
        code = worker.run()
    except tracing.TracingUnavailable as error:
        print(f"raftcron worker: cannot start: {error}", file=sys.stderr)
        return 2
    threads = [t for t in threading.enumerate() if t.name.startswith("raftcron-job")]
    for thread in threads:
        thread.join(timeout=0.2)  # idle pool threads end as soon as they see the shutdown
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        # A handler thread that never returns would keep the interpreter alive forever.
        log.error(
            f"{len(stuck)} handler threads still running: exiting without them",
            extra={"action": "threads_abandoned", "threads": stuck},
        )
        logging.shutdown()
        os._exit(code)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="raftcron worker", description="Claim and run jobs from a raftcron cluster."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
