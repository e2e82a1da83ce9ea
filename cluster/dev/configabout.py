"""What each key of a node's config does, in a sentence or two: the "what it does" column of the
reference page (docs/reference/config.md, written by docsgen.py beside it from `config.KEYS`).

A key of the schema without a line here, or a line for a key the schema does not have, fails
tests/test_config_about.py: a new key is documented when it is added. The bounds said here are
the ones `config.parse` checks (a value outside them is refused at start, naming the key).
"""

from __future__ import annotations

ABOUT: dict[str, str] = {
    "node_id": "This node's name in the cluster, unique among its members: 1-64 letters, digits, "
               "'_', '.' or '-' (e.g. n1).",
    "raft_address": "host:port this node listens on for its peers' Raft traffic (and which they "
                    "dial); a member's identity in the replicated membership.",
    "http_address": "host:port of the HTTP API: clients, workers, the CLI, the dashboard, "
                    "`/metrics` and the peers' own calls.",
    "data_dir": "Where the node keeps its Raft log, snapshots and archive (relative to the config "
                "file's folder). Losing it loses this replica's copy; the other members "
                "keep theirs.",
    "cluster_password": "The secret every member shares: Raft traffic is encrypted and "
                        "authenticated with it. At least 8 characters; required when the node "
                        "has peers.",
    "peers": "The other members (`[[peers]]` tables of node_id, raft_address and http_address; "
             "in the environment `node_id=raft/http,...`). A joining node lists the current "
             "members.",
    "log_level": "debug, info, warning or error: the node's JSON log on stderr.",
    "join": "true for a node added to a running cluster: it neither votes nor stands for "
            "election until `raftcron cluster add` has made it a member.",
    "api.tokens": "Bearer tokens and their roles (admin, submit, worker, read): `token = "
                  "\"role\"` or `token = { role, name }` (the name goes into the audit log). "
                  "Without any, a node serves only a loopback address.",
    "api.tokens_file": "A TOML file with a `[tokens]` table of the same shape, read at start, "
                       "so the secrets can live outside the config (a mounted Secret).",
    "api.allow_unauthenticated": "Serve the API without tokens on a non-loopback address "
                                 "(behind a proxy that authenticates); refused otherwise.",
    "api.max_connections": "Open HTTP connections at most (1 to 1,000,000, and at most half "
                           "the process's descriptor limit); one over it is answered 503 and "
                           "closed.",
    "api.idle_timeout_s": "Seconds (0.1-3600) a connection may take to send a whole request "
                          "head, or sit idle between requests, before it is closed.",
    "api.tls_cert_file": "PEM certificate chain: the API speaks HTTPS (with `tls_key_file`).",
    "api.tls_key_file": "PEM private key of `tls_cert_file`.",
    "api.tls_client_ca_file": "PEM CA bundle: clients must present a certificate it signed "
                              "(mutual TLS), beside their token.",
    "raft.tick_ms": "The leader proposes a Tick at least this often (10-1000 ms) and whenever "
                    "something is due: how late a schedule's fire or a lease's end can be "
                    "noticed.",
    "raft.election_timeout_min_s": "A follower that hears no leader for a random time between "
                                   "this and `election_timeout_max_s` stands for election; "
                                   "more than 3 x `heartbeat_s`.",
    "raft.election_timeout_max_s": "The upper end of that random wait; more than "
                                   "`election_timeout_min_s`.",
    "raft.heartbeat_s": "How often the leader sends each follower entries or an empty append "
                        "(its heartbeat).",
    "raft.leader_fallback_s": "A leader that has not heard from a majority for this long steps "
                              "down, so an isolated one stops answering as leader; more than "
                              "`heartbeat_s`.",
    "raft.connection_timeout_s": "A peer connection that received nothing this long is taken "
                                 "as dead and dialled again; at least "
                                 "`election_timeout_max_s`.",
    "raft.connection_retry_s": "How soon a dropped peer connection is dialled again.",
    "raft.compaction_min_entries": "A snapshot is written (and the log before it dropped) once "
                                   "this many entries are in the log, or after "
                                   "`compaction_min_time_s`, or at `compaction_max_bytes`.",
    "raft.compaction_min_time_s": "Seconds between snapshots at the latest while entries come.",
    "raft.compaction_max_bytes": "Bytes of commands in the log that bring a snapshot forward, "
                                 "so a flood of large payloads does not fill the disk first.",
    "raft.commit_timeout_s": "A write not applied this long after it was proposed is answered "
                             "503 as indeterminate (it may still commit; the client retries "
                             "with its request id).",
    "raft.batch_commands_max": "Client commands coalesced into one log entry at most (group "
                               "commit: one write and one round trip for many requests).",
    "raft.append_entries_batching": "PySyncObj's own batching, which waits for the next "
                                    "heartbeat to send: off, as raftcron coalesces commands "
                                    "itself and sends each entry at once.",
    "storage.durability": "fsync: every write is on disk before the node acts on it (acks, "
                          "votes); os: the page cache only, faster, and a power loss can cost "
                          "the last seconds' writes (a process crash costs nothing).",
    "storage.archive": "Keep the finished jobs that leave the state in the node's "
                       "`archive.sqlite`, searchable by the API (DESIGN.md 9.2).",
    "clock.max_skew_ms": "A node whose clock is off the majority's by more than this (50 ms to "
                         "1 h) never proposes its own time: its Ticks carry the majority's.",
    "clock.tick_slack_ms": "How far ahead of the majority's clocks a Tick may run (0-10,000 "
                           "ms); less than `max_skew_ms`.",
    "clock.poll_ms": "How often the peers' clocks are read (50-10,000 ms).",
    "membership.catch_up_timeout_s": "A node being added that has not caught up with the "
                                     "leader this long (1-86,400 s) after the change began is "
                                     "not added: the change is cancelled.",
    "tracing.otlp_endpoint": "An OTLP/HTTP collector (http://collector:4318): spans of submit, "
                             "commit, claim and complete go to its `/v1/traces`. Off when "
                             "unset (`pip install raftcron[otel]`).",
    "cluster.name": "The cluster's name (1-63 lower-case letters, digits or '-'), written into "
                    "its snapshots and so its backups, which `raftcron backup` names: a backup "
                    "says which cluster it came from.",
    "settings.retention": "How long finished jobs are kept, by outcome and queue: the "
                          "retention a new cluster starts with (then `PUT "
                          "/v1/settings/retention`).",
    "settings.budget": "The state's memory budget in bytes a new cluster starts with (then "
                       "`PUT /v1/settings/budget`).",
    "settings.archive": "The archive's retention a new cluster starts with (then `PUT "
                        "/v1/settings/archive`).",
    "settings.search_attributes": "Payload paths indexed for search a new cluster starts with "
                                  "(then `PUT /v1/settings/search_attributes`).",
}
