"""Membership on real nodes (DESIGN.md §8.4): grow 3 -> 5 -> 3 with writes flowing, remove the
leader, replace a node whose data dir was deleted (remove + add under a new id, and
--rejoin-empty), one change at a time (409), a cancelled addition; at the end of each, every
acknowledged write is on every member and the members' digests are equal.

The tests share one cluster and run in order; each leaves it with three healthy members (the
module's closing check audits them). Nobody rewrites a member's config: the members learn of
each change from the log, and a restarted member reads them back from its own storage.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from writes import Writer, assert_every_write_on_every_member

from raftcron.cluster.commandline import main as cli
from raftcron.cluster.dev import joining
from raftcron.cluster.dev.localcluster import LocalCluster
from raftcron.cluster.dev.nodeprocesses import LocalNode

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def members(module_cluster_factory: Any) -> LocalCluster:
    cluster: LocalCluster = module_cluster_factory.open()
    return cluster


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[dict[str, float]]:
    measured: dict[str, float] = {}
    yield measured
    if measured:  # shown with -rP; the docs' figures come from these lines
        print(f"figures of {request.node.name}: {measured}")


def members_view(cluster: LocalCluster, node: LocalNode | None = None) -> dict[str, Any]:
    status, view, _ = cluster.request(node or cluster.leader(), "GET", "/v1/cluster/members")
    assert status == 200, view
    return dict(view)


def no_change_in_progress(cluster: LocalCluster) -> None:
    cluster.wait_for(lambda: members_view(cluster)["change"] is None, 60, "no change in progress")


def add(cluster: LocalCluster, node: LocalNode, **query: int) -> tuple[int, Any]:
    path = "/v1/cluster/members" + ("?" + "&".join(f"{k}={v}" for k, v in query.items())
                                    if query else "")
    status, answer, _ = cluster.call("POST", path, joining.body(node), timeout_s=120)
    return status, answer


def test_grow_3_5_3_with_writes_flowing_removing_the_leader(
        members: LocalCluster, figures: dict[str, float]) -> None:
    cluster = members
    original = list(cluster.nodes)
    # The new nodes catch up by snapshot: the leader's log is compacted first.
    cluster.request(cluster.leader(), "POST", "/v1/cluster/compact")
    with Writer(cluster, "grow") as writer:
        writer.wait_for(50)
        for node_id in ("n4", "n5"):
            node = joining.join_node(cluster, node_id)
            cluster.start_node(node)
            started = time.monotonic()
            status, answer = add(cluster, node, wait_s=60)
            figures[f"add {node_id} s"] = round(time.monotonic() - started, 2)
            assert status == 201, answer
            assert answer["change"]["outcome"] == "done"
            trails = [cluster.request(n, "GET", "/v1/audit")[1]["entries"]
                      for n in cluster.live_nodes()]
            assert any((e["method"], e["path"], e["status"]) == (
                "POST", "/v1/cluster/members?wait_s=60", 201) for t in trails for e in t)
            writer.wait_for(20)
        view = members_view(cluster)
        assert [m["node_id"] for m in view["members"]] == ["n1", "n2", "n3", "n4", "n5"]

        def clocks_read() -> bool:  # the clock poller follows the members, not the configs
            _, own, _ = cluster.request(cluster.leader(), "GET", "/v1/cluster")
            return all(m["clock_offset_ms"] is not None for m in own["members"])

        cluster.wait_for(clocks_read, 30, "every member's clock read by the leader")
        assert all(m["state"] == "voter" for m in view["members"])
        assert view["voters"] == ["n1", "n2", "n3", "n4", "n5"]

        leader = cluster.leader()
        others = [n for n in cluster.nodes if n is not leader]
        started = time.monotonic()
        status, answer, _ = cluster.call(
            "DELETE", f"/v1/cluster/members/{leader.node_id}?wait_s=60", nodes=others,
            timeout_s=90)
        figures["remove the leader s"] = round(time.monotonic() - started, 2)
        assert status == 200, answer
        joining.retire(cluster, leader)
        assert cluster.leader() is not leader
        writer.wait_for(20)

        second = next(n for n in original if n in cluster.nodes and n is not cluster.leader())
        status, answer, _ = cluster.call(  # a member that stays answers when it is done
            "DELETE", f"/v1/cluster/members/{second.node_id}",
            nodes=[n for n in cluster.nodes if n is not second])
        assert status == 200, answer
        joining.retire(cluster, second)
        writer.wait_for(20)
    assert len(cluster.nodes) == 3
    figures["writes acknowledged"] = len(writer.acknowledged)
    view = members_view(cluster)
    assert sorted(m["node_id"] for m in view["members"]) == sorted(n.node_id for n in cluster.nodes)
    # The joiners installed the leader's snapshot before they voted.
    for node_id in ("n4", "n5"):
        lines = cluster.log_lines(cluster.node(node_id))
        installed = next(i for i, line in enumerate(lines) if "snapshot_installed" in line)
        voting = next(i for i, line in enumerate(lines) if "member_voting" in line)
        assert installed < voting
    # Restarted, every member reads the members from its own storage, not its stale config.
    for node in list(cluster.nodes):
        cluster.restart(node, sig=signal.SIGTERM)
    cluster.wait_ready(60)
    assert_every_write_on_every_member(cluster, writer.acknowledged)
    assert members_view(cluster)["voters"] == sorted(n.node_id for n in cluster.nodes)


def test_a_second_change_while_one_is_running_gets_409(members: LocalCluster) -> None:
    cluster = members
    no_change_in_progress(cluster)
    waiting = joining.join_node(cluster, "n6")  # not started: it stays catching up
    status, answer = add(cluster, waiting, wait_s=0)
    assert status == 202 and answer["change"]["member"]["node_id"] == "n6", answer
    other = joining.join_node(cluster, "n7")
    status, answer = add(cluster, other)
    assert status == 409 and answer["error"]["code"] == "membership_change_in_progress"
    # A joining node that is not a member neither takes writes nor says it is ready.
    cluster.start_node(other)
    def up() -> bool:
        try:
            return cluster.request(other, "GET", "/healthz")[0] == 200
        except OSError:
            return False

    cluster.wait_for(up, 30, "n7 up")
    status, answer, _ = cluster.request(other, "POST", "/v1/jobs", {"task": "t"})
    assert status == 503 and "not a member" in answer["error"]["message"], answer
    status, ready, _ = cluster.request(other, "GET", "/readyz")
    assert status == 503 and ready["member"] is False, ready
    cluster.stop(other)
    victim = cluster.nodes[0]
    status, answer, _ = cluster.call("DELETE", f"/v1/cluster/members/{victim.node_id}")
    assert status == 409 and answer["error"]["code"] == "membership_change_in_progress"
    view = members_view(cluster)
    assert view["change"]["phase"] == "catching_up"
    assert [m["state"] for m in view["members"] if m["node_id"] == "n6"] == ["catching_up"]
    # DELETE of the node being added cancels the addition: it never counted.
    status, answer, _ = cluster.call("DELETE", "/v1/cluster/members/n6")
    assert status == 200 and answer["cancelled"] is True, answer
    assert answer["change"]["outcome"] == "aborted"
    for node in (waiting, other):
        cluster.nodes.remove(node)
    assert members_view(cluster)["voters"] == sorted(n.node_id for n in cluster.nodes)


def test_replace_a_node_whose_data_dir_was_deleted_by_remove_and_add_under_a_new_id(
        members: LocalCluster, capsys: pytest.CaptureFixture[str],
        figures: dict[str, float]) -> None:
    cluster = members
    no_change_in_progress(cluster)
    lost = next(n for n in cluster.nodes if n is not cluster.leader())
    connect = ",".join(n.url for n in cluster.nodes if n is not lost)
    with Writer(cluster, "replace") as writer:
        writer.wait_for(20)
        cluster.kill(lost)
        shutil.rmtree(lost.data_dir)
        joining.retire(cluster, lost)
        assert cli.main(["cluster", "remove", lost.node_id, "--connect", connect]) == 0
        new = joining.join_node(cluster, f"{lost.node_id}b")
        cluster.start_node(new)
        started = time.monotonic()
        code = cli.main(["cluster", "add", new.node_id, "--raft", new.raft_address,
                         "--http", new.http_address, "--connect", connect])
        figures["add the replacement s"] = round(time.monotonic() - started, 2)
        printed = capsys.readouterr()
        assert code == 0, printed.err
        assert f"{new.node_id}: added" in printed.out
        writer.wait_for(20)
    assert cli.main(["cluster", "status", "--connect", connect]) == 0
    status_out = capsys.readouterr().out
    assert new.node_id in status_out and "voter" in status_out
    assert_every_write_on_every_member(cluster, writer.acknowledged)


def test_replace_a_node_whose_data_dir_was_deleted_by_rejoining_empty(
        members: LocalCluster) -> None:
    cluster = members
    no_change_in_progress(cluster)
    lost = next(n for n in cluster.nodes if n is not cluster.leader())
    with Writer(cluster, "rejoin") as writer:
        writer.wait_for(20)
        cluster.kill(lost)
        shutil.rmtree(lost.data_dir)
        # As docs/operations/membership.md says: its peers are the members of today (its config
        # may be older).
        members = [n for n in cluster.nodes if n is not lost]
        lost.config_path.write_text(cluster.config_text(lost, peers=members))
        command = cluster.command
        cluster.command = lambda node: [*command(node), "--rejoin-empty"]  # type: ignore[method-assign]
        try:
            cluster.start_node(lost)
        finally:
            cluster.command = command  # type: ignore[method-assign]
        cluster.wait_for(lambda: any("rejoin_caught_up" in line
                                     for line in cluster.log_lines(lost)), 60, "rejoin")
        writer.wait_for(20)
    assert_every_write_on_every_member(cluster, writer.acknowledged)


def test_a_node_started_without_peers_cannot_grow_and_says_why(
        module_cluster_factory: Any) -> None:
    single: LocalCluster = module_cluster_factory.open(nodes=1)
    newcomer = joining.join_node(single, "n2")
    status, answer, _ = single.call("POST", "/v1/cluster/members", joining.body(newcomer))
    assert status == 409 and answer["error"]["code"] == "cannot_grow", answer
    single.nodes.remove(newcomer)
