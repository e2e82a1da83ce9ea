"""Node configuration: every shipped config loads, and every mistake names its key."""

from pathlib import Path

import pytest

from raftcron.cluster import config
from raftcron.cluster.config import ConfigError
from raftcron.scheduler.settings import Rule, Settings

ROOT = Path(__file__).resolve().parent.parent
BASE = {
    "node_id": "n1",
    "raft_address": "127.0.0.1:7001",
    "http_address": "127.0.0.1:8001",
    "cluster_password": "long-enough-secret",
    "peers": [
        {"node_id": "n2", "raft_address": "127.0.0.1:7002", "http_address": "127.0.0.1:8002"},
        {"node_id": "n3", "raft_address": "127.0.0.1:7003", "http_address": "127.0.0.1:8003"},
    ],
}


def with_changes(**changes):
    raw = {**BASE, **changes}
    return {k: v for k, v in raw.items() if v is not None}


@pytest.mark.parametrize(
    "path", sorted(ROOT.glob("configs/local-*/n*.toml")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_shipped_cluster_config_loads(path):
    loaded = config.load(path)
    assert len(loaded.members) in (3, 5) and loaded.cluster_password
    assert loaded.data_dir.is_absolute()


def test_the_systemd_example_loads_with_the_password_from_the_environment(monkeypatch):
    monkeypatch.setenv("RAFTCRON_CLUSTER_PASSWORD", "from-the-environment")
    loaded = config.load(ROOT / "configs/systemd/node.toml.example")
    assert loaded.cluster_password == "from-the-environment"
    assert set(loaded.tokens.values()) == {"admin", "worker"}
    assert loaded.settings == Settings()  # it spells out the defaults


def test_the_settings_of_a_new_cluster_come_from_the_config(tmp_path):
    loaded = config.parse(with_changes(settings={
        "budget": {"bytes": 1 << 30},
        "retention": {"succeeded": {"max_age_ms": 3_600_000},
                      "queues": {"audit": {"failed": {"max_count": 5}}}}}), base_dir=tmp_path)
    assert loaded.settings.budget.bytes == 1 << 30
    assert loaded.settings.retention.succeeded == Rule(3_600_000, 1_000_000)
    assert loaded.settings.retention.rule_of("failed", "audit") == Rule(604_800_000, 5)
    assert config.parse(with_changes(), base_dir=tmp_path).settings == Settings()
    declared = config.parse(with_changes(settings={
        "search_attributes": {"paths": ["invoice.number", "customer.id"]}}), base_dir=tmp_path)
    assert declared.settings.search_attributes.paths == ("customer.id", "invoice.number")


def test_data_dir_is_relative_to_the_config_file(tmp_path):
    loaded = config.parse(with_changes(data_dir="state/n1"), base_dir=tmp_path)
    assert loaded.data_dir == tmp_path / "state/n1"


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"node_id": None}, "node_id"),
        ({"node_id": "bad id!"}, "node_id"),
        ({"raft_address": "127.0.0.1"}, "raft_address"),
        ({"http_address": "127.0.0.1:99999"}, "http_address"),
        ({"cluster_password": None}, "cluster_password"),
        ({"cluster_password": "short"}, "cluster_password"),
        ({"colour": "blue"}, "colour"),
        ({"peers": [{"node_id": "n2", "raft_address": "127.0.0.1:7002"}]}, "peers[0].http_address"),
        (
            {
                "peers": [
                    {
                        "node_id": "n1",
                        "raft_address": "127.0.0.1:7002",
                        "http_address": "127.0.0.1:8002",
                    }
                ]
            },
            "peers",
        ),
        ({"api": {"tokens": {"tiny": "admin"}}}, "api.tokens.tiny..."),
        ({"api": {"tokens": {"long-enough-token": "root"}}}, "api.tokens.long..."),
        ({"http_address": "10.1.2.3:8001"}, "api.tokens"),
        ({"raft": {"tick_ms": 0}}, "raft.tick_ms"),
        (
            {"raft": {"election_timeout_min_s": 0.1, "heartbeat_s": 0.05}},
            "raft.election_timeout_min_s",
        ),
        ({"raft": {"append_entries_batching": "yes"}}, "raft.append_entries_batching"),
        ({"raft": {"bogus": 1}}, "raft.bogus"),
        ({"log_level": "loud"}, "log_level"),
        ({"settings": "small"}, "settings"),
        ({"settings": {"budget": {"bytes": 10}}}, "settings.budget.bytes"),
        ({"settings": {"retention": {"failed": {"max_count": -1}}}},
         "settings.retention.failed.max_count"),
        ({"settings": {"retention": {"queues": {"q": {"done": {}}}}}},
         "settings.retention.queues.q.done"),
        ({"settings": {"archives": {}}}, "settings.archives"),
        ({"settings": {"archive": {"max_bytes": 1}}}, "settings.archive.max_bytes"),
        ({"settings": {"search_attributes": {"paths": ["customer id"]}}},
         "settings.search_attributes.paths[0]"),
    ],
)
def test_a_bad_config_names_the_key(changes, key, tmp_path, monkeypatch):
    monkeypatch.delenv("RAFTCRON_CLUSTER_PASSWORD", raising=False)
    with pytest.raises(ConfigError) as error:
        config.parse(with_changes(**changes), base_dir=tmp_path)
    assert error.value.key == key, str(error.value)


