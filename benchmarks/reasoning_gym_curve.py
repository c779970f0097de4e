"""docs/reasoning_gym_curve.png: per-task greedy accuracy vs GRPO rollout over seeds, from run directories.

One panel per task (``eval/<set>/accuracy/<task>``, full marks): the seeds' mean as a line, their
minimum-to-maximum as a band, each seed as faint dots; only rollouts at which every run was
evaluated are drawn, so the seeds are compared at the same points.

    python benchmarks/reasoning_gym_curve.py RUN_DIR [RUN_DIR ...] [--set val] [--out docs/reasoning_gym_curve.png]

``--compare``: each run is a recipe choice of its own (``LABEL=RUN_DIR``), drawn as its own line, with a
first panel for the whole set; a markdown table of every run's accuracy at every evaluation (the
whole set, then each task) and its training reward per rollout is printed too.

    python benchmarks/reasoning_gym_curve.py --compare base=runs/a "lr 3e-5=runs/b" --out docs/recipe_choices.png
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


def panels(titles: list[str], width: float, height: float):
    """(figure, its axes): one panel per title, accuracy 0-1 against the GRPO rollout."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * len(titles), height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(titles), squeeze=False)[0]
    for ax, title in zip(axes, titles):
        ax.set_title(title)
        ax.set_xlabel("GRPO rollout")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    return fig, axes


def save(fig, eval_set: str, out: str, legend_size: str) -> None:
    fig.axes[0].set_ylabel(f"greedy accuracy ({eval_set})")
    fig.axes[0].legend(fontsize=legend_size)
    fig.savefig(out, dpi=90)
    print(out)


def compare(named: dict[str, list[dict]], eval_set: str, out: str) -> None:
    """One line per run on a panel per task (and one for the whole set); the table on stdout."""
    per_run = {name: curves([[r for r in rs if "eval/step" in r]], eval_set) for name, rs in named.items()}
    for name, rs in named.items():
        per_run[name] = {"all": {r["eval/step"]: [r[f"eval/{eval_set}/accuracy"]] for r in rs
                                 if f"eval/{eval_set}/accuracy" in r}} | per_run[name]
    tasks = list(next(iter(per_run.values())))
    print("| choice | " + " | ".join(tasks) + " | training reward by rollout |")
    print("| --- " * (len(tasks) + 2) + "|")
    for name, per_task in per_run.items():
        cells = [" / ".join(f"{v[0]:.3f}" for v in per_task[t].values()) for t in tasks]
        rewards = " ".join(f"{r['rollout/raw_reward']:.2f}" for r in named[name] if "rollout/raw_reward" in r)
        print(f"| {name} | " + " | ".join(cells) + f" | {rewards} |")
    fig, axes = panels(tasks, 3.6, 3.4)
    for ax, task in zip(axes, tasks):
        for name, per_task in per_run.items():
            ax.plot(list(per_task[task]), [v[0] for v in per_task[task].values()], "-o", label=name, markersize=3)
    save(fig, eval_set, out, "x-small")


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from rlvr.observe import read_metrics

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--set", default="val", help="the eval set's name (--eval-prompt-data NAME)")
    p.add_argument("--out", default=str(ROOT / "docs" / "reasoning_gym_curve.png"))
    p.add_argument("--compare", action="store_true", help="runs are recipe choices, LABEL=RUN_DIR each")
    args = p.parse_args()
    if args.compare:
        named = dict(d.split("=", 1) if "=" in d else (Path(d).name, d) for d in args.run_dirs)
        return compare({name: read_metrics(Path(d)) for name, d in named.items()}, args.set, args.out)
    runs = [[r for r in read_metrics(Path(d)) if "eval/step" in r] for d in args.run_dirs]
    per_task = curves(runs, args.set)
    tasks = sorted(per_task)
    fig, axes = panels(tasks, 4, 3.6)
    for ax, task in zip(axes, tasks):
        steps = per_task[task]
        xs = list(steps)
        ax.fill_between(xs, [min(v) for v in steps.values()], [max(v) for v in steps.values()], alpha=0.25)
        ax.plot(xs, [sum(v) / len(v) for v in steps.values()], "-o", label=f"mean of {len(runs)} seeds")
        for i in range(len(runs)):
            ax.plot(xs, [v[i] for v in steps.values()], ".", color="grey", alpha=0.6)
    save(fig, args.set, args.out, "small")


if __name__ == "__main__":
    main()
