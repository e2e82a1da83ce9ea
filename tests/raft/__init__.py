"""Tests of the Raft layer: the carried PySyncObj fix and the deterministic simulation."""
