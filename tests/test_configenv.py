"""A node's config from the environment (cluster/configenv.py): every key has one variable,
read as the file would hold it; a key in both is refused naming both; a variable of ours that
means nothing is refused; a pod gives the node id and addresses when asked to."""

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

from raftcron.cluster import config, configenv, node
from raftcron.cluster.commandline import main as cli
from raftcron.cluster.config import ConfigError
from raftcron.scheduler.settings import SECTIONS, Rule

ROOT = Path(__file__).resolve().parent.parent
ALONE = {  # a single node from the environment alone
    "RAFTCRON_NODE_ID": "n1",
    "RAFTCRON_RAFT_ADDRESS": "127.0.0.1:7001",
    "RAFTCRON_HTTP_ADDRESS": "127.0.0.1:8001",
}
PEERS = "n2=127.0.0.1:7002/127.0.0.1:8002,n3=127.0.0.1:7003/127.0.0.1:8003"
POD = {
    "POD_NAME": "raftcron-2",
    "POD_NAMESPACE": "prod",
    "RAFTCRON_POD_RAFT_ADDRESS": "{node_id}.raftcron.{namespace}.svc:7001",
    "RAFTCRON_POD_HTTP_ADDRESS": "{node_id}.raftcron.{namespace}.svc:8001",
    "RAFTCRON_CLUSTER_PASSWORD": "long-enough-secret",
    "RAFTCRON_API_ALLOW_UNAUTHENTICATED": "true",
}


def load_env(environ, file_text=None, tmp_path=None):
    if file_text is None:
        return config.load(None, environ)
    path = tmp_path / "node.toml"
    path.write_text(file_text)
    return config.load(path, environ)


def refusal(environ, file_text=None, tmp_path=None):
    with pytest.raises(ConfigError) as error:
        load_env(environ, file_text, tmp_path)
    return error.value


# -- the naming rule --------------------------------------------------------------------------


def test_every_key_of_the_schema_has_its_own_variable():
    variables = [key.variable for key in config.KEYS]
    assert len(set(variables)) == len(variables)
    assert not set(variables) & (set(configenv.POD_TEMPLATES) | set(configenv.OTHER_USES))
    assert all(re.fullmatch(r"RAFTCRON_[A-Z0-9_]+", name) for name in variables)


def test_the_schema_is_what_the_file_accepts():
    sections = {
        "raft": config.RaftTuning, "clock": config.ClockSettings,
        "storage": config.StorageSettings, "membership": config.MembershipSettings,
    }
    for section, settings in sections.items():
        assert config.known_keys(section) == {f.name for f in dataclasses.fields(settings)}
    assert config.known_keys("settings") == set(SECTIONS)
    assert {f.name for f in dataclasses.fields(config.ApiSettings)} <= config.known_keys("api")


@pytest.mark.parametrize(
    ("path", "variable"),
    [
        ("node_id", "RAFTCRON_NODE_ID"),
        ("peers", "RAFTCRON_PEERS"),
        ("raft.heartbeat_s", "RAFTCRON_RAFT_HEARTBEAT_S"),
        ("api.tokens", "RAFTCRON_API_TOKENS"),
        ("cluster.name", "RAFTCRON_CLUSTER_NAME"),
        ("settings.search_attributes", "RAFTCRON_SETTINGS_SEARCH_ATTRIBUTES"),
    ],
)
def test_a_variable_is_the_prefix_the_section_and_the_key_in_capitals(path, variable):
    assert {key.path: key.variable for key in config.KEYS}[path] == variable


def test_every_raftcron_variable_the_project_reads_is_known():
    """A variable the tree names, and a node would refuse as unknown, breaks whoever sets it
    for its own purpose in a node's environment: every one is a key's or in OTHER_USES."""
    known = ({key.variable for key in config.KEYS} | set(configenv.POD_TEMPLATES)
             | set(configenv.OTHER_USES))
    named: dict[str, str] = {}
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "Dockerfile", ROOT / "compose.yaml",
             *(ROOT / ".ci").glob("*"), *(ROOT / "docs").rglob("*.md")]
    for room in ("cluster", "scheduler", "chaos", "tests", "configs"):
        files += [path for path in (ROOT / room).rglob("*") if path.suffix in (
            ".py", ".md", ".toml", ".example", ".service", ".sh")]
    for path in files:
        if not path.is_file() or path.name == Path(__file__).name:
            continue
        for name in re.findall(r"RAFTCRON_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")):
            named.setdefault(name, str(path.relative_to(ROOT)))
    unknown = {name: where for name, where in named.items() if name not in known}
    assert not unknown, f"add to configenv.OTHER_USES (or the schema): {unknown}"


