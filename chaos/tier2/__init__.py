"""Tier 2 of the chaos suite (CHAOS.md): real `raftcron node` processes and workers under
faults. `scenarios` runs a scenario (a cluster, the workload, a plan of faults from `plans`,
`storage_faults` and `power_faults`, through a `context.Context` and the `nemesis`, over
`netns` partitions), records its `history` and judges it with the `checkers`; `report` prints
the table. `raftcron chaos run` is its command.
"""
