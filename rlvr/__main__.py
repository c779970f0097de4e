"""``python -m rlvr`` is the ``rlvr`` command."""

import sys

from rlvr.entrypoints.cli import main

sys.exit(main())
