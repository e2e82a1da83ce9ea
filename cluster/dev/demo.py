"""`raftcron demo`: a 3-node cluster on loopback, one worker and two sample schedules.

The nodes use `configs/local-3` (HTTP on 8001-8003, Raft on 7001-7003), so the tour (README,
docs/getting-started/tour.md) and the CLI's default `--connect` reach them; all state lives under
`data/local-3` and survives a restart of the demo (`--fresh` starts empty). Logs go to
`data/local-3/logs/`. Ctrl-C stops the worker (it drains), then the nodes, and waits for every
process to exit.

`--tls` serves the API over HTTPS: a throwaway CA and a certificate for 127.0.0.1 are made
under `<data>/tls/` (with the openssl command), each node runs from a copy of its config with
`[api] tls_cert_file`/`tls_key_file` added, and the worker, the peers and the CLI verify the
nodes against the CA through `RAFTCRON_CA_FILE`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from raftcron.cluster import config as configuration
from raftcron.cluster.clients import tls
from raftcron.cluster.dev import tomlwrite
from raftcron.cluster.dev.certs import CertsError, LocalCA

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs" / "local-3"
SCHEDULES: dict[str, dict[str, Any]] = {
    "demo-every-5s": {
        "every": "5s",
        "overlap": "forbid",
        "job": {
            "task": "shell",
            "payload": {
                "argv": [
                    "sh",
                    "-c",
                    'echo "hello from $RAFTCRON_JOB_KEY (attempt $RAFTCRON_ATTEMPT)"; date -u',
                ]
            },
        },
        "description": "A shell job every 5 seconds: watch it fire on the dashboard.",
    },
    "demo-daily-report": {
        "cron": "0 9 * * *",
        "tz": "Europe/Paris",
        "misfire": "fire_once",
        "job": {
            "task": "shell",
            "payload": {"argv": ["sh", "-c", "echo report for $(date -u +%F)"]},
        },
        "description": "A daily cron at 09:00 Paris time: see its next fire time.",
    },
}


class Demo:
    def __init__(
        self,
        *,
        fresh: bool,
        duration_s: float | None,
        configs: list[Path] | None = None,
        https: bool = False,
    ) -> None:
        self.configs = configs or sorted(CONFIGS.glob("n*.toml"))
        self.https = https
        self.ca_file: Path | None = None
        self.client_tls: ssl.SSLContext | None = None
        self.nodes = [configuration.load(path) for path in self.configs]
        self.data_dir = Path(os.path.commonpath([node.data_dir.parent for node in self.nodes]))
        self.log_dir = self.data_dir / "logs"
        self.fresh = fresh
        self.duration_s = duration_s
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.stopping = False

    @property
    def urls(self) -> list[str]:
        scheme = "https" if self.https else "http"
        return [f"{scheme}://{node.http_address}" for node in self.nodes]

    def run(self) -> int:
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGTERM, self._on_signal)
        try:
            self._check_ports()
            if self.fresh:
                for node in self.nodes:
                    shutil.rmtree(node.data_dir, ignore_errors=True)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            configs = self._with_tls() if self.https else self.configs
            for path, node in zip(configs, self.nodes, strict=True):
                self._spawn(
                    node.node_id,
                    [sys.executable, "-m", "raftcron.cluster.commandline", "node", "--config",
                     str(path)],
                )
            leader = self._wait_ready(timeout_s=60)
            for name, spec in SCHEDULES.items():
                self._call("PUT", f"/v1/schedules/{name}", spec)
            self._spawn(
                "worker",
                [
                    sys.executable,
                    "-m",
                    "raftcron.cluster.commandline",
                    "worker",
                    "--connect",
                    ",".join(self.urls),
                    "--concurrency",
                    "4",
                    "--name",
                    "demo-worker",
                    "--allow-shell",  # the demo's schedules are shell jobs
                ],
            )
            self._banner(leader)
            deadline = None if self.duration_s is None else time.monotonic() + self.duration_s
            while not self.stopping and (deadline is None or time.monotonic() < deadline):
                self._watch()
                time.sleep(0.2)
            return 0
        except (DemoError, CertsError) as error:
            print(f"raftcron demo: {error}", file=sys.stderr)
            return 1
        finally:
            self._stop_all()

    # -- steps ------------------------------------------------------------------------------

    def _check_ports(self) -> None:
        import socket

        for node in self.nodes:
            for address in (node.raft_address, node.http_address):
                host, port = address.rsplit(":", 1)
                with socket.socket() as probe:
                    if probe.connect_ex((host, int(port))) == 0:
                        raise DemoError(
                            f"{address} is already in use (another demo or node running?); "
                            "stop it first"
                        )

    def _with_tls(self) -> list[Path]:
        """A CA and a server certificate under <data>/tls, and a copy of each node's config
        serving HTTPS with it (paths made absolute, as the copies live in another folder)."""
        folder = self.data_dir / "tls"
        shutil.rmtree(folder, ignore_errors=True)
        ca = LocalCA(folder, name="raftcron demo CA")
        cert, key = ca.issue("node", server=True)
        self.ca_file, self.client_tls = ca.cert, ca.context()
        copies = []
        for path, node in zip(self.configs, self.nodes, strict=True):
            raw = tomllib.loads(path.read_text())
            raw["data_dir"] = str(node.data_dir)
            api = raw.setdefault("api", {})
            if api.get("tokens_file") is not None:
                api["tokens_file"] = str((path.resolve().parent / api["tokens_file"]).resolve())
            api.update(tls_cert_file=str(cert), tls_key_file=str(key))
            api.pop("tls_client_ca_file", None)
            copy = folder / f"{node.node_id}.toml"
            copy.write_text(tomlwrite.dumps(raw))
            configuration.load(copy)  # what the node will read: refused here, not in its log
            copies.append(copy)
        return copies

    def _spawn(self, name: str, command: list[str]) -> None:
        log = (self.log_dir / f"{name}.log").open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.ca_file is not None:  # the worker, and each node asking its peers, verify
            env[tls.CA_FILE_ENV] = str(self.ca_file)
        process = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self.processes.append((name, process))

    def _wait_ready(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stopping:
            self._watch()
            leaders = set()
            for url in self.urls:
                status, body = self._get(url + "/readyz")
                if status == 200:
                    leaders.add(body.get("leader"))
            if len(leaders) == 1 and None not in leaders and self._all_ready():
                return str(leaders.pop())
            time.sleep(0.2)
        raise DemoError(f"the cluster was not ready within {timeout_s:.0f} s; see {self.log_dir}")

    def _all_ready(self) -> bool:
        return all(self._get(url + "/readyz")[0] == 200 for url in self.urls)

    def _get(self, url: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(url, timeout=2, context=self.client_tls) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, {}
        except (OSError, ValueError):
            return 0, {}

    def _call(self, method: str, path: str, body: Any) -> Any:
        for url in self.urls:
            request = urllib.request.Request(
                url + path,
                data=json.dumps(body).encode(),
                method=method,
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(
                    request, timeout=10, context=self.client_tls
                ) as answer:
                    return json.loads(answer.read())
            except urllib.error.HTTPError as error:
                raise DemoError(
                    f"{method} {path}: {error.code} {error.read().decode()[:300]}"
                ) from None
            except OSError:
                continue
        raise DemoError(f"{method} {path}: no node answered")

    def _banner(self, leader: str) -> None:
        first = self.urls[0]
        pids = "\n".join(
            f"  {name}  pid {process.pid}" for name, process in self.processes if name != "worker"
        )
        print(
            f"""
