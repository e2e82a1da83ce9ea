"""`python -m raftcron.cluster.commandline ...` is the `raftcron` command (tests and tools
start nodes and commands this way, with the interpreter they run under)."""

import sys

from raftcron.cluster.commandline.main import main

sys.exit(main())
