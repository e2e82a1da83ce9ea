"""The bounds only the HTTP API has, named in one place.

Every field of a command is checked once, by the core's own parsing (`Command.from_wire`, the
spec parsers, `scheduler/limits.py`): the routes add no limit of their own to those fields. What
is here bounds the API itself: the size of a request, how long it may wait, how much one page
shows, and the shape of what the URL carries.
"""

from __future__ import annotations

BODY_BYTES_MAX = 8 * 1024 * 1024  # a request body (JSON); aiohttp refuses longer at once
BODY_READ_S = 30  # a body trickled in forever would hold a connection slot

# The core takes request ids up to limits.KEY_CHARS_MAX (512) characters; the API takes up to
# 200, so the ids the shell derives from a client's (claim rounds add "/<n>") stay in bounds.
REQUEST_ID_CHARS_MAX = 200

CLAIM_WAIT_MS_MAX = 30_000  # a claim long-polls at most this long
CLAIM_ROUNDS_MAX = 8  # proposals one claim request makes while others win the race

PAGE_MAX = 1_000  # items one GET returns: jobs, events, audit entries, a tail
# A page of jobs (GET /v1/jobs, a purge's page) ends once its jobs reach this many bytes, from
# the state and from the archive each (payloads and results of up to 64 KiB: PAGE_MAX of them
# would be ~100 MB of JSON held at once); it always holds at least one job.
PAGE_BYTES_MAX = 4 << 20
CURSOR_MAX = 2**62  # a page cursor (an id or a sequence number)
PREVIEW_COUNT_MAX = 1_000  # fire times one preview lists
# A one-off `at` schedule in the past would never fire: the API refuses one more than this
# before the node's wall clock (the core refuses one at or before the state's time).
AT_PAST_GRACE_MS = 1_000
PATH_ID_DIGITS_MAX = 18  # a job id in a path: below 10**18, so it fits a 64-bit integer
BACKUP_WAIT_S = 120  # a backup waits this long for its snapshot, or its archive, to be ready
# An archive backup copies the archive into the data dir first: it is refused (507) unless this
# much stays free beside the copy, for the log and snapshots written meanwhile.
ARCHIVE_COPY_RESERVE_BYTES = 256 * 1024**2
# A membership change's POST or DELETE waits at most this long for the change to end (the
# default is shorter); past it the answer is 202 and the change goes on (GET shows it).
MEMBER_WAIT_S_MAX = 120
MEMBER_WAIT_S_DEFAULT = 30