raftcron demo: a 3-node cluster on loopback, one worker, two schedules.

  dashboard   {first}/
  API         {", ".join(self.urls)}     (leader now: {leader})
  data, logs  {self.data_dir}

Try, in another terminal (.venv/bin/raftcron, or `make` puts it in .venv/bin):{self._tls_hint()}
  raftcron cluster status
  raftcron schedules list
  raftcron submit shell -- sh -c 'echo hello; sleep 2'
  raftcron jobs list --schedule demo-every-5s
  kill -9 <a node's pid from the list below>      then: raftcron cluster status

Nodes:
{pids}

Ctrl-C stops everything.
""",
            flush=True,
        )

    def _tls_hint(self) -> str:
        if self.ca_file is None:
            return ""
        return (
            "\n  # HTTPS: the CLI verifies the nodes against the demo's CA (your browser does not"
            "\n  # know it: accept its warning, or import the CA)"
            f"\n  export {tls.CA_FILE_ENV}={self.ca_file}"
            f"\n  export RAFTCRON_CONNECT={','.join(self.urls)}"
        )

    def _watch(self) -> None:
        for name, process in self.processes:
            if process.poll() is not None and not self.stopping and name == "worker":
                log = self.log_dir / "worker.log"
                print(f"raftcron demo: the worker exited ({process.returncode}); see {log}")
                self.stopping = True

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def _stop_all(self) -> None:
        """The worker first (it drains), then the nodes; every process waited for."""
        self.stopping = True
        ordered = [p for p in self.processes if p[0] == "worker"] + [
            p for p in self.processes if p[0] != "worker"
        ]
        for name, process in ordered:
            if process.poll() is None:
                _signal_group(process, signal.SIGTERM)
            deadline = time.monotonic() + (35 if name == "worker" else 15)
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if process.poll() is None:
                print(f"raftcron demo: {name} did not stop in time; killing it", file=sys.stderr)
                _signal_group(process, signal.SIGKILL)
                process.wait(5)
        if self.processes:
            print("raftcron demo: stopped", flush=True)


class DemoError(Exception):
    pass


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="raftcron demo", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)


def add_arguments(parser: Any) -> None:
    parser.add_argument("--fresh", action="store_true", help="delete the demo's data first")
    parser.add_argument("--duration", type=float, help="stop by itself after this many seconds")
    parser.add_argument(
        "--config",
        action="append",
        type=Path,
        dest="configs",
        help="node configs to use instead of configs/local-3 (repeat per node)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="serve the API over HTTPS with a throwaway CA made under <data>/tls (needs openssl)",
    )


def run(args: Any) -> int:
    return Demo(
        fresh=args.fresh, duration_s=args.duration, configs=args.configs, https=args.tls
    ).run()
