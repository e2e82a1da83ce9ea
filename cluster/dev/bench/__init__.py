"""`raftcron bench`: load against a local 3-node cluster (started by itself) or a running one.

Like pgbench or redis-benchmark: each measure prints a progress line while it runs, the figures
end in a table (or one JSON object with `--json`). Measures (`--only` picks some):

- `submit_single`, `submit_batched`: jobs/s through POST /v1/jobs and /v1/jobs/batch;
- `drain`: N no-op jobs drained by W `raftcron worker` processes;
- `claim`: claim round trip p50/p99/max on an idle cluster;
- `fire`: fire lateness p50/p99 over many 1-second schedules;
- `failover`: leader SIGKILL -> the next committed write, K times;
- `scale`: 100,000 schedules and 1,000,000 retained jobs: RSS, snapshot, restart-to-ready;
- `soak`: jobs submitted and run for N minutes at a sustained rate (or `--flood`ing the state to
  its budget), one record a minute (rates, RSS, state bytes, backlog, kept, evictions,
  refusals, claim latency), then snapshot and restart-to-ready.

`scale` and `soak` run only when `--only` names them. `--peers DIR` then runs the peers' drains
(BullMQ, graphile-worker) of a baselines folder with the drain's jobs, their figures and ratios
beside ours (peers.py, peerrun.py, peerreport.py).
"""
