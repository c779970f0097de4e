"""docs/reasoning_gym_curve.png: per-task greedy accuracy vs GRPO rollout over seeds, from run directories.

One panel per task (``eval/<set>/accuracy/<task>``, full marks): the seeds' mean as a line, their
minimum-to-maximum as a band, each seed as faint dots; only rollouts at which every run was
evaluated are drawn, so the seeds are compared at the same points.

    python benchmarks/reasoning_gym_curve.py RUN_DIR [RUN_DIR ...] [--set val] [--out docs/reasoning_gym_curve.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def curves(runs: list[list[dict]], eval_set: str) -> dict[str, dict[int, list[float]]]:
    """{task: {eval step: [accuracy of each run]}}, at the steps every run has."""
    prefix = f"eval/{eval_set}/accuracy/"
    out: dict[str, dict[int, list[float]]] = {}
    for records in runs:
        for r in records:
            for key, value in r.items():
                if key.startswith(prefix) and value is not None:
                    out.setdefault(key[len(prefix):], {}).setdefault(r["eval/step"], []).append(value)
    return {task: {s: v for s, v in sorted(steps.items()) if len(v) == len(runs)} for task, steps in out.items()}


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from rlvr.observe import read_metrics

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--set", default="val", help="the eval set's name (--eval-prompt-data NAME)")
    p.add_argument("--out", default=str(ROOT / "docs" / "reasoning_gym_curve.png"))
    args = p.parse_args()
    runs = [[r for r in read_metrics(Path(d)) if "eval/step" in r] for d in args.run_dirs]
    per_task = curves(runs, args.set)
    fig = Figure(figsize=(4 * len(per_task), 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    for ax, (task, steps) in zip(fig.subplots(1, len(per_task), squeeze=False)[0], sorted(per_task.items())):
        xs = list(steps)
        ax.fill_between(xs, [min(v) for v in steps.values()], [max(v) for v in steps.values()], alpha=0.25)
        ax.plot(xs, [sum(v) / len(v) for v in steps.values()], "-o", label=f"mean of {len(runs)} seeds")
        for i in range(len(runs)):
            ax.plot(xs, [v[i] for v in steps.values()], ".", color="grey", alpha=0.6)
        ax.set_title(task)
        ax.set_xlabel("GRPO rollout")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    fig.axes[0].set_ylabel(f"greedy accuracy ({args.set})")
    fig.axes[0].legend(fontsize="small")
    fig.savefig(args.out, dpi=90)
    print(args.out)


if __name__ == "__main__":
    main()
