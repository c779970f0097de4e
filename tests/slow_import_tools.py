"""Tools whose module takes a second to import (``SLOW_IMPORT_S``), for tests/test_agent_tools.py:
a process worker's first import of a tool's module is waited for apart from ``--tool-timeout``."""

import os
import time

SLOW_IMPORT_S = 1.0
time.sleep(SLOW_IMPORT_S)


def echo(x: str) -> str:
    """Returns ``x``."""
    return x


def exit_worker(code: int) -> str:
    """Ends its process at once with exit status ``code``, as a crashing extension would."""
    os._exit(code)
