"""`python -m raftcron.cluster.worker ...`: the same as `raftcron worker ...`."""

import sys

from raftcron.cluster.worker.cli import main

sys.exit(main())
