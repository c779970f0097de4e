"""Reading JSONL files of objects, with errors that name the file and line (datasets, metrics)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Iterator

from rlvr.core.errors import DataError


def iter_objects(path: str | Path, allow_truncated_tail: bool = False) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-blank line of a JSONL file.

    A line that is not JSON, or not an object, raises ``DataError`` naming ``path:line``. With
    ``allow_truncated_tail``, a broken *last* line without a trailing newline (what a killed writer
    leaves) is skipped with a warning instead.
    """
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                if allow_truncated_tail and not line.endswith("\n"):
                    warnings.warn(f"{path}:{lineno}: skipping truncated last line", stacklevel=2)
                    return
                raise DataError(str(path), lineno, f"not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise DataError(str(path), lineno, f"expected a JSON object, got {type(row).__name__}")
            yield lineno, row
