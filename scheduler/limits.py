"""Every bound the core enforces, in one place, with units last in the names.

A replicated state must stay bounded whatever clients send: payloads, results, error texts,
histories, batches and dedupe tables all have a cap. The values are constants of the code, not
node configuration, because every replica must reject exactly the same commands.
"""

from __future__ import annotations

SECOND_MS = 1_000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS

# Every instant the core accepts (run_at, backfill ranges, ticks, schedule bounds) is before
# 2200-01-01: the calendar searches no further, and Python dates end at 9999.
TIME_MS_MAX = 7_258_118_400_000

# Jobs
PAYLOAD_BYTES_MAX = 64 * 1024  # msgpack size of a job's payload
RESULT_BYTES_MAX = 64 * 1024  # msgpack size of a job's result
ERROR_CHARS_MAX = 4_096  # longer error texts are cut, never rejected: a worker's failure must land
NAME_CHARS_MAX = 128  # task, queue, schedule, worker and workflow-node names
KEY_CHARS_MAX = 512  # idempotency keys and request ids
TRACEPARENT_CHARS = 55  # a W3C traceparent of version 00: 00-<32 hex>-<16 hex>-<2 hex>
PRIORITY_MIN, PRIORITY_MAX = -1_000_000, 1_000_000
ATTEMPTS_MAX = 100
HISTORY_ATTEMPTS_MAX = 20  # attempts kept per job (the newest); `attempts` still counts all
DEPENDS_ON_MAX = 100
TIMEOUT_MS_MAX = 7 * DAY_MS
DELAY_MS_MAX = 366 * DAY_MS
# A running job's progress (scheduler/progress.py): a job keeps only its newest report, so
# these bound what a report can add to a job (about 1.9 KB at most, packed).
PROGRESS_MESSAGE_CHARS_MAX = 200
PROGRESS_DATA_BYTES_MAX = 1024  # msgpack size of a report's `data`

# Defaults of a job (DESIGN.md section 3)
MAX_ATTEMPTS_DEFAULT = 3
BACKOFF_INITIAL_MS_DEFAULT = 1 * SECOND_MS
BACKOFF_FACTOR_DEFAULT = 2.0
BACKOFF_MAX_MS_DEFAULT = 5 * MINUTE_MS
BACKOFF_JITTER_DEFAULT = 0.1  # up to +10% of the delay, from a hash: never random

# Commands
BATCH_JOBS_MAX = 1_000
WORKFLOW_JOBS_MAX = 1_000
CLAIM_MAX = 1_000
ACKS_MAX = 1_000
LEASE_MS_MIN = 100
LEASE_MS_MAX = 1 * HOUR_MS
LEASE_MS_DEFAULT = 30 * SECOND_MS
BACKFILL_FIRES_MAX = 1_000
# Parents' results one claim answer carries to its worker (`ctx.upstream`, scheduler/upstream.py),
# summed over its jobs at their stored (msgpack) size: four results of the largest size. The
# rest the worker reads on demand. A read's bound, not a replicated one: changing it changes no
# state.
UPSTREAM_CLAIM_BYTES_MAX = 256 * 1024

# Flow control (DESIGN.md §8.5)
CONCURRENCY_MAX = 100_000  # a queue's concurrency_max, a concurrency key's max
RATE_MAX = 1_000_000  # a rate limit's tokens per window
QUEUES_MAX = 10_000  # queues with limits set (a queue without any costs nothing)
BULK_MAX = 1_000  # jobs one bulk command acts on
# Job ids one bulk command looks at: a bulk over 100k jobs is many commands, each of them a
# few milliseconds on every replica. Measured: ~0.3 us per job id that does not match.
BULK_SCAN_MAX = 20_000

# Schedules
MISFIRE_GRACE_MS_DEFAULT = 60 * SECOND_MS  # Quartz's default misfire threshold
MAX_CATCHUP_DEFAULT = 100
MAX_CATCHUP_MAX = 1_000
JITTER_MS_MAX = 1 * DAY_MS
SCHEDULE_RETAIN_DEFAULT = 1_000  # finished jobs kept per schedule (newest)
SCHEDULE_RETAIN_MAX = 100_000
RECENT_FIRES_KEPT = 10
# Fire times listed for one schedule in one Tick. More due than FIRE_LIST_MAX are counted, not
# listed (arithmetic per day and per UTC offset), and only the newest are listed. Where counting
# cannot tell (a fixed-time cron across a DST change) up to FIRE_SCAN_MAX are listed; beyond
# that the count of missed times is a lower bound and the schedule says so
# (`misfires_truncated`).
FIRE_LIST_MAX = 1_000
FIRE_SCAN_MAX = 20_000
# Catch-up after downtime, spread over Ticks (DESIGN.md §8.2): of the schedules found more than
# CATCHUP_LATE_MS late, a Tick catches up only until its work reaches CATCHUP_WORK_PER_TICK (a
# late schedule costs 1, plus 1 per run it fires); the ticker ticks again at once for the rest.
# 100k schedules' catch-up in one entry would stall every replica at once. Schedules due on
# time are never held back. Measured (2-core dev machine): a late every-second schedule after a
# day down costs ~0.05 ms to plan (counted, not listed) and a fired run ~0.03 ms.
CATCHUP_WORK_PER_TICK = 500
CATCHUP_LATE_MS = 1_000

# Retention (time-driven GC inside Tick)
RETENTION_MS_DEFAULT = 7 * DAY_MS  # finished jobs
KEY_WINDOW_MS_DEFAULT = 1 * DAY_MS  # idempotency keys
# A `unique` period reaches back at most as far as the job retention: a unique key is
# remembered as long as its period (fire keys' retention when that is past the key window).
# Before the cluster is finalized that is the 7-day constant; after, the longest retention
# setting (at most 30 days: scheduler/settings.py), which the state checks at apply time.
UNIQUE_PERIOD_MS_MAX = RETENTION_MS_DEFAULT
UNIQUE_PERIOD_PARSE_MS_MAX = 30 * DAY_MS
REQUEST_WINDOW_MS = (
    1 * HOUR_MS
)  # request ids: retries of an indeterminate write come within seconds
# A request id is never forgotten younger than this: the longest retry deadline a client may
# set (cluster/clients/asyncclient.py's default is 30 s; the CLI refuses a --deadline above this).
REQUEST_RETRY_MS = 10 * MINUTE_MS
REQUESTS_BYTES_MAX = 64 << 20  # past this, entries older than REQUEST_RETRY_MS go first
REQUESTS_HARD_BYTES_MAX = 256 << 20  # past this (all young), new requests are refused busy
# Requests refused for space, remembered for their repeats (scheduler/requests.py) outside the
# state budget: past this, a refusal for space is answered busy (503) and not remembered.
REFUSALS_BYTES_MAX = 16 << 20
