"""The `raftcron` command's entry point before cluster/ had rooms, kept for the scripts and
service files that run it as `python -m raftcron.cluster.cli` (or import `main` from here). The
command lives in cluster/commandline/."""

import sys

from raftcron.cluster.commandline.main import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
