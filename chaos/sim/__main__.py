"""``python -m chaos.sim FIRST COUNT [--unpatched]``: run randomized seeds, print failures."""

import sys

from chaos.sim.randomized import main

sys.exit(main())
