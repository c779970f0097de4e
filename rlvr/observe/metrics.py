"""Metric sinks: one JSON line per record in ``run_dir/metrics.jsonl``, optionally TensorBoard.

Contract (slime's ``logging_utils.log``):

- Metric names carry a prefix: ``rollout/``, ``eval/``, ``train/`` or ``perf/``. The prefix is
  the caller's business and is not enforced here (custom metrics are welcome).
- Every record carries exactly one step key, ``rollout/step``, ``train/step`` or ``eval/step``,
  which is also the TensorBoard ``global_step``. Each record also gets ``"time"`` (unix seconds).
- Values may be Python/numpy/torch scalars (one element); they are stored as ``float``.
  NaN and ±inf are not valid JSON, so they are written as ``null`` (``read_metrics`` gives
  ``None`` back) while TensorBoard receives the real value, so a diverging loss stays visible
  there. ``None`` is written as ``null`` and skipped in TensorBoard. Anything else
  (strings, multi-element tensors) is a bug in the caller and raises ``TypeError``.
- The file is flushed after every record, so a killed run keeps everything it logged; a run
  killed mid-write leaves a truncated last line, which ``read_metrics`` skips.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Iterable

from rlvr.core.jsonl import iter_objects

STEP_KEYS = ("rollout/step", "train/step", "eval/step")
METRICS_FILE = "metrics.jsonl"


def _to_float(key: str, value: Any) -> float | None:
    """A metric value as float (or None); torch/numpy scalars via ``.item()``."""
    if value is None:
        return None
    if hasattr(value, "item"):  # torch tensor, numpy scalar or array
        size = value.numel() if callable(getattr(value, "numel", None)) else getattr(value, "size", 1)
        if size != 1:
            raise TypeError(f"metric {key!r}: expected a scalar, got shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, (bool, int, float)):
        return float(value)
    raise TypeError(f"metric {key!r}: expected a number, got {type(value).__name__} {value!r}")


class MetricsLogger:
    """Append metric records to ``run_dir/metrics.jsonl`` (and TensorBoard when enabled).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d, MetricsLogger(d) as log:
    ...     log.log({"rollout/raw_reward": 0.5}, "rollout/step", 0)
    ...     [r["rollout/raw_reward"] for r in read_metrics(d)]
    [0.5]
    """

    def __init__(self, run_dir: str | Path, use_tensorboard: bool = False,
                 tb_dir: str | Path | None = None, sinks: Iterable = ()):
        self.sinks = list(sinks)  # more sinks (W&B): ``log(values, step_key, step)`` and ``close()``
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        # Append: a resumed run continues the same file.
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if use_tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # lazy: tensorboard is slow to import

            self.tb_dir = Path(tb_dir) if tb_dir is not None else self.run_dir / "tensorboard"
            self._tb = SummaryWriter(log_dir=str(self.tb_dir))

    def log(self, metrics: dict[str, Any], step_key: str, step: int) -> None:
        """Write one record ``{step_key: step, **metrics, "time": now}``."""
        if step_key not in STEP_KEYS:
            raise ValueError(f"step_key must be one of {', '.join(STEP_KEYS)}; got {step_key!r}")
        if self._file.closed:
            raise ValueError(f"MetricsLogger for {self.path} is closed")
        step = int(step)
        values: dict[str, float | None] = {}
        for key, value in metrics.items():
            if key in STEP_KEYS:
                # slime passes the step inside the dict; accept it when it agrees.
                if key != step_key or _to_float(key, value) != step:
                    raise ValueError(f"metrics contain {key}={value!r}, but step_key={step_key!r} step={step}")
                continue
            if key == "time":
                raise ValueError("'time' is reserved: MetricsLogger adds it to every record")
            values[key] = _to_float(key, value)
        record: dict[str, Any] = {step_key: step}
        record.update({k: v if v is not None and math.isfinite(v) else None for k, v in values.items()})
        record["time"] = time.time()
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in values.items():
                if value is not None:
                    self._tb.add_scalar(key, value, global_step=step)
            self._tb.flush()
        for sink in self.sinks:
            sink.log(values, step_key, step)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        for sink in self.sinks:
            sink.close()
        self.sinks = []

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl`` (or of that file path), in order.

    A corrupt line raises ``DataError`` naming ``file:line``; an unparsable *last* line with no
    trailing newline is what a run killed mid-write leaves, so it is skipped with a warning.
    """
    path = Path(run_dir)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics file (was the run started with this run dir?)")
    records = [record for _, record in iter_objects(path, allow_truncated_tail=True)]
    return records


def compute_statistics(values: Iterable[float]) -> dict[str, float]:
    """mean/median/max/min of ``values``, for slime-style ``response_len/mean`` keys.

    Empty input gives ``{}`` (e.g. a rollout where every sample was aborted), so callers can
    ``dict_add_prefix`` the result unconditionally.

    >>> compute_statistics([1, 2, 6])
    {'mean': 3.0, 'median': 2.0, 'max': 6.0, 'min': 1.0}
    """
    xs = sorted(float(v) for v in values)
    if not xs:
        return {}
    n = len(xs)
    median = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    return {"mean": sum(xs) / n, "median": median, "max": xs[-1], "min": xs[0]}


def eval_score_name(key: str) -> str | None:
    """The dataset name if ``key`` is an eval score: ``eval/<name>/score`` or slime's ``eval/<name>``.

    slime also logs ``eval/<name>-truncated_ratio`` and ``eval/<name>/response_len/...``;
    those are not scores.

    >>> [eval_score_name(k) for k in ["eval/gsm8k", "eval/aime/score", "eval/step",
    ...                               "eval/gsm8k-truncated_ratio", "eval/aime/response_len/mean"]]
    ['gsm8k', 'aime', None, None, None]
    """
    parts = key.split("/")
    if parts[0] != "eval" or key in STEP_KEYS:
        return None
    if len(parts) == 2 and not parts[1].endswith("-truncated_ratio"):
        return parts[1]
    if len(parts) == 3 and parts[2] == "score":
        return parts[1]
    return None


def eval_scores(metrics: dict[str, Any]) -> dict[str, float]:
    """``{dataset name: score}`` for the eval score keys of ``metrics`` (None values skipped).

    >>> eval_scores({"eval/gsm8k": 0.4, "eval/gsm8k-truncated_ratio": 0.1, "eval/step": 3})
    {'gsm8k': 0.4}
    """
    return {name: v for k, v in metrics.items()
            if v is not None and (name := eval_score_name(k)) is not None}