def test_a_cluster_without_a_password_is_refused_and_says_why(tmp_path, monkeypatch):
    monkeypatch.delenv("RAFTCRON_CLUSTER_PASSWORD", raising=False)
    with pytest.raises(ConfigError, match="run code on this node"):
        config.parse(with_changes(cluster_password=None), base_dir=tmp_path)


def test_a_single_node_needs_no_password(tmp_path, monkeypatch):
    monkeypatch.delenv("RAFTCRON_CLUSTER_PASSWORD", raising=False)
    loaded = config.parse(with_changes(cluster_password=None, peers=[]), base_dir=tmp_path)
    assert loaded.cluster_password is None and len(loaded.members) == 1


def test_a_public_address_may_go_unauthenticated_only_when_said_so(tmp_path):
    loaded = config.parse(
        with_changes(http_address="10.1.2.3:8001", api={"allow_unauthenticated": True}),
        base_dir=tmp_path,
    )
    assert loaded.allow_unauthenticated


def test_the_node_command_prints_a_config_error_and_exits_2(tmp_path, capsys):
    from raftcron.cluster import node

    bad = tmp_path / "bad.toml"
    bad.write_text('node_id = "n1"\nraft_address = "nope"\n')
    assert node.run(str(bad)) == 2
    assert "raft_address" in capsys.readouterr().err


def test_storage_durability_defaults_to_fsync_and_takes_os():
    assert config.parse(with_changes(), base_dir=ROOT).storage.durability == "fsync"
    loaded = config.parse(with_changes(storage={"durability": "os"}), base_dir=ROOT)
    assert loaded.storage.durability == "os"


def test_the_archive_is_on_by_default_and_can_be_turned_off():
    assert config.parse(with_changes(), base_dir=ROOT).storage.archive is True
    off = config.parse(with_changes(storage={"archive": False}), base_dir=ROOT)
    assert off.storage.archive is False


@pytest.mark.parametrize(
    "storage, key",
    [({"durability": "none"}, "storage.durability"), ({"durability": 1}, "storage.durability"),
     ({"fsync": True}, "storage.fsync"), ("fsync", "storage"),
     ({"archive": "yes"}, "storage.archive")],
)
def test_a_bad_storage_setting_names_its_key(storage, key):
    with pytest.raises(ConfigError) as error:
        config.parse(with_changes(storage=storage), base_dir=ROOT)
    assert error.value.key == key


def test_tokens_come_from_the_config_a_tokens_file_and_the_environment(tmp_path, monkeypatch):
    (tmp_path / "tokens.toml").write_text(
        'tokens = { "file-token-0123" = { role = "admin", name = "ops-alice" } }\n')
    monkeypatch.setenv(config.API_TOKENS_ENV, "ci:submit:env-token-0123, read:env-read-0123")
    loaded = config.parse(
        with_changes(api={"tokens": {"inline-token-0123": "worker"}, "tokens_file": "tokens.toml"}),
        base_dir=tmp_path,
    )
    assert loaded.tokens == {"inline-token-0123": "worker", "file-token-0123": "admin",
                             "env-token-0123": "submit", "env-read-0123": "read"}
    assert loaded.token_names["file-token-0123"] == "ops-alice"
    assert loaded.token_names["env-token-0123"] == "ci"
    # A token without a name is named by its role and a hash prefix, never by itself.
    assert loaded.token_names["env-read-0123"].startswith("read-")
    assert "env-read-0123" not in loaded.token_names["env-read-0123"]


