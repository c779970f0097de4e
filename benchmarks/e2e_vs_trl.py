"""rlvr vs TRL's GRPOTrainer, end to end, one GRPO configuration side by side.

Same tiny model directory (the demo's shape, random weights), the arithmetic prompts, 8 prompts x
8 samples per step, up to 32 new tokens at temperature 1, one optimizer step per rollout, no KL,
and the same reward function (rlvr's ``math`` reward; TRL calls it through ``rlvr.rewards.score``).
Each side uses its own recommended batching: rlvr ``--use-dynamic-batch-size --max-tokens-per-gpu
4096`` (packed), TRL one micro-batch of 64 (``per_device_train_batch_size 64``).

rlvr runs its real loop (``rlvr.loop.run``: rollout through the embedded engine, reward, train
step, weight sync to the engine); TRL runs ``GRPOTrainer.train``. Time per step is measured the
same way on both sides: wall time between the ends of consecutive steps (rlvr: the ``time`` of
consecutive ``rollout/step`` records; TRL: consecutive ``on_step_end`` callbacks). One-time costs
are excluded on both sides: model load and set-up, the first step (warm-up), and rlvr's final
step (it also writes the end-of-run checkpoint; TRL is run with ``save_strategy="no"``).

The sides run in separate subprocesses, alternating (rlvr, TRL, rlvr, TRL, ...), with the thread
count fixed; the median step time of each side is reported.

    pip install -e ".[bench]"    # TRL, accelerate, datasets: benchmark-only
    python benchmarks/e2e_vs_trl.py [--rounds 2] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

N_PROMPTS, N_SAMPLES, MAX_NEW = 8, 8, 32


def run_rlvr(model: Path, data: Path, out: Path, steps: int) -> list[float]:
    from rlvr.config import parse_config
    from rlvr.loop import run
    from rlvr.observe.metrics import read_metrics

    cfg = parse_config(["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rm-type", "math",
                        "--rollout-batch-size", str(N_PROMPTS), "--n-samples-per-prompt", str(N_SAMPLES),
                        "--rollout-max-response-len", str(MAX_NEW), "--rollout-temperature", "1.0",
                        "--lr", "1e-6", "--num-rollout", str(steps), "--use-dynamic-batch-size",
                        "--max-tokens-per-gpu", "4096", "--output-dir", str(out)])
    run(cfg, console=False)
    ends = [r["time"] for r in read_metrics(out) if "rollout/step" in r]
    return [b - a for a, b in zip(ends[:-2], ends[1:-1])]  # steps 1 .. n-2


def run_trl(model: Path, data: Path, out: Path, steps: int) -> list[float]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.jsonl import iter_objects
    from rlvr.rewards import score

    rows = [{"prompt": r["prompt"], "label": str(r["label"])} for _, r in iter_objects(data)]

    def math_reward(prompts, completions, label, **kwargs):
        return [score("math", c, y) for c, y in zip(completions, label)]

    ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

    tokenizer = AutoTokenizer.from_pretrained(model)
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=N_PROMPTS * N_SAMPLES,
                      num_generations=N_SAMPLES, max_completion_length=MAX_NEW, temperature=1.0,
                      learning_rate=1e-6, beta=0.0, max_steps=steps, logging_steps=1, save_strategy="no",
                      report_to="none", use_cpu=True, bf16=False, seed=1234, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model), reward_funcs=math_reward, args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                          callbacks=[StepClock()])
    trainer.train()
    return [b - a for a, b in zip(ends[:-1], ends[1:])]  # steps 2 .. n


def side(args) -> None:
    from common import set_threads

    set_threads(args.threads)
    fn = run_rlvr if args.side == "rlvr" else run_trl
    times = fn(Path(args.model), Path(args.data), Path(args.out), args.steps)
    print("STEP_TIMES " + json.dumps(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--side", choices=["rlvr", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        return side(args)

    from common import model_dir

    from rlvr.data.arith import make_splits, write_jsonl

    root = Path(args.workdir or tempfile.mkdtemp(prefix="rlvr-e2e-"))
    model = model_dir("tiny", root)
    data = write_jsonl(make_splits(n_test=200)[0], root / "train.jsonl")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    times: dict[str, list[float]] = {"rlvr": [], "trl": []}
    for r in range(args.rounds):
        for name in ("rlvr", "trl"):
            cmd = [sys.executable, __file__, "--side", name, "--model", str(model), "--data", str(data),
                   "--out", str(root / f"{name}-{r}"), "--steps", str(args.steps), "--threads", str(args.threads)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = [x for x in proc.stdout.splitlines() if x.startswith("STEP_TIMES ")]
            if proc.returncode or not line:
                sys.exit(f"{name} failed:\n{proc.stderr[-4000:]}")
            step_times = json.loads(line[0].split(" ", 1)[1])
            times[name] += step_times
            print(f"round {r} {name:<4}: " + " ".join(f"{t:.2f}" for t in step_times) + " s/step")
    rlvr_s, trl_s = statistics.median(times["rlvr"]), statistics.median(times["trl"])
    print(f"rlvr {rlvr_s:.3f} s/step, TRL {trl_s:.3f} s/step: rlvr is {trl_s / rlvr_s:.2f}x faster")
    print(json.dumps({"bench": "e2e_vs_trl", "rlvr_s_per_step": round(rlvr_s, 4), "trl_s_per_step": round(trl_s, 4),
                      "ratio": round(trl_s / rlvr_s, 3)}))


if __name__ == "__main__":
    main()
