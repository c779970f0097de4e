"""Row readers for prompt datasets, read from disk on demand so a dataset larger than memory works.

Three formats, chosen by the path (``dataset_kind``):

- a ``.jsonl`` file (or any other file that is not Parquet): JSON lines. Opening it makes one pass
  that records each line's byte offset (8 bytes a line); a row is read by seeking to it.
- a ``.parquet`` file: rows are read one row group at a time when asked for; the two most
  recently used row groups are cached.
- a directory written by the ``datasets`` library (``Dataset.save_to_disk``): its Arrow files are
  memory-mapped, so the operating system pages rows in and out.

Every reader gives ``len()``, ``row(i) -> dict``, ``iter_rows()`` (a sequential pass, for
validation) and ``where(i)``, the place of row ``i`` in error messages: ``file:line`` for JSONL
(1-based line), ``file: row N`` otherwise (0-based row). Parquet and Arrow need ``pyarrow``.
"""

from __future__ import annotations

import json
from array import array
from collections import OrderedDict
from pathlib import Path
from typing import Iterator, Protocol

from rlvr.core.errors import DataError


class Rows(Protocol):
    path: Path

    def __len__(self) -> int: ...

    def row(self, i: int) -> dict: ...

    def iter_rows(self) -> Iterator[tuple[int, dict]]: ...

    def where(self, i: int) -> tuple[str, int | None, str]: ...


def dataset_kind(path: str | Path) -> str:
    """``"jsonl"``, ``"parquet"`` or ``"arrow"`` (a ``save_to_disk`` directory); ValueError otherwise."""
    p = Path(path)
    if p.is_dir():
        if (p / "state.json").is_file():
            return "arrow"
        if (p / "dataset_dict.json").is_file():
            raise ValueError(f"{p} holds a DatasetDict; point at one split's directory, e.g. {p}/train")
        raise ValueError(f"{p} is a directory but not one written by datasets' save_to_disk (no state.json)")
    if not p.is_file():
        raise ValueError(f"file not found: {p}")
    return "parquet" if p.suffix == ".parquet" else "jsonl"


def open_rows(path: str | Path) -> Rows:
    kind = dataset_kind(path)
    return {"jsonl": JsonlRows, "parquet": ParquetRows, "arrow": ArrowRows}[kind](Path(path))


def _pyarrow(path: Path):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise DataError(str(path), None, "reading Parquet/Arrow needs pyarrow: pip install pyarrow") from None
    import pyarrow.parquet

    return pyarrow


class JsonlRows:
    """JSON lines, read by byte offset. Blank lines are skipped (and not counted as rows)."""

    def __init__(self, path: Path):
        self.path = path
        self._offsets, self._lines = array("q"), array("q")
        with open(path, "rb") as f:
            offset = 0
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    self._offsets.append(offset)
                    self._lines.append(lineno)
                offset += len(line)

    def __len__(self) -> int:
        return len(self._offsets)

    def where(self, i: int) -> tuple[str, int | None, str]:
        return str(self.path), self._lines[i], ""

    def _parse(self, i: int, line: bytes) -> dict:
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            reason = f"not valid JSON ({e.msg} at column {e.colno})" if isinstance(e, json.JSONDecodeError) else str(e)
            raise DataError(str(self.path), self._lines[i], reason) from None
        if not isinstance(row, dict):
            raise DataError(str(self.path), self._lines[i], f"expected a JSON object, got {type(row).__name__}")
        return row

    def row(self, i: int) -> dict:
        with open(self.path, "rb") as f:
            f.seek(self._offsets[i])
            return self._parse(i, f.readline())

    def iter_rows(self) -> Iterator[tuple[int, dict]]:
        with open(self.path, "rb") as f:
            for i in range(len(self)):
                f.seek(self._offsets[i])
                yield i, self._parse(i, f.readline())


class ParquetRows:
    """A Parquet file, read per row group on demand."""

    CACHE = 2  # row groups kept decoded

    def __init__(self, path: Path):
        pa = _pyarrow(path)
        self.path = path
        try:
            self._file = pa.parquet.ParquetFile(path)
        except Exception as e:  # pyarrow raises ArrowInvalid and friends
            raise DataError(str(path), None, f"not a readable Parquet file ({e})") from None
        meta = self._file.metadata
        self._starts = array("q", [0])
        for g in range(meta.num_row_groups):
            self._starts.append(self._starts[-1] + meta.row_group(g).num_rows)
        self._cache: OrderedDict[int, list[dict]] = OrderedDict()

    def __len__(self) -> int:
        return self._starts[-1]

    def where(self, i: int) -> tuple[str, int | None, str]:
        return str(self.path), None, f"row {i}: "

    def _group(self, g: int) -> list[dict]:
        if g not in self._cache:
            self._cache[g] = self._file.read_row_group(g).to_pylist()
            if len(self._cache) > self.CACHE:
                self._cache.popitem(last=False)
        self._cache.move_to_end(g)
        return self._cache[g]

    def row(self, i: int) -> dict:
        from bisect import bisect_right

        g = bisect_right(self._starts, i) - 1
        return self._group(g)[i - self._starts[g]]

    def iter_rows(self) -> Iterator[tuple[int, dict]]:
        for g in range(len(self._starts) - 1):
            for j, row in enumerate(self._file.read_row_group(g).to_pylist()):
                yield self._starts[g] + j, row


class ArrowRows:
    """A ``datasets`` ``save_to_disk`` directory: its Arrow stream files, memory-mapped."""

    def __init__(self, path: Path):
        pa = _pyarrow(path)
        self.path = path
        try:
            state = json.loads((path / "state.json").read_text())
            files = [path / f["filename"] for f in state["_data_files"]]
            tables = [pa.ipc.open_stream(pa.memory_map(str(f))).read_all() for f in files]
        except Exception as e:
            raise DataError(str(path), None, f"not a readable datasets directory ({e})") from None
        self._table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]

    def __len__(self) -> int:
        return self._table.num_rows

    def where(self, i: int) -> tuple[str, int | None, str]:
        return str(self.path), None, f"row {i}: "

    def row(self, i: int) -> dict:
        return self._table.slice(i, 1).to_pylist()[0]

    def iter_rows(self) -> Iterator[tuple[int, dict]]:
        i = 0
        for batch in self._table.to_batches(max_chunksize=1024):
            for row in batch.to_pylist():
                yield i, row
                i += 1


def row_error(rows: Rows, i: int, message: str) -> DataError:
    """A ``DataError`` naming row ``i`` of ``rows`` (``file:line`` or ``file: row N``)."""
    path, line, prefix = rows.where(i)
    return DataError(path, line, prefix + message)