def test_a_node_that_cannot_read_the_ca_its_peers_are_verified_with_exits_2(
        tmp_path, capsys, monkeypatch):
    from raftcron.cluster import node

    (tmp_path / "cert.pem").write_text("")
    (tmp_path / "key.pem").write_text("")
    (tmp_path / "n1.toml").write_text(
        'node_id = "n1"\nraft_address = "127.0.0.1:7001"\nhttp_address = "127.0.0.1:8001"\n'
        'cluster_password = "long-enough-secret"\n'
        '[[peers]]\nnode_id = "n2"\nraft_address = "127.0.0.1:7002"\n'
        'http_address = "127.0.0.1:8002"\n'
        '[api]\ntls_cert_file = "cert.pem"\ntls_key_file = "key.pem"\n')
    monkeypatch.setenv("RAFTCRON_CA_FILE", str(tmp_path / "missing-ca.pem"))
    assert node.run(str(tmp_path / "n1.toml")) == 2
    err = capsys.readouterr().err
    assert "missing-ca.pem" in err and "RAFTCRON_CA_FILE" in err, err


@pytest.mark.parametrize(
    ("api", "env", "key"),
    [
        ({"tokens_file": "missing.toml"}, "", "api.tokens_file"),
        ({}, "admin", "RAFTCRON_API_TOKENS[0]"),
        ({}, "root:long-enough-token", "RAFTCRON_API_TOKENS[0]"),
        ({}, "read:short", "RAFTCRON_API_TOKENS[0]"),
        ({"tokens": {"long-enough-token": {"role": "read", "name": "bad name"}}}, "",
         "api.tokens.long..."),
        ({"tokens": {"long-enough-token": "read"}}, "admin:long-enough-token",
         "RAFTCRON_API_TOKENS[0]"),
        ({"max_connections": 0}, "", "api.max_connections"),
        ({"idle_timeout_s": "1"}, "", "api.idle_timeout_s"),
        ({"tls_cert_file": "config.toml"}, "", "api.tls_key_file"),
        ({"tls_client_ca_file": "config.toml"}, "", "api.tls_client_ca_file"),
        ({"tls_cert_file": "nope.pem", "tls_key_file": "nope.pem"}, "", "api.tls_cert_file"),
    ],
)
def test_bad_api_settings_name_the_key(api, env, key, tmp_path, monkeypatch):
    (tmp_path / "config.toml").write_text("")
    monkeypatch.setenv(config.API_TOKENS_ENV, env)
    with pytest.raises(ConfigError) as error:
        config.parse(with_changes(api=api), base_dir=tmp_path)
    assert error.value.key == key, str(error.value)


def test_the_cluster_name_defaults_to_raftcron_and_takes_a_dns_label():
    assert config.parse(with_changes(), base_dir=ROOT).cluster_name == "raftcron"
    loaded = config.parse(with_changes(cluster={"name": "prod-eu-1"}), base_dir=ROOT)
    assert loaded.cluster_name == "prod-eu-1"
    assert config.parse(with_changes(cluster={"name": "a" * 63}), base_dir=ROOT).cluster_name


@pytest.mark.parametrize(
    "cluster, key",
    [({"name": ""}, "cluster.name"), ({"name": "Prod"}, "cluster.name"),
     ({"name": "prod_eu"}, "cluster.name"), ({"name": "-prod"}, "cluster.name"),
     ({"name": "prod-"}, "cluster.name"), ({"name": "a" * 64}, "cluster.name"),
     ({"name": "prod eu"}, "cluster.name"), ({"name": 7}, "cluster.name"),
     ({"token": "x"}, "cluster.token"), ("prod", "cluster")],
)
def test_a_bad_cluster_name_is_refused_naming_its_key(cluster, key):
    with pytest.raises(ConfigError) as error:
        config.parse(with_changes(cluster=cluster), base_dir=ROOT)
    assert error.value.key == key, str(error.value)


def test_clock_settings_default_to_a_second_of_skew_and_take_integers():
    loaded = config.parse(with_changes(), base_dir=ROOT)
    assert (loaded.clock.max_skew_ms, loaded.clock.tick_slack_ms, loaded.clock.poll_ms) == (
        1_000, 250, 500)
    loaded = config.parse(with_changes(clock={"max_skew_ms": 5_000, "poll_ms": 200}),
                          base_dir=ROOT)
    assert (loaded.clock.max_skew_ms, loaded.clock.poll_ms) == (5_000, 200)


@pytest.mark.parametrize(
    "clock, key",
    [({"max_skew_ms": 0}, "clock.max_skew_ms"), ({"max_skew_ms": 1.5}, "clock.max_skew_ms"),
     ({"max_skew_ms": True}, "clock.max_skew_ms"), ({"poll_ms": 10}, "clock.poll_ms"),
     ({"tick_slack_ms": 1_000}, "clock.tick_slack_ms"), ({"skew": 1}, "clock.skew"),
     ([], "clock")],
)
def test_a_bad_clock_setting_names_its_key(clock, key):
    with pytest.raises(ConfigError) as error:
        config.parse(with_changes(clock=clock), base_dir=ROOT)
    assert error.value.key == key
