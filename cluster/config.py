"""Node configuration: a TOML file (DESIGN.md section 5) read into a validated `NodeConfig`.

Every error names the key (`peers[1].raft_address: ...`) and nothing starts on a bad config.
A node with peers refuses to start without a cluster password: PySyncObj unpickles whatever
arrives on its Raft port, so without the password anyone who reaches that port runs code on
the node. A node without peers binds no Raft port at all (cluster/consensus/raftguard.py). Paths are
relative to the config file's folder. The cluster's name (`[cluster] name`, default
"raftcron") is what every member of one cluster says alike, as Cassandra's `cluster_name`: a
backup carries it, and `raftcron cluster doctor` names a member that says another.

`KEYS` is the schema: every key a file may hold (the file's unknown-key check reads it) and
so every key's `RAFTCRON_*` variable (cluster/configenv.py). `load` takes the file, the
environment, or both; without a file, relative paths are the current directory's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftcron.cluster import configenv
from raftcron.cluster.configenv import ConfigError as ConfigError
from raftcron.cluster.configenv import ConfigKey, dataclass_keys
from raftcron.scheduler.errors import Invalid
from raftcron.scheduler.gate import DEFAULT_SETTINGS
from raftcron.scheduler.settings import SECTIONS, Settings

API_ROLES = ("admin", "submit", "worker", "read")
_NODE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
# A DNS label: safe in a file name, a header, a metric label and a shell word alike.
_CLUSTER_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
DEFAULT_CLUSTER_NAME = "raftcron"


@dataclass(frozen=True)
class Peer:
    node_id: str
    raft_address: str
    http_address: str


@dataclass(frozen=True)
class RaftTuning:
    """PySyncObj timings (seconds) and our ticker's, with the relations PySyncObj checks."""

    tick_ms: int = 100  # the leader proposes Tick at least this often
    election_timeout_min_s: float = 0.4
    election_timeout_max_s: float = 1.0
    heartbeat_s: float = 0.05  # appendEntriesPeriod
    leader_fallback_s: float = 1.2  # an isolated leader steps down after this
    connection_timeout_s: float = 2.0
    connection_retry_s: float = 0.5
    compaction_min_entries: int = 100_000
    compaction_min_time_s: float = 600.0
    # ... or once the log's commands take this many bytes (a flood of large payloads would
    # otherwise fill the disk first: 600 s of 60 KB batches is gigabytes)
    compaction_max_bytes: int = 512 << 20
    commit_timeout_s: float = 5.0  # a proposal not applied by then is indeterminate
    batch_commands_max: int = 512  # client commands coalesced into one log entry
    # PySyncObj waits for its next heartbeat period to send commands in batches (~100 ms per
    # sequential write); we coalesce client commands ourselves and send each entry at once.
    append_entries_batching: bool = False


DURABILITY_MODES = ("fsync", "os")


@dataclass(frozen=True)
class StorageSettings:
    """How the node keeps its log (DESIGN.md §8.1). ``fsync``: every write is on disk before
    the node acts on it (acks, votes, counting itself); ``os``: the page cache only, faster,
    and a power loss can cost the writes of the last seconds (a process crash costs nothing).
    ``archive``: finished jobs that leave the state are kept in the node's archive on disk
    (DESIGN.md §9.2; cluster/archive)."""

    durability: str = "fsync"
    archive: bool = True


@dataclass(frozen=True)
class ApiSettings:
    """The HTTP listener (DESIGN.md §8.3). ``max_connections`` is further capped by half the
    process's descriptor limit; ``idle_timeout_s`` closes a connection that has not sent a
    whole request head that long after it opened (slowloris) or sat idle between requests;
    TLS is on when ``tls_cert_file`` is set (with ``tls_key_file``), and mutual when
    ``tls_client_ca_file`` is set too."""

    max_connections: int = 1024
    idle_timeout_s: float = 20.0  # above aiohttp clients' 15 s keep-alive: they close first
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None