# -- values -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "text", "read"),
    [
        ("RAFTCRON_RAFT_HEARTBEAT_S", "0.1", lambda c: c.raft.heartbeat_s == 0.1),
        ("RAFTCRON_RAFT_TICK_MS", "200", lambda c: c.raft.tick_ms == 200),
        ("RAFTCRON_RAFT_COMPACTION_MAX_BYTES", "1_048_576",
         lambda c: c.raft.compaction_max_bytes == 1 << 20),
        ("RAFTCRON_RAFT_APPEND_ENTRIES_BATCHING", "true",
         lambda c: c.raft.append_entries_batching is True),
        ("RAFTCRON_STORAGE_DURABILITY", "os", lambda c: c.storage.durability == "os"),
        ("RAFTCRON_STORAGE_ARCHIVE", "false", lambda c: c.storage.archive is False),
        ("RAFTCRON_CLOCK_MAX_SKEW_MS", "2000", lambda c: c.clock.max_skew_ms == 2000),
        ("RAFTCRON_MEMBERSHIP_CATCH_UP_TIMEOUT_S", "60",
         lambda c: c.membership.catch_up_timeout_s == 60),
        ("RAFTCRON_CLUSTER_NAME", "prod-eu", lambda c: c.cluster_name == "prod-eu"),
        ("RAFTCRON_LOG_LEVEL", "debug", lambda c: c.log_level == "debug"),
        ("RAFTCRON_API_MAX_CONNECTIONS", "64", lambda c: c.api.max_connections == 64),
        ("RAFTCRON_SETTINGS_BUDGET", "{ bytes = 1073741824 }",
         lambda c: c.settings.budget.bytes == 1 << 30),
        ("RAFTCRON_SETTINGS_RETENTION", "{ succeeded = { max_age_ms = 3600000 } }",
         lambda c: c.settings.retention.succeeded == Rule(3_600_000, 1_000_000)),
        ("RAFTCRON_DATA_DIR", "/var/lib/raftcron",
         lambda c: c.data_dir == Path("/var/lib/raftcron")),
    ],
)
def test_a_variable_is_read_as_the_file_would_hold_its_value(variable, text, read):
    loaded = load_env({**ALONE, variable: text})
    assert read(loaded)
    assert (dict(loaded.environment)[next(k.path for k in config.KEYS if k.variable == variable)]
            == variable)


