"""Tests of the monitoring kit (deploy/monitoring/): its alert rules, their promtool unit
tests, the Grafana dashboard, and the metrics a live node exports for them."""