@dataclass(frozen=True)
class ClockSettings:
    """How far this node trusts wall clocks (DESIGN.md §8.2, cluster/clock/clocks.py): a node whose
    clock is off from the majority's by more than ``max_skew_ms`` never proposes its own clock
    (its Ticks, if it leads, carry the majority's time); a Tick runs at most ``tick_slack_ms``
    ahead of the majority's clocks (or of the monotonic time elapsed since the last evidence,
    while the majority is not known)."""

    max_skew_ms: int = 1_000
    tick_slack_ms: int = 250
    poll_ms: int = 500  # how often the peers' clocks are read


@dataclass(frozen=True)
class MembershipSettings:
    """Membership changes (DESIGN.md §8.4, cluster/membership): a node being added that has not
    caught up with the leader ``catch_up_timeout_s`` after its change began is not added (the
    change is cancelled, and another may begin)."""

    catch_up_timeout_s: float = 600.0


@dataclass(frozen=True)
class TracingSettings:
    """Traces (docs/operations/monitor.md, cluster/telemetry/tracing.py): off unless
    ``otlp_endpoint`` names an OTLP/HTTP collector (``http://collector:4318``; spans go to its
    ``/v1/traces``)."""

    otlp_endpoint: str | None = None


@dataclass(frozen=True)
class NodeConfig:
    node_id: str
    raft_address: str
    http_address: str
    data_dir: Path
    cluster_password: str | None
    peers: tuple[Peer, ...] = ()
    tokens: dict[str, str] = field(default_factory=dict)  # token -> role
    allow_unauthenticated: bool = False
    token_names: dict[str, str] = field(default_factory=dict)  # token -> its name (audit)
    api: ApiSettings = ApiSettings()
    raft: RaftTuning = RaftTuning()
    storage: StorageSettings = StorageSettings()
    clock: ClockSettings = ClockSettings()
    log_level: str = "info"
    source: Path | None = None
    # A new node joining a running cluster (its peers: the current members): not a member,
    # so it neither votes nor stands for election, until a membership change adds it.
    join: bool = False
    membership: MembershipSettings = MembershipSettings()
    cluster_name: str = DEFAULT_CLUSTER_NAME
    # (key, variable) of each key that came from the environment, which the node logs
    environment: tuple[tuple[str, str], ...] = ()
    # The settings a new cluster starts with (scheduler/settings.py's sections): its
    # first leader, or `raftcron cluster finalize`, seeds the replicated settings from the
    # config of the node that proposes it, once; later they change through the API.
    settings: Settings = DEFAULT_SETTINGS
    tracing: TracingSettings = TracingSettings()

    @property
    def members(self) -> tuple[Peer, ...]:
        """Every member of the cluster, this node included, ordered by node id."""
        me = Peer(self.node_id, self.raft_address, self.http_address)
        return tuple(sorted((me, *self.peers), key=lambda p: p.node_id))


KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("node_id", "string", required=True),
    ConfigKey("raft_address", "string", required=True),
    ConfigKey("http_address", "string", required=True),
    ConfigKey("data_dir", "path", "data/<node_id>"),
    ConfigKey("cluster_password", "string"),
    ConfigKey("peers", "peers"),
    ConfigKey("log_level", "string", "info"),
    ConfigKey("join", "boolean", False),
    ConfigKey("api.tokens", "tokens"),
    ConfigKey("api.tokens_file", "path"),
    ConfigKey("api.allow_unauthenticated", "boolean", False),
    *dataclass_keys("api", ApiSettings),
    *dataclass_keys("raft", RaftTuning),
    *dataclass_keys("storage", StorageSettings),
    *dataclass_keys("clock", ClockSettings),
    *dataclass_keys("membership", MembershipSettings),
    *dataclass_keys("tracing", TracingSettings),
    ConfigKey("cluster.name", "string", DEFAULT_CLUSTER_NAME),
    *(ConfigKey(f"settings.{name}", "table") for name in SECTIONS),
)


def known_keys(section: str) -> set[str]:
    """The keys the schema has in `section` ("" for the top level, which has the sections)."""
    if section:
        return {k.path.partition(".")[2] for k in KEYS if k.path.partition(".")[0] == section}
    return {k.path.partition(".")[0] for k in KEYS}


