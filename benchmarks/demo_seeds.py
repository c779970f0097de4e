"""The tiny-model demo with several seeds: ``rlvr demo --tiny --seed N`` for each, one JSON line per seed.

Each seed changes the bootstrap's data order and training seed and GRPO's prompt order and
sampling (``rlvr.entrypoints.demo``); a seed's bootstrap goes to ``examples/arith/assets/seed-N/sft`` and its
GRPO run to ``runs/arith-grpo-seed-N`` (the default seed, ``--seeds default``, uses the demo's own
``assets/sft`` and ``runs/arith-grpo``). A bootstrap already built is reused, so time the bootstrap
by removing it first (``--fresh``). Reported per seed: the bootstrap's SFT steps and validation
accuracy (what it stopped on), and the demo line's held-out accuracy before and after GRPO (greedy,
the 500 test problems) with the gain in points and the wall time of the seed.

    python benchmarks/demo_seeds.py [--seeds default 1 2 3] [--fresh]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"demo: held-out accuracy ([\d.]+) -> ([\d.]+) \(([+-][\d.]+) points\) in (\d+) s")


def run_seed(seed: str, fresh: bool) -> dict:
    sys.path.insert(0, str(ROOT))
    from rlvr.entrypoints.demo import BOOTSTRAP_FILE, sft_dir

    n = None if seed == "default" else int(seed)
    if fresh and (ROOT / sft_dir(n)).exists():
        shutil.rmtree(ROOT / sft_dir(n))
    cmd = [sys.executable, "-m", "rlvr", "demo", "--tiny", *([] if n is None else ["--seed", str(n)])]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    match = LINE.search(proc.stdout)
    if proc.returncode or not match:
        sys.exit(f"seed {seed} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    boot = json.loads((ROOT / sft_dir(n) / BOOTSTRAP_FILE).read_text())
    before, after, points, secs = match.groups()
    return {"bench": "demo_seeds", "seed": seed, "bootstrap_seed": boot["seed"], "sft_steps": boot["sft_steps"],
            "bootstrap_val_acc": boot["val_score"], "heldout_before": float(before), "heldout_after": float(after),
            "points": float(points), "demo_s": int(secs), "wall_s": round(time.perf_counter() - t0, 1),
            "line": match.group(0)}


def run_dir(seed: str) -> Path:
    return ROOT / ("runs/arith-grpo" if seed == "default" else f"runs/arith-grpo-seed-{seed}")


def plot(seeds: list[str], out: Path) -> Path:
    """Held-out (and validation) accuracy vs rollout, one line per seed's GRPO run."""
    sys.path.insert(0, str(ROOT))
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from rlvr.observe import read_metrics

    fig = Figure(figsize=(6.4, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for seed in seeds:
        evals = [r for r in read_metrics(run_dir(seed)) if "eval/step" in r]
        line, = ax.plot([r["eval/step"] for r in evals], [r["eval/arith/score"] for r in evals], marker="o",
                        label=f"seed {seed}: held-out test")
        if "eval/val/score" in evals[0]:
            ax.plot([r["eval/step"] for r in evals], [r["eval/val/score"] for r in evals], ls=":",
                    color=line.get_color(), label=f"seed {seed}: validation")
    ax.set_xlabel("GRPO rollout")
    ax.set_ylabel("accuracy (greedy, 500 problems)")
    ax.set_title("make demo: GRPO from the early-stopped SFT bootstrap", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", nargs="+", default=["default", "1", "2", "3"])
    ap.add_argument("--fresh", action="store_true", help="rebuild each seed's bootstrap (timed with the demo)")
    ap.add_argument("--png", default=None, help="also plot accuracy vs rollout of the seeds' runs here")
    ap.add_argument("--plot-only", action="store_true", help="plot the runs already there; run nothing")
    args = ap.parse_args()
    for seed in [] if args.plot_only else args.seeds:
        print(json.dumps(run_seed(seed, args.fresh)), flush=True)
    if args.png:
        print(f"plot: {plot(args.seeds, Path(args.png))}")


if __name__ == "__main__":
    main()
