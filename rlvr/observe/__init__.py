"""Observability: metric sinks (JSONL, TensorBoard), the console progress view, and plots.

Metric names follow slime: prefixes ``rollout/``, ``eval/``, ``train/``,
``perf/``; every record carries one step key, ``rollout/step``, ``train/step`` or ``eval/step``.
"""

from rlvr.observe.console import ConsoleProgress, format_summary
from rlvr.observe.metrics import MetricsLogger, compute_statistics, read_metrics
from rlvr.observe.plot import plot_runs

__all__ = ["MetricsLogger", "read_metrics", "compute_statistics", "ConsoleProgress", "format_summary", "plot_runs"]
