"""What an operator reads and runs against a node: `metrics` (the /metrics page), `activity`
(the dashboard's samples), `doctor` (`raftcron cluster doctor`), `backup` (backups and
restores of a data directory) and `notifier` (webhooks for events).
"""
