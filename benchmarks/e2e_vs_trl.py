"""rlvr vs TRL's GRPOTrainer, end to end, one GRPO configuration side by side.

Same tiny model directory (the demo's shape), the arithmetic prompts, 8 prompts x
8 samples per step, up to 32 new tokens at temperature 1, one optimizer step per rollout, no KL,
and the same reward function (rlvr's ``math`` reward; TRL calls it through ``rlvr.rewards.score``).
The model is, by default (``--start sft``), the tiny model after a short SFT on the arithmetic task
(``--sft-steps``, the start the demo's GRPO uses), so responses end at EOS after a few tokens and
vary in length as in real RL; ``--start random`` uses the random initialisation, whose responses
nearly all run to the 32-token limit (then there is little padding for either side to waste).
Each side uses its own recommended batching: rlvr ``--use-dynamic-batch-size --max-tokens-per-gpu
4096`` (packed), TRL one micro-batch of 64 (``per_device_train_batch_size 64``).

rlvr runs its real loop (``rlvr.runtime.loop.run``: rollout through the embedded engine, reward, train
step, weight sync to the engine); TRL runs ``GRPOTrainer.train``. Time per step is measured the
same way on both sides: wall time between the ends of consecutive steps (rlvr: the ``time`` of
consecutive ``rollout/step`` records; TRL: consecutive ``on_step_end`` callbacks). One-time costs
are excluded on both sides: model load and set-up, the first step (warm-up), and rlvr's final
step (it also writes the end-of-run checkpoint; TRL is run with ``save_strategy="no"``).

The sides run in separate subprocesses, alternating (rlvr, TRL, rlvr, TRL, ...), with the thread
count fixed (default 1 for both: robust on a shared machine); the median step time of each side is
reported, as wall time and as process CPU time (the latter is far less sensitive to other load).

    pip install -e ".[bench]"    # TRL, accelerate, datasets: benchmark-only
    python benchmarks/e2e_vs_trl.py [--rounds 2] [--steps 8]
    python benchmarks/e2e_vs_trl.py --model models/smollm2-135m-instruct [--steps 4] [--rounds 1]

``--model DIR`` (a real instruct checkpoint): the arithmetic questions as chat prompts (rlvr
``--apply-chat-template``; TRL conversational prompts, which it renders with the same template),
up to ``--max-new`` (default 64) new tokens, and both sides recompute activations in backward
(rlvr ``--recompute-activations``, TRL ``gradient_checkpointing``), which a 135M-parameter model's
8 x 8 rollout at 64 tokens needs to stay within a few GB (``--no-recompute``: neither side does);
TRL takes the 64 samples as 4 micro-batches of 16 (one optimizer step per rollout on both sides),
rlvr packs them under ``--max-tokens-per-gpu 8192``.
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


def run_rlvr(model: Path, data: Path, out: Path, steps: int, max_new: int, real: bool,
             recompute: bool) -> tuple[list[float], list[float]]:
    import rlvr.observe.run_files
    from rlvr.runtime.configure import parse_config
    from rlvr.runtime.loop import run

    ends: list[tuple[float, float]] = []

    class ClockedLogger(rlvr.observe.run_files.MetricsLogger):  # the loop's own logger, noting when each step ends
        def log(self, metrics, step_key, step):
            super().log(metrics, step_key, step)
            if step_key == "rollout/step":
                ends.append((time.perf_counter(), time.process_time()))

    rlvr.observe.run_files.MetricsLogger = ClockedLogger

    cfg = parse_config(["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rm-type", "math",
                        "--rollout-batch-size", str(N_PROMPTS), "--n-samples-per-prompt", str(N_SAMPLES),
                        "--rollout-max-response-len", str(max_new), "--rollout-temperature", "1.0",
                        "--lr", "1e-6", "--num-rollout", str(steps), "--use-dynamic-batch-size",
                        "--max-tokens-per-gpu", "8192" if real else "4096", "--output-dir", str(out)]
                       + (["--apply-chat-template"] if real else []) + (["--recompute-activations"] if recompute else []))
    run(cfg, console=False)
    return _deltas(ends[:-1])  # steps 1 .. n-2 (the last one also writes the final checkpoint)


def _deltas(ends: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """(wall, CPU) seconds between consecutive step ends."""
    return ([b[0] - a[0] for a, b in zip(ends, ends[1:])], [b[1] - a[1] for a, b in zip(ends, ends[1:])])


def run_trl(model: Path, data: Path, out: Path, steps: int, max_new: int, real: bool,
            recompute: bool) -> tuple[list[float], list[float]]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.core.jsonl import iter_objects
    from rlvr.rewards import score

    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}] if real else r["prompt"], "label": str(r["label"])}
            for _, r in iter_objects(data)]

    def math_reward(prompts, completions, label, **kwargs):  # conversational completions: [{"role", "content"}]
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [score("math", c, y) for c, y in zip(texts, label)]

    ends: list[tuple[float, float]] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append((time.perf_counter(), time.process_time()))

    tokenizer = AutoTokenizer.from_pretrained(model)
    micro = 16 if real else N_PROMPTS * N_SAMPLES
    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=micro,
                      gradient_accumulation_steps=N_PROMPTS * N_SAMPLES // micro, gradient_checkpointing=recompute,
                      num_generations=N_SAMPLES, max_completion_length=max_new, temperature=1.0,
                      learning_rate=1e-6, beta=0.0, max_steps=steps, logging_steps=1, save_strategy="no",
                      report_to="none", use_cpu=True, bf16=False, seed=1234, dataloader_num_workers=0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model), reward_funcs=math_reward, args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                          callbacks=[StepClock()])
    trainer.train()
    return _deltas(ends)  # steps 2 .. n


def write_chat_questions(path: Path, n: int = 512, seed: int = 0) -> Path:
    """Arithmetic questions for an instruct model ("What is a + b? Answer with just the number.")."""
    import random

    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randrange(100), rng.randrange(100)
            f.write(json.dumps({"prompt": f"What is {a} + {b}? Answer with just the number.", "label": a + b}) + "\n")
    return path


def sft_model(base: Path, data: Path, out: Path, steps: int) -> Path:
    """The base model after ``steps`` of rlvr's SFT on the arithmetic labels (made once)."""
    if (out / "config.json").is_file():
        return out
    from rlvr.runtime.configure import parse_config
    from rlvr.entrypoints.sft import run_sft

    cfg = parse_config(["--hf-checkpoint", str(base), "--prompt-data", str(data), "--rollout-batch-size", "64",
                        "--num-rollout", str(steps), "--lr", "1e-3", "--adam-beta2", "0.999", "--clip-grad", "0",
                        "--use-dynamic-batch-size", "--max-tokens-per-gpu", "2048", "--rollout-max-response-len", "8",
                        "--n-samples-per-prompt", "1", "--output-dir", str(out.with_name(out.name + "-run"))], rl=False)
    return run_sft(cfg, out, console=False)


