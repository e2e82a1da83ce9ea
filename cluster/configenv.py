"""The environment form of a node's config (DESIGN.md §9.5), so a container or a pod needs no
templated file.

What it owns:
- the naming rule: every key of the config's schema (cluster/config.py `KEYS`) has one
  variable, `RAFTCRON_` + its section and name in capitals (`[raft] heartbeat_s` ->
  `RAFTCRON_RAFT_HEARTBEAT_S`, a top-level key `log_level` -> `RAFTCRON_LOG_LEVEL`);
- reading a variable as the value a TOML file would hold after `key = `, strings unquoted:
  numbers and booleans in TOML's spelling (`0.05`, `512_000`, `true`), a table as a TOML
  inline table; the peers as one list, `RAFTCRON_PEERS="n2=host:7001/host:8001,..."`;
- the refusals: a key set both in the file and in the environment (naming both), and a
  `RAFTCRON_*` variable that is neither a key's nor one the project uses for something else
  (`OTHER_USES`): a typo must not be ignored;
- what a Kubernetes pod gives, asked for explicitly by `RAFTCRON_POD_RAFT_ADDRESS` and
  `RAFTCRON_POD_HTTP_ADDRESS` (see `_pod`).

What it must not do: judge a value. cluster/config.py validates the merged table with the
file's own messages; an error about a value that came from here is renamed to its variable.
The API tokens are not read here: `RAFTCRON_API_TOKENS` merges with the file's (config.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import string
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PREFIX = "RAFTCRON_"
# What a key holds, which says how its variable is read.
KINDS = ("string", "path", "integer", "number", "boolean", "peers", "tokens", "table")
PEERS_FORM = "node_id=raft_address/http_address"
POD_TEMPLATES = {  # variable -> the key its template gives
    "RAFTCRON_POD_RAFT_ADDRESS": "raft_address",
    "RAFTCRON_POD_HTTP_ADDRESS": "http_address",
}
POD_NAME_VARIABLES = ("POD_NAME", "HOSTNAME")  # where a pod's node id comes from, in order
POD_NAMESPACE_VARIABLE = "POD_NAMESPACE"

# `RAFTCRON_*` variables the project reads for other purposes: a node started where they are
# set (a shell that also runs workers and client commands, a test run) accepts them. The test
# tests/test_configenv.py finds every `RAFTCRON_` name in the tree and fails on one missing here.
OTHER_USES = {
    "RAFTCRON_CONFIG": "the config file of `raftcron node` and `raftcron storage`",
    **dict.fromkeys(
        ("RAFTCRON_CONNECT", "RAFTCRON_API_TOKEN", "RAFTCRON_DEADLINE", "RAFTCRON_CA_FILE",
         "RAFTCRON_CERT_FILE", "RAFTCRON_KEY_FILE"),
        "the client commands and the worker (--connect, --api-token, --deadline, TLS files)"),
    **dict.fromkeys(
        ("RAFTCRON_QUEUES", "RAFTCRON_CONCURRENCY", "RAFTCRON_IMPORT", "RAFTCRON_PATH",
         "RAFTCRON_WORKER_NAME", "RAFTCRON_LEASE_MS", "RAFTCRON_WAIT_MS", "RAFTCRON_TIMEOUT_MS",
         "RAFTCRON_DRAIN_TIMEOUT_MS", "RAFTCRON_ALLOW_SHELL", "RAFTCRON_SHELL_ENV",
         "RAFTCRON_NO_SHELL", "RAFTCRON_ALLOW_HTTP_TASK", "RAFTCRON_HTTP_TASK_HOSTS"),
        "`raftcron worker`'s flags"),
    **dict.fromkeys(
        ("RAFTCRON_JOB_ID", "RAFTCRON_JOB_KEY", "RAFTCRON_ATTEMPT", "RAFTCRON_TOKEN",
         "RAFTCRON_SCHEDULE", "RAFTCRON_FIRE_TIME_MS"),
        "what the shell task gives a job's command"),
    **dict.fromkeys(
        ("RAFTCRON_TEST_MARK", "RAFTCRON_CHROMIUM", "RAFTCRON_NO_BROWSER_INSTALL",
         "RAFTCRON_FUZZ_EXAMPLES", "RAFTCRON_FUZZ_SCHEDULES", "RAFTCRON_FUZZ_SEED",
         "RAFTCRON_FUZZ_NODE_LOG", "RAFTCRON_TIER0_EXAMPLES", "RAFTCRON_TIER1_SEEDS",
         "RAFTCRON_TIER1_FIRST_SEED", "RAFTCRON_TIER1_POWER_SEEDS",
         "RAFTCRON_TIER1_POWER_FIRST_SEED", "RAFTCRON_IMAGE_LOCK"),
        "the test suite"),
}


class ConfigError(Exception):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclass(frozen=True)
class ConfigKey:
    """One key of the config's schema: where it sits in the file, what it holds, its default
    (None: the key has none; a node without it is refused, or goes without)."""

    path: str  # "raft.heartbeat_s"; a top-level key has no dot
    kind: str
    default: object = None
    required: bool = False

    @property
    def variable(self) -> str:
        return PREFIX + self.path.replace(".", "_").upper()


def dataclass_keys(section: str, settings: type) -> list[ConfigKey]:
    """The keys of a section that is a dataclass of defaults, its kinds read off the defaults."""
    keys = []
    for item in dataclasses.fields(settings):
        default = item.default
        if isinstance(default, bool):
            kind = "boolean"
        elif isinstance(default, int):
            kind = "integer"
        elif isinstance(default, float):
            kind = "number"
        elif "Path" in str(item.type):
            kind = "path"
        else:
            kind = "string"
        keys.append(ConfigKey(f"{section}.{item.name}", kind, default))
    return keys


@dataclass
class MergedConfig:
    """The file's table with the environment's values added, and where each of those came
    from, to name the variable in an error about its value."""

    raw: dict[str, Any]
    sources: dict[str, str] = field(default_factory=dict)  # key path -> variable
    peer_positions: list[int] = field(default_factory=list)  # each kept peer's index in its list

    def rename(self, error: ConfigError) -> ConfigError:
        """`error` naming the variable its key came from (unchanged when from the file)."""
        peer = re.fullmatch(r"peers\[(\d+)\](.*)", error.key)
        if peer and "peers" in self.sources and int(peer[1]) < len(self.peer_positions):
            where = f"{self.sources['peers']}[{self.peer_positions[int(peer[1])]}]"
            return ConfigError(where + peer[2], error.message)
        for path, variable in self.sources.items():
            if error.key == path:
                return ConfigError(variable, error.message)
            if error.key.startswith(path + "."):
                rest = error.key[len(path) + 1:]
                return ConfigError(variable, f"{rest}: {error.message}")
        return error


def merge(
    file_raw: Mapping[str, Any], environ: Mapping[str, str], keys: Sequence[ConfigKey], *,
    file_label: str | None,
) -> MergedConfig:
    """The config `file_raw` (empty when there is no file) with every key's variable added.
    ConfigError for an unknown `RAFTCRON_*` variable, a key set in both, a missing required
    key when there is no file, or a value that is not one (the file's checks come after)."""
    _refuse_unknown(environ, keys)
    merged = MergedConfig({name: dict(value) if isinstance(value, dict) else value
                     for name, value in file_raw.items()})
    peers: list[tuple[int, dict[str, str]]] | None = None
    for key in keys:
        text = environ.get(key.variable)
        if text is None or key.kind == "tokens":
            continue
        if _holds(file_raw, key.path):
            raise ConfigError(key.variable, f"{key.path} is set both in {file_label} and in "
                              f"the environment ({key.variable}): keep one")
        if key.kind == "peers":
            peers = _peer_entries(text, key.variable)
            merged.sources[key.path] = key.variable
            continue
        section, _, name = key.path.rpartition(".")
        table = merged.raw.setdefault(section, {}) if section else merged.raw
        if not isinstance(table, dict):
            raise ConfigError(section, "must be a table")
        table[name] = _value(key, text)
        merged.sources[key.path] = key.variable
    _pod(merged, environ, file_label)
    if file_label is None:  # before the peers, which are told apart from this node by it
        for key in keys:
            if key.required and key.path not in merged.raw:
                raise ConfigError(key.variable, "is required: no config file was given "
                                  "(--config or RAFTCRON_CONFIG), so the node's config comes "
                                  "from the environment (docs/operations/deploy.md, "
                                  "\"Configuration from the environment\")")
    if peers is not None:
        _add_peers(merged, peers, environ)
    return merged


def _refuse_unknown(environ: Mapping[str, str], keys: Sequence[ConfigKey]) -> None:
    known = {key.variable for key in keys} | set(POD_TEMPLATES) | set(OTHER_USES)
    unknown = sorted(name for name in environ if name.startswith(PREFIX) and name not in known)
    if not unknown:
        return
    suffixes = sorted(name[len(PREFIX):] for name in known)  # the prefix would make all close
    hints = [f"{name} (did you mean {PREFIX}{close[0]}?)" if (close := difflib.get_close_matches(
        name[len(PREFIX):], suffixes, n=1, cutoff=0.8)) else name for name in unknown]
    also = f"; unknown as well: {', '.join(hints[1:])}" if len(hints) > 1 else ""
    raise ConfigError(unknown[0], f"is not a raftcron variable{hints[0][len(unknown[0]):]}"
                      f"{also} (`raftcron config env` lists every variable)")


def _holds(raw: Mapping[str, Any], path: str) -> bool:
    section, _, name = path.rpartition(".")
    table = raw.get(section, {}) if section else raw
    return isinstance(table, dict) and name in table


def _value(key: ConfigKey, text: str) -> object:
    """What a file would hold: a TOML value for numbers, booleans and tables; a string that
    is not one is kept as written, for the file's check to say what is wrong with it."""
    if key.kind == "path":
        return os.path.abspath(text) if text else text  # relative to where the node starts
    if key.kind in ("integer", "number", "boolean", "table"):
        try:
            return tomllib.loads(f"value = {text}")["value"]
        except tomllib.TOMLDecodeError:
            if key.kind == "table":
                raise ConfigError(key.variable, f"must be a TOML inline table such as "
                                  f"{{ bytes = 1073741824 }}, not {text!r}") from None
            return text
    return text


def _peer_entries(text: str, variable: str) -> list[tuple[int, dict[str, str]]]:
    """(position, {node_id[, raft_address, http_address]}) of each entry of the peers list."""
    entries = []
    for position, item in enumerate(part.strip() for part in text.split(",")):
        if not item:
            continue  # "", or a trailing comma: nothing
        node_id, sep, addresses = item.partition("=")
        raft_address, slash, http_address = addresses.partition("/")
        if not sep:
            entries.append((position, {"node_id": node_id}))
        elif slash and raft_address and http_address:
            entries.append((position, {"node_id": node_id, "raft_address": raft_address,
                                       "http_address": http_address}))
        else:
            raise ConfigError(f"{variable}[{position}]", f"must be {PEERS_FORM}, or a node "
                              "id alone when RAFTCRON_POD_RAFT_ADDRESS and "
                              f"RAFTCRON_POD_HTTP_ADDRESS are set, not {item!r}")
    return entries


def _add_peers(merged: MergedConfig, entries: list[tuple[int, dict[str, str]]],
               environ: Mapping[str, str]) -> None:
    """The peers from the environment, this node's own entry left out: one list, the same
    for every member (a StatefulSet gives each pod the same environment)."""
    me = merged.raw.get("node_id")
    peers = []
    for position, entry in entries:
        for variable, key in POD_TEMPLATES.items():
            if key not in entry:
                template = environ.get(variable)
                if template is None:
                    raise ConfigError(f"{PREFIX}PEERS[{position}]",
                                      f"{entry['node_id']!r} has no addresses: write "
                                      f"{PEERS_FORM}, or set RAFTCRON_POD_RAFT_ADDRESS and "
                                      "RAFTCRON_POD_HTTP_ADDRESS")
                entry[key] = _fill(template, variable, entry["node_id"], environ)
        if entry["node_id"] == me:
            mine = (merged.raw.get("raft_address"), merged.raw.get("http_address"))
            if (entry["raft_address"], entry["http_address"]) != mine:
                raise ConfigError(f"{PREFIX}PEERS[{position}]",
                                  f"names this node ({me}) with addresses other than its own "
                                  f"raft_address and http_address {mine}")
            continue
        peers.append(entry)
        merged.peer_positions.append(position)
    merged.raw["peers"] = peers


def _pod(merged: MergedConfig, environ: Mapping[str, str], file_label: str | None) -> None:
    """In a pod (one of POD_TEMPLATES is set, asking for it): the node id, unless given, is
    the pod's name (POD_NAME, from the downward API, else HOSTNAME, which a pod's hostname
    is), and each address is its template filled in: `{node_id}` the node's id, `{namespace}`
    POD_NAMESPACE. A StatefulSet's pod raftcron-2 with RAFTCRON_POD_RAFT_ADDRESS =
    "{node_id}.raftcron.{namespace}.svc:7001" is node raftcron-2 at
    raftcron-2.raftcron.default.svc:7001 (namespace default)."""
    given = {variable: environ[variable] for variable in POD_TEMPLATES if variable in environ}
    if not given:
        return
    missing = sorted(set(POD_TEMPLATES) - set(given))
    if missing:
        raise ConfigError(missing[0], f"goes with {', '.join(sorted(given))}: a pod's "
                          "addresses come from both templates, or from neither")
    raw = merged.raw
    if "node_id" not in raw:
        for name in POD_NAME_VARIABLES:
            if environ.get(name):
                raw["node_id"], merged.sources["node_id"] = environ[name], name
                break
        else:
            raise ConfigError(f"{PREFIX}NODE_ID", "is required: set it, or POD_NAME (the "
                              "pod's name, from the downward API)")
    for variable, key in POD_TEMPLATES.items():
        if key in raw:
            where = merged.sources.get(key) or f"{key} in {file_label}"
            raise ConfigError(variable, f"{key} is given both by {where} and by {variable}: "
                              "keep one")
        raw[key] = _fill(given[variable], variable, str(raw["node_id"]), environ)
        merged.sources[key] = variable


def _fill(template: str, variable: str, node_id: str, environ: Mapping[str, str]) -> str:
    values = {"node_id": node_id}
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as error:
        raise ConfigError(variable, f"{template!r} is not a template: {error}") from None
    unknown = fields - {"node_id", "namespace"}
    if unknown:
        raise ConfigError(variable, f"knows {{node_id}} and {{namespace}}, not "
                          f"{', '.join('{' + name + '}' for name in sorted(unknown))}")
    if "namespace" in fields:
        namespace = environ.get(POD_NAMESPACE_VARIABLE)
        if not namespace:
            raise ConfigError(variable, f"uses {{namespace}}, and {POD_NAMESPACE_VARIABLE} is "
                              "not set (the downward API's metadata.namespace)")
        values["namespace"] = namespace
    return template.format_map(values)


def table(keys: Sequence[ConfigKey]) -> list[tuple[str, str, str, str]]:
    """(variable, file key, kind, default) of every key, for `raftcron config env` and docs."""
    rows = []
    for key in keys:
        if key.kind == "tokens":
            default = "merged with the file's (name:role:token,...)"
        elif key.kind == "peers":
            default = f"none ({PEERS_FORM},...)"
        elif key.required:
            default = "required"
        elif key.kind == "table":
            default = "the defaults (a TOML inline table)"
        else:
            default = _shown(key.default)
        rows.append((key.variable, key.path, key.kind, default))
    rows += [(variable, key, "template", "none ({node_id}, {namespace})")
             for variable, key in POD_TEMPLATES.items()]
    return rows


def _shown(value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)

