"""Console view of a run: a progress bar with one summary line per rollout printed above it.

``format_summary`` is the pure part (tested); ``ConsoleProgress`` draws it with ``rich``.
On a terminal the bar is live; when stdout is not a TTY (CI logs, pipes) there is no bar, only
the summary lines, printed as plain text without control characters or wrapping, so each
rollout is exactly one line of the log.
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rlvr.observe.metrics import eval_scores


def _first(metrics: dict[str, Any], *keys: str) -> Any:
    return next((metrics[k] for k in keys if metrics.get(k) is not None), None)


def _num(value: Any, digits: int = 3) -> str:
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    # Small values such as KL (1e-4) would print as 0.000 in fixed notation.
    return f"{value:.{digits}f}" if value == 0 or abs(value) >= 10 ** -digits else f"{value:.2e}"


def format_summary(rollout_id: int, metrics: dict[str, Any], unit: str = "rollout") -> str:
    """One line for one rollout (or ``unit``, e.g. an SFT step); metrics that are absent (or None)
    are left out.

    >>> format_summary(3, {"rollout/raw_reward": 0.5, "rollout/response_len/mean": 41.25,
    ...                    "train/kl_loss": 0.00012, "eval/gsm8k": 0.4, "perf/step_time": 2.5})
    'rollout 3 | reward 0.500 | len 41.2 | kl 1.20e-04 | eval gsm8k 0.400 | 2.5s'
    >>> format_summary(25, {"train/loss": 0.9, "eval/val": 0.3}, unit="sft step")
    'sft step 25 | loss 0.900 | eval val 0.300'
    """
    parts = [f"{unit} {rollout_id}"]
    reward = _first(metrics, "rollout/raw_reward", "rollout/rewards")
    if reward is not None:
        parts.append(f"reward {_num(reward)}")
    elif metrics.get("train/loss") is not None:  # SFT: no reward, the loss is the signal
        parts.append(f"loss {_num(metrics['train/loss'])}")
    if metrics.get("rollout/accuracy") is not None:
        parts.append(f"acc {_num(metrics['rollout/accuracy'])}")
    if metrics.get("rollout/response_len/mean") is not None:
        parts.append(f"len {float(metrics['rollout/response_len/mean']):.1f}")
    # kl_loss is KL to the reference model, ppo_kl to the pre-update policy: both, when both exist.
    if metrics.get("train/kl_loss") is not None:
        parts.append(f"kl {_num(metrics['train/kl_loss'])}")
    if metrics.get("train/ppo_kl") is not None:
        parts.append(f"ppo_kl {_num(metrics['train/ppo_kl'])}")
    for name, score in eval_scores(metrics).items():
        parts.append(f"eval {name} {_num(score)}")
    if metrics.get("perf/step_time") is not None:
        parts.append(f"{float(metrics['perf/step_time']):.1f}s")
    return " | ".join(parts)


class ConsoleProgress:
    """Progress over rollouts ``start .. total_rollouts``; use as a context manager.

    ``enabled=False`` prints nothing (e.g. on non-zero ranks). ``console`` is for tests. ``unit``
    names what is counted (``rlvr sft``: "sft step", its lines numbered by steps done).
    """

    def __init__(self, total_rollouts: int, start: int = 0, enabled: bool = True,
                 console: Console | None = None, unit: str = "rollout"):
        self.total, self.start, self.enabled, self.unit = total_rollouts, start, enabled, unit
        self.console = console or Console(highlight=False)
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> "ConsoleProgress":
        if self.enabled and self.console.is_terminal:
            self._progress = Progress(
                TextColumn(f"[bold]{self.unit}s"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                console=self.console,
            )
            self._progress.start()
            self._task = self._progress.add_task(f"{self.unit}s", total=self.total, completed=self.start)
        return self

    def advance(self, rollout_id: int, metrics: dict[str, Any], show: bool = True, label: int | None = None) -> None:
        """Move the bar to ``rollout_id + 1`` and, if ``show``, print the summary line of
        ``rollout_id`` (or numbered ``label``; SFT prints one line every N steps instead of thousands)."""
        if not self.enabled:
            return
        line = format_summary(rollout_id if label is None else label, metrics, self.unit)
        if self._progress is not None:
            if show:
                self._progress.console.print(line, markup=False, highlight=False)
            self._progress.update(self._task, completed=rollout_id + 1)
        elif show:
            # soft_wrap: never break a long line at the console width (80 columns off a TTY).
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
