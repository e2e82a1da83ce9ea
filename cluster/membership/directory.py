"""Who the members are, as the rest of a node needs to know them (pure).

The member book once it holds anything (`book`); before the first change, the config file's:
this node and its ``[[peers]]``, or only the peers for a node that says ``join = true`` (it is
not a member until a change adds it). The clock poller, the clock majority, the cluster view,
leader names and the peers a node asks over HTTP all follow this, never the static peer list.
"""

from __future__ import annotations

from raftcron.cluster.config import NodeConfig
from raftcron.cluster.membership.book import Member, MemberBook


def initial_members(config: NodeConfig) -> tuple[Member, ...]:
    members = [Member(p.node_id, p.raft_address, p.http_address) for p in config.peers]
    if not config.join:
        members.append(Member(config.node_id, config.raft_address, config.http_address))
    return tuple(sorted(members))


def current_members(config: NodeConfig, book: MemberBook) -> tuple[Member, ...]:
    return book.members if book.recorded else initial_members(config)


def is_member(config: NodeConfig, book: MemberBook) -> bool:
    me = (config.node_id, config.raft_address)
    return any((m.node_id, m.raft_address) == me for m in current_members(config, book))


def being_removed(config: NodeConfig, book: MemberBook) -> bool:
    change = book.change
    return change is not None and change.action == "remove" and not change.cancel_reason \
        and change.member.raft_address == config.raft_address


def raft_ids(config: NodeConfig, book: MemberBook) -> dict[str, str]:
    """Raft address -> node id of every node this node may hear of: the config's, the
    members', and the one a change in progress adds (the later source wins)."""
    ids = {peer.raft_address: peer.node_id for peer in config.members}
    ids.update({m.raft_address: m.node_id for m in current_members(config, book)})
    if book.change is not None:
        ids[book.change.member.raft_address] = book.change.member.node_id
    return ids
