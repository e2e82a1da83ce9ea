"""`raftcron node --rejoin-empty=auto`: how an empty node decides to start new, rejoin or join
(cluster/membership/startmode.py). The rules are tables; the asking and the answering are
tried on loopback, without sleeping."""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftcron.cluster.clients.peerhttp import PeerDialer
from raftcron.cluster.commandline.main import main as cli_main
from raftcron.cluster.config import NodeConfig, Peer
from raftcron.cluster.membership import startmode
from raftcron.cluster.membership.startmode import PeerAnswer, decide, looks_new, read_answer

PEERS = ("raftcron-1", "raftcron-2")


def view(node: str = "raftcron-1", *, leader: object = None, commit: object = 0,
         applied: object = 0, members: object = ("raftcron-0", "raftcron-1", "raftcron-2"),
         **more: object) -> bytes:
    member_list = members if not isinstance(members, tuple) else [
        {"node_id": member} for member in members]
    return json.dumps({"node": node, "leader": leader, "commit_index": commit,
                       "applied_index": applied, "members": member_list, **more}).encode()


@pytest.mark.parametrize(("names", "new"), [
    ([], True),
    (["lost+found"], True),  # what an ext4 volume holds when it is made
    (["LOCK"], True),
    (["raftcron.storage"], False),
    (["LOCK", "log-00000001.seg"], False),
    (["snapshot"], False),
    (["raft.journal"], False),  # raftcron 0.1.0's: the start refuses it, naming migrate
])
def test_a_data_dir_is_new_only_when_it_holds_nothing_a_node_wrote(
        names: list[str], new: bool) -> None:
    assert looks_new(names) is new


@pytest.mark.parametrize(("status", "body", "holds", "lists_me"), [
    (200, view(leader="raftcron-2", commit=7, applied=7), True, True),
    (200, view(leader=None, commit=0, applied=12), True, True),  # no leader now; had one
    (200, view(leader=None, commit=3, applied=0), True, True),  # replaying its log
    (200, view(leader="raftcron-2", commit=9, applied=9, members=("raftcron-1", "raftcron-2")),
     True, False),
    (200, view(), False, True),  # started new, no leader yet
    (200, view(commit=1, applied=1), False, True),  # PySyncObj's first entry: still new
    (200, view(commit=2, applied=1), True, True),  # a leader's first entry
    (503, json.dumps({"node": "raftcron-1", "deciding": True}).encode(), False, False),
])
def test_an_answer_says_whether_the_peer_holds_a_cluster_and_lists_this_node(
        status: int, body: bytes, holds: bool, lists_me: bool) -> None:
    answer = read_answer("raftcron-1", "raftcron-0", status, body)
    assert (answer.holds_cluster, answer.lists_me) == (holds, lists_me)


@pytest.mark.parametrize(("status", "body", "why"), [
    (200, b"<html>", "not JSON"),
    (200, b"[1]", "not a JSON object"),
    (200, view(node="raftcron-2"), "answered as 'raftcron-2'"),
    (401, json.dumps({"node": "raftcron-1"}).encode(), "HTTP 401"),
    (503, json.dumps({"node": "raftcron-1", "deciding": "yes"}).encode(), "HTTP 503"),
    (200, view(leader=3), "leader is 3"),
    (200, view(commit=-1), "commit_index and applied_index"),
    (200, view(applied=True), "commit_index and applied_index"),
    (200, view(applied="7"), "commit_index and applied_index"),
    (200, view(members="raftcron-0"), "members is not a list"),
    (200, view(members=[{"id": "raftcron-0"}]), "members is not a list"),
])
def test_an_answer_that_does_not_check_out_counts_as_silence(
        status: int, body: bytes, why: str) -> None:
    answer = read_answer("raftcron-1", "raftcron-0", status, body)
    assert answer.holds_cluster is None
    assert why in answer.detail


HOLDS = PeerAnswer("", True, lists_me=True, detail="leader raftcron-2")
HOLDS_WITHOUT_ME = PeerAnswer("", True, lists_me=False, detail="leader raftcron-2")
EMPTY = PeerAnswer("", False, detail="empty")
SILENT = PeerAnswer("", None, detail="connection refused")


@pytest.mark.parametrize(("one", "two", "deadline_passed", "mode"), [
    (HOLDS, SILENT, False, "rejoin"),  # one peer holding a cluster is enough, at once
    (EMPTY, HOLDS, False, "rejoin"),
    (HOLDS_WITHOUT_ME, HOLDS_WITHOUT_ME, False, "join"),  # a pod added by scaling up
    (HOLDS_WITHOUT_ME, HOLDS, False, "rejoin"),  # a member that knows it: rejoin
    (EMPTY, EMPTY, False, "first_start"),  # everybody answered: a first start, at once
    (EMPTY, SILENT, False, "ask_again"),  # the silent one may hold the cluster
    (EMPTY, None, False, "ask_again"),
    (SILENT, SILENT, False, "ask_again"),
    (EMPTY, SILENT, True, "first_start"),  # a majority (2 of 3) holds nothing
    (SILENT, SILENT, True, "undecided"),  # a lost volume must not look like a first start
    (None, None, True, "undecided"),
])
def test_an_empty_node_rejoins_only_a_cluster_and_starts_new_only_with_a_majority(
        one: PeerAnswer | None, two: PeerAnswer | None, deadline_passed: bool,
        mode: str) -> None:
    answers = {peer: dataclasses.replace(answer, node_id=peer)
               for peer, answer in zip(PEERS, (one, two), strict=True) if answer is not None}
    decision = decide(PEERS, answers, deadline_passed=deadline_passed)
    assert decision.mode == mode, decision.reason


