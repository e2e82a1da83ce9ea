"""`python -m raftcron.chaos.powerfs ...`: see `chaos.powerfs.cli`."""

import sys

from raftcron.chaos.powerfs.cli import main

sys.exit(main())
