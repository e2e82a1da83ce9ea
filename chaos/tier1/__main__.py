"""``python -m raftcron.chaos.tier1 SEED [COUNT]``: run tier-1 seeds, or replay one
(chaos.tier1.run)."""

from raftcron.chaos.tier1.run import main

raise SystemExit(main())
