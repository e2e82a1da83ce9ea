"""``python -m raftcron.chaos.sim FIRST COUNT [--unpatched]``: run randomized seeds, print the
failures."""

import sys

from raftcron.chaos.sim.randomized import main

sys.exit(main())
