"""`python -m cluster.worker ...`: the same as `raftcron worker ...`."""

import sys

from cluster.worker.cli import main

sys.exit(main())
