"""Cluster membership (DESIGN.md §8.4): one change at a time, serialized through the log.

`book` is the replicated record (pure), `raftconfig` the reviewed glue to PySyncObj's
configuration, `directory` who the members are as the rest of the node needs to know them,
`reach` whom this node reaches over Raft (for `/metrics`), `startmode` how a node starts (a new
cluster, joining, rejoining). The leader's side of a change proposes through the log, so it
lives with the log: cluster/consensus/memberdriver.py.
"""
