"""On-policy distillation vs GRPO alone on the arithmetic task: the same student, the same recipe
(``examples/arith/grpo.yaml``), with and without ``--use-opd`` from a stronger tiny teacher.

Student: the demo's SFT bootstrap (``examples/arith/assets/sft``, built on first use). Teacher:
the same tiny model SFT'd further, from the student's checkpoint, until its *validation* accuracy
reaches ``--teacher-stop-score`` (``rlvr sft --config examples/arith/sft.yaml``; built once into
``examples/arith/assets/opd-teacher``). Both arms evaluate every ``--eval-interval`` rollouts on
the held-out test split and on the validation split (greedy, 500 problems each). The OPD
coefficient is chosen among ``--coefs`` by the mean validation accuracy over the run (area under
the curve: "improves faster"); the test curves are reported for that choice only.

    python benchmarks/opd_vs_grpo.py [--rollouts 12] [--coefs 0.5 1.0] [--png docs/opd_vs_grpo.png]

Prints one JSON line (both curves, the teacher's and the student's starting accuracy) and writes
the PNG. One torch thread per run (the machine is shared); runs are deterministic given the seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "examples/arith/assets"
RUNS = ROOT / "runs/opd-vs-grpo"
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
sys.path.insert(0, str(ROOT))


def _cli(*args: str) -> None:
    _wait(_start(*args), args)


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlvr", *args], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait(proc: subprocess.Popen, args) -> None:
    out, err = proc.communicate()
    if proc.returncode:
        sys.exit(f"rlvr {' '.join(args)} failed:\n{out[-2000:]}\n{err[-4000:]}")


def teacher(stop_score: float) -> Path:
    """The stronger teacher: SFT continued from the student until validation accuracy >= stop_score."""
    out = ASSETS / "opd-teacher"
    if not (out / "config.json").is_file():
        _cli("sft", "--config", "examples/arith/sft.yaml", "--hf-checkpoint", str(ASSETS / "sft"),
             "--sft-stop-score", str(stop_score), "--output-dir", str(RUNS / "teacher-sft"), "--save", str(out))
    return out


def train_args(name: str, rollouts: int, interval: int, extra: list[str]) -> list[str]:
    return ["train", "--config", "examples/arith/grpo.yaml", "--num-rollout", str(rollouts), "--eval-interval",
            str(interval), "--save-interval", str(10**6), "--output-dir", str(RUNS / name), *extra]


def run_arms(arms: dict[str, list[str]], parallel: int) -> None:
    """Run the arms not already finished, ``parallel`` processes at a time (one thread each)."""
    todo = [args for name, args in arms.items() if not _finished(RUNS / name, int(args[args.index("--num-rollout") + 1]))]
    for i in range(0, len(todo), parallel):
        running = [(_start(*args), args) for args in todo[i : i + parallel]]
        for proc, args in running:
            _wait(proc, args)


def curve(name: str) -> dict[str, list]:
    """An arm's eval curve {step, test, val} (and its OPD reverse KL per rollout)."""
    from rlvr.observe import read_metrics

    records = read_metrics(RUNS / name)
    evals = [r for r in records if "eval/step" in r]
    out = {"step": [r["eval/step"] for r in evals], "test": [r["eval/arith/score"] for r in evals],
           "val": [r["eval/val/score"] for r in evals]}
    trains = [r for r in records if "train/opd_reverse_kl" in r]
    if trains:
        out["opd_reverse_kl"] = [round(r["train/opd_reverse_kl"], 4) for r in trains]
    return out


def _finished(out: Path, rollouts: int) -> bool:
    from rlvr.observe import read_metrics

    return (out / "metrics.jsonl").is_file() and any(r.get("eval/step") == rollouts for r in read_metrics(out))


def plot(curves: dict[str, dict], path: Path, title: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, c in curves.items():
        line, = ax.plot(c["step"], c["test"], marker="o", label=f"{label}: held-out test")
        ax.plot(c["step"], c["val"], ls=":", color=line.get_color(), label=f"{label}: validation")
    ax.set_xlabel("rollout")
    ax.set_ylabel("accuracy (greedy, 500 problems)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rollouts", type=int, default=12)
    ap.add_argument("--eval-interval", type=int, default=4)
    ap.add_argument("--coefs", type=float, nargs="+", default=[1.0])
    ap.add_argument("--teacher-stop-score", type=float, default=0.4)
    ap.add_argument("--png", default=str(ROOT / "docs/opd_vs_grpo.png"))
    ap.add_argument("--parallel", type=int, default=2, help="runs at a time, one torch thread each")
    args = ap.parse_args()
    t0 = time.perf_counter()
    from rlvr.entrypoints.demo import prepare_assets

    prepare_assets(console=False)
    grpo_args = train_args("grpo", args.rollouts, args.eval_interval, [])
    # GRPO alone needs no teacher: it runs while the teacher is trained.
    grpo_proc = None if _finished(RUNS / "grpo", args.rollouts) else _start(*grpo_args)
    teacher_dir = teacher(args.teacher_stop_score)
    opd_flags = ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(teacher_dir), "--opd-kl-coef"]
    run_arms({f"opd-{c:g}": train_args(f"opd-{c:g}", args.rollouts, args.eval_interval, [*opd_flags, str(c)])
              for c in args.coefs}, args.parallel)
    if grpo_proc is not None:
        _wait(grpo_proc, grpo_args)
    grpo, opd = curve("grpo"), {c: curve(f"opd-{c:g}") for c in args.coefs}
    chosen = max(opd, key=lambda c: sum(opd[c]["val"]) / len(opd[c]["val"]))
    teacher_eval = arm_eval(teacher_dir)
    label = f"GRPO + OPD (coef {chosen:g})"
    plot({"GRPO": grpo, label: opd[chosen]}, Path(args.png),
         f"student = SFT bootstrap; teacher = longer SFT (test {teacher_eval['test']:.3f})")
    print(json.dumps({"bench": "opd_vs_grpo", "rollouts": args.rollouts, "teacher": teacher_eval,
                      "chosen_coef_on_val": chosen,
                      "val_mean_by_coef": {f"{c:g}": round(sum(v["val"]) / len(v["val"]), 4) for c, v in opd.items()},
                      "grpo": grpo, "opd": opd[chosen], "png": str(args.png),
                      "wall_s": round(time.perf_counter() - t0, 1)}))


def arm_eval(checkpoint: Path) -> dict[str, float]:
    """Greedy test and validation accuracy of a checkpoint (``rlvr eval``)."""
    proc = subprocess.run([sys.executable, "-m", "rlvr", "eval", "--hf-checkpoint", str(checkpoint),
                           "--eval-prompt-data", "arith", str(ASSETS / "test.jsonl"), "val", str(ASSETS / "val.jsonl"),
                           "--rollout-max-response-len", "8", "--rm-type", "math"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"rlvr eval failed:\n{proc.stderr[-3000:]}")
    scores = dict(line.split() for line in proc.stdout.splitlines() if line.startswith("eval/"))
    return {"test": float(scores["eval/arith/score"]), "val": float(scores["eval/val/score"])}


if __name__ == "__main__":
    main()
