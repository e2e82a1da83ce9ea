"""Cluster membership (DESIGN.md §8.4): one change at a time, serialized through the log.

`book` is the replicated record (pure), `raftconfig` the reviewed glue to PySyncObj's
configuration, `driver` the leader's side of a change, `directory` who the members are as
the rest of the node needs to know them, `reach` whom this node reaches over Raft (for
`/metrics`).
"""
