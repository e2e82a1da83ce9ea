"""Instruments every room may use: `histogram` (latency buckets), `logs` (structured logging)
and `tracing` (OpenTelemetry spans, off unless configured). They import nothing of the other
rooms.
"""