def load(path: str | Path | None, environ: Mapping[str, str] | None = None) -> NodeConfig:
    """The node's config from the file at `path` (None: no file) and the environment."""
    environ = os.environ if environ is None else environ
    raw: dict[str, Any] = {}
    base_dir = Path.cwd()
    if path is not None:
        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError("config", f"no such file: {path}") from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError("config", f"{path} is not valid TOML: {error}") from None
        base_dir = path.resolve().parent
    merged = configenv.merge(raw, environ, KEYS, file_label=None if path is None else str(path))
    try:
        config = parse(merged.raw, base_dir=base_dir, source=path, environ=environ)
    except ConfigError as error:
        raise merged.rename(error) from None
    return dataclasses.replace(config, environment=tuple(sorted(merged.sources.items())))


def parse(raw: dict[str, Any], *, base_dir: Path, source: Path | None = None,
          environ: Mapping[str, str] | None = None) -> NodeConfig:
    """A validated config from a file's table; `environ` (default: the process's) gives only
    RAFTCRON_API_TOKENS here (the other variables are `load`'s, by configenv)."""
    _no_unknown(raw, known_keys(""), "")
    node_id = _node_id(raw.get("node_id"), "node_id")
    raft_address = _address(raw.get("raft_address"), "raft_address")
    http_address = _address(raw.get("http_address"), "http_address")
    data_dir = raw.get("data_dir", f"data/{node_id}")
    if not isinstance(data_dir, str) or not data_dir:
        raise ConfigError("data_dir", "must be a path")
    peers = _peers(raw.get("peers", []))
    ids = [node_id, *(p.node_id for p in peers)]
    if len(set(ids)) != len(ids):
        raise ConfigError("peers", f"node ids must be unique, got {ids}")
    addresses = [
        raft_address,
        http_address,
        *(a for p in peers for a in (p.raft_address, p.http_address)),
    ]
    if len(set(addresses)) != len(addresses):
        raise ConfigError("peers", "every raft_address and http_address must be different")
    password = raw.get("cluster_password")
    if password is not None and (not isinstance(password, str) or len(password) < 8):
        raise ConfigError("cluster_password", "must be a string of at least 8 characters")
    if peers and not password:
        raise ConfigError(
            "cluster_password",
            "is required when the node has peers (or set RAFTCRON_CLUSTER_PASSWORD): without it, "
            "anyone who reaches the Raft port can run code on this node",
        )
    env_tokens = (os.environ if environ is None else environ).get(API_TOKENS_ENV, "")
    tokens, names, allow_unauthenticated, api = _api(raw.get("api", {}), base_dir, env_tokens)
    if not tokens and not allow_unauthenticated and not _is_loopback(http_address):
        raise ConfigError(
            "api.tokens",
            f"http_address {http_address} is not a loopback address: set API tokens, "
            "or api.allow_unauthenticated = true to serve it without authentication",
        )
    join = raw.get("join", False)
    if not isinstance(join, bool):
        raise ConfigError("join", "must be true or false")
    if join and not peers:
        raise ConfigError("join", "a joining node lists the cluster's current members as "
                          "[[peers]] (raftcron cluster status shows them)")
    log_level = raw.get("log_level", "info")
    if log_level not in ("debug", "info", "warning", "error"):
        raise ConfigError("log_level", f"must be debug, info, warning or error, not {log_level!r}")
    return NodeConfig(
        node_id=node_id,
        raft_address=raft_address,
        http_address=http_address,
        data_dir=(base_dir / data_dir).resolve(),
        cluster_password=password,
        peers=peers,
        tokens=tokens,
        allow_unauthenticated=allow_unauthenticated,
        token_names=names,
        api=api,
        raft=_tuning(raw.get("raft", {})),
        storage=_storage(raw.get("storage", {})),
        clock=_clock(raw.get("clock", {})),
        log_level=log_level,
        source=source,
        join=join,
        membership=_membership(raw.get("membership", {})),
        cluster_name=_cluster(raw.get("cluster", {})),
        settings=_settings(raw.get("settings", {})),
        tracing=_tracing(raw.get("tracing", {})),
    )


def _no_unknown(table: dict[str, Any], known: set[str], prefix: str) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(f"{prefix}{key}", f"unknown key (known: {', '.join(sorted(known))})")


