"""Tools shipped beside the product (`raftcron demo`, `raftcron bench` and the benchmarks need
them), never imported by it: a local cluster of real node processes (`localcluster`), the demo,
the benchmarks of the cluster (`bench/`), of the core (`corebench`) and of the log stores.
"""