def side(args) -> None:
    from common import set_threads

    set_threads(args.threads)
    fn = run_rlvr if args.side == "rlvr" else run_trl
    wall, cpu = fn(Path(args.side_model), Path(args.data), Path(args.out), args.steps, args.max_new, args.real,
                   args.real and not args.no_recompute)
    print("STEP_TIMES " + json.dumps({"wall": wall, "cpu": cpu}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--start", choices=["sft", "random"], default="sft")
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--side", choices=["rlvr", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help="a real instruct checkpoint (chat prompts; see above)")
    ap.add_argument("--max-new", type=int, default=None, help=f"new tokens per sample (default {MAX_NEW}; 64 with --model)")
    ap.add_argument("--no-recompute", action="store_true",
                    help="--model: neither side recomputes activations (default: both do)")
    ap.add_argument("--side-model", help=argparse.SUPPRESS)
    ap.add_argument("--real", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        return side(args)

    from common import model_dir

    from rlvr.data.arith import make_splits, write_jsonl

    root = Path(args.workdir or tempfile.mkdtemp(prefix="rlvr-e2e-"))
    from common import set_threads

    set_threads(args.threads)
    real = args.model is not None
    max_new = args.max_new or (64 if real else MAX_NEW)
    if real:
        model, data = Path(args.model).resolve(), write_chat_questions(root / "chat.jsonl")
    else:
        model = model_dir("tiny", root)
        data = write_jsonl(make_splits(n_test=200)[0], root / "train.jsonl")
    if args.start == "sft" and not real:
        model = sft_model(model, data, root / f"tiny-sft{args.sft_steps}", args.sft_steps)
    print(f"model: {model}")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    times = {name: {"wall": [], "cpu": []} for name in ("rlvr", "trl")}
    for r in range(args.rounds):
        for name in ("rlvr", "trl"):
            cmd = [sys.executable, __file__, "--side", name, "--side-model", str(model), "--data", str(data),
                   "--out", str(root / f"{name}-{r}"), "--steps", str(args.steps), "--threads", str(args.threads),
                   "--max-new", str(max_new)] + (["--real"] if real else []) + (["--no-recompute"] if args.no_recompute else [])
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = [x for x in proc.stdout.splitlines() if x.startswith("STEP_TIMES ")]
            if proc.returncode or not line:
                sys.exit(f"{name} failed:\n{proc.stderr[-4000:]}")
            got = json.loads(line[0].split(" ", 1)[1])
            for kind in ("wall", "cpu"):
                times[name][kind] += got[kind]
            print(f"round {r} {name:<4}: wall " + " ".join(f"{t:.2f}" for t in got["wall"]) + " s/step; CPU "
                  + " ".join(f"{t:.2f}" for t in got["cpu"]))
    med = {name: {k: statistics.median(v) for k, v in kinds.items()} for name, kinds in times.items()}
    for kind in ("wall", "cpu"):
        print(f"{kind:>4}: rlvr {med['rlvr'][kind]:.3f} s/step, TRL {med['trl'][kind]:.3f} s/step: "
              f"rlvr is {med['trl'][kind] / med['rlvr'][kind]:.2f}x faster")
    print(json.dumps({"bench": "e2e_vs_trl", "rlvr_s_per_step": round(med["rlvr"]["wall"], 4),
                      "trl_s_per_step": round(med["trl"]["wall"], 4),
                      "ratio": round(med["trl"]["wall"] / med["rlvr"]["wall"], 3),
                      "rlvr_cpu_s_per_step": round(med["rlvr"]["cpu"], 4), "trl_cpu_s_per_step": round(med["trl"]["cpu"], 4),
                      "cpu_ratio": round(med["trl"]["cpu"] / med["rlvr"]["cpu"], 3),
                      "recompute_activations": real and not args.no_recompute}))

if __name__ == "__main__":
    main()