def _node_id(value: object, key: str) -> str:
    if not isinstance(value, str) or not _NODE_ID_RE.match(value):
        raise ConfigError(key, "must be 1-64 letters, digits, '_', '.' or '-' (e.g. \"n1\")")
    return value


def split_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port")
    return host.strip("[]"), int(port)


def _address(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(key, 'is required, as "host:port"')
    try:
        split_address(value)
    except ValueError as error:
        raise ConfigError(key, str(error)) from None
    return value


def _is_loopback(address: str) -> bool:
    host, _ = split_address(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _peers(value: object) -> tuple[Peer, ...]:
    if not isinstance(value, list):
        raise ConfigError("peers", "must be an array of tables ([[peers]])")
    peers = []
    for index, item in enumerate(value):
        key = f"peers[{index}]"
        if not isinstance(item, dict):
            raise ConfigError(key, "must be a table with node_id, raft_address and http_address")
        _no_unknown(item, {"node_id", "raft_address", "http_address"}, f"{key}.")
        peers.append(
            Peer(
                _node_id(item.get("node_id"), f"{key}.node_id"),
                _address(item.get("raft_address"), f"{key}.raft_address"),
                _address(item.get("http_address"), f"{key}.http_address"),
            )
        )
    return tuple(peers)


API_TOKENS_ENV = "RAFTCRON_API_TOKENS"  # "name:role:token,..." (or "role:token,...")
_TOKEN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@\-]{0,63}$")


def _api(
    value: object, base_dir: Path, env_tokens: str
) -> tuple[dict[str, str], dict[str, str], bool, ApiSettings]:
    """Tokens (config, ``tokens_file``, ``RAFTCRON_API_TOKENS``), auth switch, listener."""
    if not isinstance(value, dict):
        raise ConfigError("api", "must be a table")
    _no_unknown(value, known_keys("api"), "api.")
    roles: dict[str, str] = {}
    names: dict[str, str] = {}
    _add_tokens(value.get("tokens", {}), "api.tokens", roles, names)
    tokens_file = value.get("tokens_file")
    if tokens_file is not None:
        path = _file(tokens_file, "api.tokens_file", base_dir)
        try:
            table = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError("api.tokens_file", f"cannot read {path}: {error}") from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError("api.tokens_file", f"{path} is not valid TOML: {error}") from None
        _no_unknown(table, {"tokens"}, f"{path}: ")
        _add_tokens(table.get("tokens", {}), f"{path}: tokens", roles, names)
    if env_tokens.strip():
        _add_env_tokens(env_tokens.strip(), roles, names)
    allow = value.get("allow_unauthenticated", False)
    if not isinstance(allow, bool):
        raise ConfigError("api.allow_unauthenticated", "must be true or false")
    max_connections = value.get("max_connections", ApiSettings.max_connections)
    if isinstance(max_connections, bool) or not isinstance(max_connections, int) or not (
            1 <= max_connections <= 1_000_000):
        raise ConfigError("api.max_connections", "must be an integer from 1 to 1000000")
    idle = value.get("idle_timeout_s", ApiSettings.idle_timeout_s)
    if isinstance(idle, bool) or not isinstance(idle, int | float) or not 0.1 <= idle <= 3600:
        raise ConfigError("api.idle_timeout_s", "must be a number of seconds from 0.1 to 3600")
    tls = {key: None if value.get(key) is None else _file(value[key], f"api.{key}", base_dir)
           for key in ("tls_cert_file", "tls_key_file", "tls_client_ca_file")}
    if (tls["tls_cert_file"] is None) != (tls["tls_key_file"] is None):
        raise ConfigError("api.tls_key_file" if tls["tls_cert_file"] else "api.tls_cert_file",
                          "tls_cert_file and tls_key_file go together")
    if tls["tls_client_ca_file"] is not None and tls["tls_cert_file"] is None:
        raise ConfigError("api.tls_client_ca_file", "needs tls_cert_file and tls_key_file")
    api = ApiSettings(max_connections=max_connections, idle_timeout_s=float(idle), **tls)
    return roles, names, allow, api


def _file(value: object, key: str, base_dir: Path) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, "must be a file path")
    path = (base_dir / value).resolve()
    if not path.is_file():
        raise ConfigError(key, f"no such file: {path}")
    return path


