"""Tests of the storage under Raft (cluster/storage) and of the simulation's disk model."""
