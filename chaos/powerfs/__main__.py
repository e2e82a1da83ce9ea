"""`python -m chaos.powerfs ...`: see `chaos.powerfs.cli`."""

import sys

from chaos.powerfs.cli import main

sys.exit(main())
