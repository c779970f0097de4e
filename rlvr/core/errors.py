"""Errors users see. Each names the flag, file, line or field at fault and what to change."""

from __future__ import annotations


class ConfigError(ValueError):
    """An impossible or invalid setting, raised at parse time.

    >>> str(ConfigError("--global-batch-size", "must divide 64"))
    '--global-batch-size: must divide 64'
    """

    def __init__(self, flag: str, message: str):
        self.flag = flag
        super().__init__(f"{flag}: {message}")


class DataError(ValueError):
    """Bad input data: names the file and the 1-based line number."""

    def __init__(self, path: str, line: int | None, message: str):
        self.path, self.line = path, line
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")


class TrainingStopped(RuntimeError):
    """The run stopped itself (e.g. too many consecutive skipped optimizer steps); the message says
    which rollout started it and where to look."""