def test_in_a_five_member_cluster_two_empty_answers_are_not_a_majority() -> None:
    peers = ("n2", "n3", "n4", "n5")
    answers = {"n2": dataclasses.replace(EMPTY, node_id="n2"),
               "n3": dataclasses.replace(SILENT, node_id="n3")}
    assert decide(peers, answers, deadline_passed=True).mode == "undecided"
    answers["n4"] = dataclasses.replace(EMPTY, node_id="n4")
    decision = decide(peers, answers, deadline_passed=True)
    assert decision.mode == "first_start"
    assert "n3 (connection refused)" in decision.reason and "n5 (no answer)" in decision.reason


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def node_config(tmp_path: Path, node_id: str, port: int,
                peers: list[tuple[str, int]]) -> NodeConfig:
    return NodeConfig(
        node_id=node_id, raft_address=f"127.0.0.1:{free_port()}",
        http_address=f"127.0.0.1:{port}", data_dir=tmp_path / node_id,
        peers=tuple(Peer(peer, f"127.0.0.1:{free_port()}", f"127.0.0.1:{peer_port}")
                    for peer, peer_port in peers),
        cluster_password="secret")


@pytest.fixture
def deciding_peer(tmp_path: Path) -> Iterator[Peer]:
    """raftcron-1, empty and asking its own peers: what it answers meanwhile."""
    port = free_port()
    with startmode._DecidingServer(node_config(tmp_path, "raftcron-1", port, [])):
        yield Peer("raftcron-1", "127.0.0.1:1", f"127.0.0.1:{port}")


def test_a_node_that_is_asking_answers_that_it_is_empty(deciding_peer: Peer) -> None:
    answer = startmode.ask(PeerDialer("http", None), deciding_peer, "raftcron-0")
    assert (answer.holds_cluster, answer.detail) == (False, "empty, asking its peers too")


def test_nodes_of_a_first_start_hear_each_other_before_the_deadline(
        tmp_path: Path, deciding_peer: Peer) -> None:
    config = node_config(tmp_path, "raftcron-0", free_port(),
                         [("raftcron-1", int(deciding_peer.http_address.rsplit(":")[1]))])
    ticks = iter([0.0, 1.0])  # asked once, well before a deadline of 60 s
    decision = startmode.choose(config, PeerDialer("http", None), ask_s=60.0,
                                clock=lambda: next(ticks))
    assert decision.mode == "first_start"


def test_a_node_whose_peers_never_answer_is_not_started(tmp_path: Path) -> None:
    config = node_config(tmp_path, "raftcron-0", free_port(),
                         [("raftcron-1", free_port()), ("raftcron-2", free_port())])
    ticks = iter([0.0, 5.0])  # the first round of questions ends after the deadline
    decision = startmode.choose(config, PeerDialer("http", None), ask_s=1.0,
                                clock=lambda: next(ticks))
    assert decision.mode == "undecided"
    assert "raftcron-1 (" in decision.reason and "raftcron-2 (" in decision.reason


def test_a_node_with_data_starts_as_it_is_without_asking(tmp_path: Path) -> None:
    config = node_config(tmp_path, "raftcron-0", free_port(), [("raftcron-1", free_port())])
    Path(config.data_dir).mkdir()
    (Path(config.data_dir) / "raftcron.storage").write_text("{}")
    decision = startmode.choose(config, PeerDialer("http", None), ask_s=60.0,
                                clock=lambda: pytest.fail("asked the clock"))
    assert decision.mode == "as_is"


@pytest.mark.parametrize(("argv", "message"), [
    (["node", "--rejoin-empty=maybe"], "invalid choice: 'maybe'"),
    (["node", "--rejoin-empty=auto", "--ask-peers-s=0"], "must be in (0, 3600]"),
    (["node", "--rejoin-empty=auto", "--ask-peers-s=soon"], "not a number of seconds"),
    (["node", "--ask-peers-s=20"], "--ask-peers-s goes with --rejoin-empty=auto"),
    (["node", "--rejoin-empty", "--ask-peers-s=20"], "--ask-peers-s goes with"),
])
def test_the_command_line_refuses_what_it_cannot_mean(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.processes  # openssl makes the certificates
def test_over_mutual_tls_the_peers_hear_a_deciding_node_as_they_dial_any_member(
        tmp_path: Path) -> None:
    from raftcron.cluster.clients.peerhttp import peer_dialer
    from raftcron.cluster.config import ApiSettings
    from raftcron.cluster.dev.certs import LocalCA

    ca = LocalCA(tmp_path / "ca")
    cert, key = ca.issue("node", server=True, client=True)
    api = ApiSettings(tls_cert_file=cert, tls_key_file=key, tls_client_ca_file=ca.cert)
    port = free_port()
    answering = dataclasses.replace(node_config(tmp_path, "raftcron-1", port, []), api=api)
    asking = dataclasses.replace(node_config(tmp_path, "raftcron-0", free_port(), []), api=api)
    peer = Peer("raftcron-1", "127.0.0.1:1", f"127.0.0.1:{port}")
    with startmode._DecidingServer(answering), socket.create_connection(("127.0.0.1", port)):
        # A connection that never says a word holds up nobody else.
        answer = startmode.ask(peer_dialer(asking), peer, "raftcron-0")
        assert (answer.holds_cluster, answer.detail) == (False, "empty, asking its peers too")
        stranger = startmode.ask(PeerDialer("https", ca.context()), peer, "raftcron-0")
        assert stranger.holds_cluster is None  # no client certificate: no answer