def test_a_node_needs_no_file_and_its_relative_paths_are_the_current_folders(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loaded = load_env({**ALONE, "RAFTCRON_DATA_DIR": "state"})
    assert loaded.node_id == "n1" and loaded.peers == () and loaded.source is None
    assert loaded.data_dir == tmp_path / "state"
    assert load_env(ALONE).data_dir == tmp_path / "data" / "n1"


@pytest.mark.parametrize("missing", sorted(ALONE))
def test_without_a_file_a_missing_required_key_names_its_variable(missing):
    every = f"n1=127.0.0.1:7001/127.0.0.1:8001,{PEERS}"
    error = refusal({k: v for k, v in {**ALONE, "RAFTCRON_PEERS": every}.items() if k != missing})
    assert error.key == missing and "no config file was given" in error.message


@pytest.mark.parametrize(
    ("changes", "key", "message"),
    [
        ({"RAFTCRON_RAFT_HEARTBEAT_S": "fast"}, "RAFTCRON_RAFT_HEARTBEAT_S",
         "must be a positive number, not 'fast'"),
        ({"RAFTCRON_RAFT_TICK_MS": "1.5"}, "RAFTCRON_RAFT_TICK_MS", "must be an integer"),
        ({"RAFTCRON_RAFT_ELECTION_TIMEOUT_MIN_S": "0.1"}, "RAFTCRON_RAFT_ELECTION_TIMEOUT_MIN_S",
         "more than 3 x raft.heartbeat_s"),
        ({"RAFTCRON_STORAGE_ARCHIVE": "yes"}, "RAFTCRON_STORAGE_ARCHIVE", "true or false"),
        ({"RAFTCRON_JOIN": "1"}, "RAFTCRON_JOIN", "true or false"),
        ({"RAFTCRON_NODE_ID": "n 1"}, "RAFTCRON_NODE_ID", "1-64 letters"),
        ({"RAFTCRON_HTTP_ADDRESS": "localhost"}, "RAFTCRON_HTTP_ADDRESS", "is not host:port"),
        ({"RAFTCRON_CLUSTER_PASSWORD": "short"}, "RAFTCRON_CLUSTER_PASSWORD", "8 characters"),
        ({"RAFTCRON_SETTINGS_BUDGET": "{ bytes = 10 }"}, "RAFTCRON_SETTINGS_BUDGET", "bytes:"),
        ({"RAFTCRON_SETTINGS_BUDGET": "bytes=10"}, "RAFTCRON_SETTINGS_BUDGET",
         "TOML inline table"),
        ({"RAFTCRON_PEERS": "n2=127.0.0.1:7002"}, "RAFTCRON_PEERS[0]",
         "node_id=raft_address/http_address"),
        ({"RAFTCRON_PEERS": "n2=127.0.0.1:7002/127.0.0.1:8002,n3=nowhere/127.0.0.1:8003"},
         "RAFTCRON_PEERS[1].raft_address", "is not host:port"),
        ({"RAFTCRON_PEERS": "n2", "RAFTCRON_CLUSTER_PASSWORD": "long-enough-secret"},
         "RAFTCRON_PEERS[0]", "has no addresses"),
        ({"RAFTCRON_PEERS": PEERS}, "cluster_password", "RAFTCRON_CLUSTER_PASSWORD"),
        ({"RAFTCRON_API_TOKENS": "admin"}, "RAFTCRON_API_TOKENS[0]", "role:token"),
    ],
)
def test_a_bad_value_names_its_variable_and_what_is_wrong(changes, key, message):
    error = refusal({**ALONE, **changes})
    assert error.key == key and message in str(error), str(error)


def test_the_peers_are_one_list_the_same_for_every_member():
    every = f"n1=127.0.0.1:7001/127.0.0.1:8001,{PEERS},"  # this node too; a trailing comma
    loaded = load_env({**ALONE, "RAFTCRON_PEERS": every,
                       "RAFTCRON_CLUSTER_PASSWORD": "long-enough-secret"})
    assert [p.node_id for p in loaded.peers] == ["n2", "n3"]
    assert loaded.peers[1].http_address == "127.0.0.1:8003"
    wrong = f"n1=127.0.0.1:7101/127.0.0.1:8001,{PEERS}"
    error = refusal({**ALONE, "RAFTCRON_PEERS": wrong,
                     "RAFTCRON_CLUSTER_PASSWORD": "long-enough-secret"})
    assert error.key == "RAFTCRON_PEERS[0]" and "other than its own" in error.message


# -- the file and the environment -------------------------------------------------------------

FILE = ('node_id = "n1"\nraft_address = "127.0.0.1:7001"\nhttp_address = "127.0.0.1:8001"\n'
        '[raft]\nheartbeat_s = 0.05\n[settings.budget]\nbytes = 1073741824\n'
        '[api]\ntokens = { "file-token-0123" = "admin" }\n')


@pytest.mark.parametrize(
    ("variable", "text", "path"),
    [
        ("RAFTCRON_NODE_ID", "n1", "node_id"),
        ("RAFTCRON_RAFT_HEARTBEAT_S", "0.05", "raft.heartbeat_s"),
        ("RAFTCRON_SETTINGS_BUDGET", "{ bytes = 1073741824 }", "settings.budget"),
    ],
)
def test_a_key_set_in_the_file_and_in_the_environment_is_refused_naming_both(
        variable, text, path, tmp_path):
    error = refusal({variable: text}, FILE, tmp_path)  # even when they agree
    assert error.key == variable
    assert f"{path} is set both in {tmp_path / 'node.toml'}" in error.message


def test_the_file_and_the_environment_add_up_and_tokens_still_merge(tmp_path):
    loaded = load_env({"RAFTCRON_STORAGE_DURABILITY": "os", "RAFTCRON_CLUSTER_NAME": "staging",
                       "RAFTCRON_API_TOKENS": "ci:submit:env-token-0123"}, FILE, tmp_path)
    assert loaded.storage.durability == "os" and loaded.cluster_name == "staging"
    assert loaded.raft.heartbeat_s == 0.05 and loaded.node_id == "n1"
    assert loaded.tokens == {"file-token-0123": "admin", "env-token-0123": "submit"}
    error = refusal({"RAFTCRON_API_TOKENS": "admin:file-token-0123"}, FILE, tmp_path)
    assert error.key == "RAFTCRON_API_TOKENS[0]" and "given twice" in error.message


def test_the_password_from_the_environment_still_serves_a_file_without_one(tmp_path):
    loaded = config.load(ROOT / "configs/systemd/node.toml.example",
                         {"RAFTCRON_CLUSTER_PASSWORD": "from-the-environment"})
    assert loaded.cluster_password == "from-the-environment"
    error = refusal({"RAFTCRON_CLUSTER_PASSWORD": "from-the-environment"},
                    'cluster_password = "in-the-file-too"\n' + FILE, tmp_path)
    assert error.key == "RAFTCRON_CLUSTER_PASSWORD" and "cluster_password is set both" in str(error)


# -- unknown variables ------------------------------------------------------------------------


def test_an_unknown_raftcron_variable_is_refused_with_the_closest_name():
    typo = "RAFTCRON_RAFT_" + "HEARTBEAT"  # spelt apart: the tree's scan above must not see it
    error = refusal({**ALONE, typo: "0.1"})
    assert error.key == typo and "did you mean RAFTCRON_RAFT_HEARTBEAT_S?" in error.message


def test_the_variables_the_project_uses_elsewhere_are_left_alone():
    others = dict.fromkeys(configenv.OTHER_USES, "1")
    assert load_env({**ALONE, **others}).node_id == "n1"


# -- a pod ------------------------------------------------------------------------------------


def test_a_statefulset_pod_is_its_own_node_id_at_its_stable_dns_name():
    loaded = load_env({**POD, "RAFTCRON_PEERS": "raftcron-0,raftcron-1,raftcron-2"})
    assert loaded.node_id == "raftcron-2"
    assert loaded.raft_address == "raftcron-2.raftcron.prod.svc:7001"
    assert loaded.http_address == "raftcron-2.raftcron.prod.svc:8001"
    assert [(p.node_id, p.raft_address) for p in loaded.peers] == [
        ("raftcron-0", "raftcron-0.raftcron.prod.svc:7001"),
        ("raftcron-1", "raftcron-1.raftcron.prod.svc:7001")]
    assert dict(loaded.environment)["node_id"] == "POD_NAME"


def test_a_pod_without_pod_name_is_its_hostname_and_an_explicit_id_wins():
    without = {k: v for k, v in POD.items() if k != "POD_NAME"}
    assert load_env({**without, "HOSTNAME": "raftcron-0"}).node_id == "raftcron-0"
    assert load_env({**POD, "RAFTCRON_NODE_ID": "n7"}).raft_address.startswith("n7.raftcron")


@pytest.mark.parametrize(
    ("changes", "key", "message"),
    [
        ({"RAFTCRON_POD_HTTP_ADDRESS": None}, "RAFTCRON_POD_HTTP_ADDRESS", "from both templates"),
        ({"POD_NAME": None}, "RAFTCRON_NODE_ID", "POD_NAME"),
        ({"POD_NAME": "Raftcron 2"}, "POD_NAME", "1-64 letters"),
        ({"POD_NAMESPACE": None}, "RAFTCRON_POD_RAFT_ADDRESS", "POD_NAMESPACE is not set"),
        ({"RAFTCRON_POD_RAFT_ADDRESS": "{pod}:7001"}, "RAFTCRON_POD_RAFT_ADDRESS",
         "not {pod}"),
        ({"RAFTCRON_RAFT_ADDRESS": "10.0.0.1:7001"}, "RAFTCRON_POD_RAFT_ADDRESS",
         "raft_address is given both by RAFTCRON_RAFT_ADDRESS and by RAFTCRON_POD_RAFT_ADDRESS"),
        ({"RAFTCRON_POD_RAFT_ADDRESS": "{node_id}"}, "RAFTCRON_POD_RAFT_ADDRESS",
         "is not host:port"),
    ],
)
def test_a_pod_value_that_cannot_be_derived_is_refused_naming_its_source(changes, key, message):
    environ = {k: v for k, v in {**POD, **changes}.items() if v is not None}
    error = refusal(environ)
    assert error.key == key and message in str(error), str(error)


def test_outside_a_pod_its_name_is_no_node_id():
    error = refusal({"POD_NAME": "raftcron-2", "HOSTNAME": "box",
                     "RAFTCRON_RAFT_ADDRESS": "127.0.0.1:7001",
                     "RAFTCRON_HTTP_ADDRESS": "127.0.0.1:8001"})
    assert error.key == "RAFTCRON_NODE_ID"


# -- the commands -----------------------------------------------------------------------------


def test_raftcron_config_env_lists_every_variable_with_its_default(capsys):
    assert cli.main(["config", "env"]) == 0
    text = capsys.readouterr().out
    for key in config.KEYS:
        assert key.variable in text
    assert re.search(r"RAFTCRON_RAFT_HEARTBEAT_S\s+raft\.heartbeat_s\s+number\s+0\.05", text)
    assert cli.main(["config", "env", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"variable": "RAFTCRON_LOG_LEVEL", "key": "log_level", "kind": "string",
            "default": "info"} in rows


def test_a_node_without_a_file_or_variables_says_what_it_needs(monkeypatch, capsys):
    for name in [n for n in os.environ if n.startswith("RAFTCRON_")]:
        monkeypatch.delenv(name)
    for name in ("POD_NAME", "HOSTNAME"):
        monkeypatch.delenv(name, raising=False)
    assert node.run(None) == 2
    err = capsys.readouterr().err
    assert "RAFTCRON_NODE_ID: is required: no config file was given" in err, err
