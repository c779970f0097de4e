"""docs/demo_curve.png: SmolLM2-135M-Instruct's greedy accuracy vs GRPO rollout, from run directories.

Every ``eval/<set>/score`` of each run is drawn against ``eval/step`` (the rollouts trained so
far): held-out (``test``) solid, validation (``val``) dotted, a run evaluated only before and after
as two markers; the label is the run's folder name.

    python benchmarks/smollm2_curve.py RUN_DIR [RUN_DIR ...] [--out docs/demo_curve.png]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STYLES = {"test": "-", "val": ":"}


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from rlvr.observe import read_metrics

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--out", default=str(ROOT / "docs" / "demo_curve.png"))
    p.add_argument("--title", default="GRPO on SmolLM2-135M-Instruct (add2, greedy accuracy)")
    a = p.parse_args()
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for i, run in enumerate(a.run_dirs):
        evals = [r for r in read_metrics(run) if "eval/step" in r]
        for name, style in STYLES.items():
            points = [(r["eval/step"], r[f"eval/{name}/score"]) for r in evals if f"eval/{name}/score" in r]
            ends_only = len(points) <= 2  # evaluated only before and after: two markers, no line
            if points:
                ax.plot(*zip(*points), "none" if ends_only else style, color=f"C{i}", marker="o" if ends_only else ".",
                        label=f"{Path(run).name}: {'held-out' if name == 'test' else 'validation'}")
    ax.set(xlabel="rollouts trained (8 prompts x 8 samples each)", ylabel="greedy accuracy", ylim=(0, 1),
           title=a.title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.savefig(a.out, dpi=110)
    print(a.out)


if __name__ == "__main__":
    main()