def _add_tokens(table: object, key: str, roles: dict[str, str], names: dict[str, str]) -> None:
    """``token = "role"`` or ``token = { role = "...", name = "..." }`` entries."""
    if not isinstance(table, dict):
        raise ConfigError(key, 'must be a table of token = "role" or { role, name }')
    for token, spec in table.items():
        where = f"{key}.{token[:4]}..."
        if isinstance(spec, dict):
            _no_unknown(spec, {"role", "name"}, f"{where}.")
            role, name = spec.get("role"), spec.get("name")
        else:
            role, name = spec, None
        _add_token(token, role, name, where, roles, names)


def _add_env_tokens(text: str, roles: dict[str, str], names: dict[str, str]) -> None:
    for index, item in enumerate(part.strip() for part in text.split(",")):
        where = f"{API_TOKENS_ENV}[{index}]"
        fields = item.split(":")
        if len(fields) == 2:
            _add_token(fields[1], fields[0], None, where, roles, names)
        elif len(fields) == 3:
            _add_token(fields[2], fields[1], fields[0], where, roles, names)
        else:
            raise ConfigError(where, "must be role:token or name:role:token")


def _add_token(token: str, role: object, name: object, where: str,
               roles: dict[str, str], names: dict[str, str]) -> None:
    if len(token) < 8:
        raise ConfigError(where, "a token must be at least 8 characters")
    if role not in API_ROLES:
        raise ConfigError(where, f"role must be one of {', '.join(API_ROLES)}, not {role!r}")
    if name is None:
        # A name that identifies the token in the audit trail without revealing it.
        name = f"{role}-{hashlib.sha256(token.encode()).hexdigest()[:8]}"
    if not isinstance(name, str) or not _TOKEN_NAME_RE.match(name):
        raise ConfigError(where, "name must be 1-64 letters, digits, '_', '.', '@' or '-'")
    if token in roles:
        raise ConfigError(where, "this token is given twice")
    roles[token] = str(role)
    names[token] = name


def _storage(value: object) -> StorageSettings:
    if not isinstance(value, dict):
        raise ConfigError("storage", "must be a table")
    _no_unknown(value, known_keys("storage"), "storage.")
    durability = value.get("durability", StorageSettings.durability)
    if durability not in DURABILITY_MODES:
        raise ConfigError("storage.durability",
                          f"must be one of {', '.join(DURABILITY_MODES)}, not {durability!r}")
    archive = value.get("archive", StorageSettings.archive)
    if not isinstance(archive, bool):
        raise ConfigError("storage.archive", f"must be true or false, not {archive!r}")
    return StorageSettings(durability=durability, archive=archive)


def _cluster(value: object) -> str:
    """The `[cluster]` table: its name."""
    if not isinstance(value, dict):
        raise ConfigError("cluster", "must be a table")
    _no_unknown(value, known_keys("cluster"), "cluster.")
    name = value.get("name", DEFAULT_CLUSTER_NAME)
    if not isinstance(name, str) or not _CLUSTER_NAME_RE.match(name):
        raise ConfigError("cluster.name", "must be 1-63 lower-case letters, digits or '-', "
                          f"not starting or ending with '-' (e.g. \"prod-eu\"), not {name!r}")
    return name


def _settings(value: object) -> Settings:
    """`[settings]`: `retention`, `budget`, `archive` and `search_attributes`, the shapes of
    `PUT /v1/settings/...` (parsed by the core's own parser, so a config accepts exactly what
    the API does)."""
    if not isinstance(value, dict):
        raise ConfigError("settings", "must be a table")
    try:
        return Settings.parse(value)
    except Invalid as error:
        raise ConfigError(error.field, error.message) from None


def _tracing(value: object) -> TracingSettings:
    if not isinstance(value, dict):
        raise ConfigError("tracing", "must be a table")
    _no_unknown(value, known_keys("tracing"), "tracing.")
    endpoint = value.get("otlp_endpoint")
    if endpoint is not None and (not isinstance(endpoint, str)
                                 or not re.match(r"https?://[^/\s]+", endpoint)):
        raise ConfigError("tracing.otlp_endpoint", "must be an http:// or https:// URL of an "
                          f"OTLP/HTTP collector (e.g. http://collector:4318), not {endpoint!r}")
    return TracingSettings(otlp_endpoint=endpoint)


def _membership(value: object) -> MembershipSettings:
    if not isinstance(value, dict):
        raise ConfigError("membership", "must be a table")
    _no_unknown(value, known_keys("membership"), "membership.")
    timeout = value.get("catch_up_timeout_s", MembershipSettings.catch_up_timeout_s)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or \
            not 1 <= timeout <= 86_400:
        raise ConfigError("membership.catch_up_timeout_s",
                          f"must be a number of seconds from 1 to 86400, not {timeout!r}")
    return MembershipSettings(catch_up_timeout_s=float(timeout))


_CLOCK_RANGES = {  # key -> (lowest, highest) accepted, in ms
    "max_skew_ms": (50, 3_600_000),
    "tick_slack_ms": (0, 10_000),
    "poll_ms": (50, 10_000),
}


def _clock(value: object) -> ClockSettings:
    if not isinstance(value, dict):
        raise ConfigError("clock", "must be a table")
    _no_unknown(value, known_keys("clock"), "clock.")
    fields: dict[str, int] = {}
    for name, (low, high) in _CLOCK_RANGES.items():
        given = value.get(name, getattr(ClockSettings, name))
        if isinstance(given, bool) or not isinstance(given, int) or not low <= given <= high:
            raise ConfigError(f"clock.{name}",
                              f"must be an integer from {low} to {high}, not {given!r}")
        fields[name] = given
    settings = ClockSettings(**fields)
    if settings.tick_slack_ms >= settings.max_skew_ms:
        raise ConfigError("clock.tick_slack_ms", "must be less than clock.max_skew_ms")
    return settings


def _tuning(value: object) -> RaftTuning:
    if not isinstance(value, dict):
        raise ConfigError("raft", "must be a table")
    defaults = RaftTuning()
    known = known_keys("raft")
    _no_unknown(value, known, "raft.")
    fields: dict[str, Any] = {}
    for name in known:
        default = getattr(defaults, name)
        given = value.get(name, default)
        if isinstance(default, bool):
            if not isinstance(given, bool):
                raise ConfigError(f"raft.{name}", "must be true or false")
        elif isinstance(given, bool) or not isinstance(given, int | float) or given <= 0:
            raise ConfigError(f"raft.{name}", f"must be a positive number, not {given!r}")
        elif isinstance(default, int) and not isinstance(given, int):
            raise ConfigError(f"raft.{name}", f"must be an integer, not {given!r}")
        fields[name] = given
    tuning = RaftTuning(**fields)
    # The relations PySyncObj's own validate() asserts, said in words a user can act on.
    if tuning.election_timeout_min_s <= 3 * tuning.heartbeat_s:
        raise ConfigError("raft.election_timeout_min_s", "must be more than 3 x raft.heartbeat_s")
    if tuning.election_timeout_max_s <= tuning.election_timeout_min_s:
        raise ConfigError(
            "raft.election_timeout_max_s", "must be more than raft.election_timeout_min_s"
        )
    if tuning.connection_timeout_s < tuning.election_timeout_max_s:
        raise ConfigError(
            "raft.connection_timeout_s", "must be at least raft.election_timeout_max_s"
        )
    if tuning.leader_fallback_s <= tuning.heartbeat_s:
        raise ConfigError("raft.leader_fallback_s", "must be more than raft.heartbeat_s")
    if not 10 <= tuning.tick_ms <= 1_000:
        raise ConfigError("raft.tick_ms", "must be between 10 and 1000")
    return tuning


def node_id_value(value: object, key: str) -> str:
    """A node id as a config file states it (for other inputs that name nodes: the same rule)."""
    return _node_id(value, key)


def address_value(value: object, key: str) -> str:
    """A "host:port" address as a config file states it (the same rule for other inputs)."""
    return _address(value, key)
