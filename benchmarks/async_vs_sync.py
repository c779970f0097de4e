"""Sync vs fully-async training on the demo, with a long tail of response lengths.

The demo's arithmetic task has no long tail (the SFT model answers "95<eos>" in 3 tokens), and a
tail is what async training is for (the trainer no longer waits for the slowest
response). So this benchmark adds one: a *repeat* variant of the task. A prompt ``"37+58=#k"``
asks for the answer written ``k`` times (``"9595..."``, 2k tokens); 85% of prompts are plain
(``k = 1``, written ``"37+58="``), the rest draw ``k`` uniformly in [6, 30] (12-60 tokens), so a
rollout of 16 prompts x 8 samples waits on average for ~2.4 long groups. The model learns the
format in a short SFT from the demo's SFT checkpoint (cached under ``--work``); the reward is
``exact_match`` on the whole string; held-out accuracy is greedy on 200 plain problems of the
demo's test split (what the demo measures). The demo's GRPO settings are used
(``examples/arith/grpo.yaml``) without its dynamic-sampling filter, whose extra sampling rounds
would make the comparison about the filter rather than the tail.

``--engine-process`` samples on one supervised ``rlvr serve`` process (one thread) instead of
the in-process engine, in both modes; ``--ray`` runs both modes on a local Ray cluster, the
training rank and the engine each an actor of its own (no interpreter lock shared between them).
Both runs use the same checkpoint, data, seed and budget (``--num-rollout`` rollouts of 16 x 8
samples) on the embedded engine in one process; async adds ``--async --max-staleness K
--rollout-concurrency C``. Reported per mode: wall time of the training loop, seconds per 100
trained samples, held-out accuracy after the same number of trained samples, mean staleness;
then the speed-up ratio and the 1-minute load average before and after (the machine is shared).
Ends with one JSON line.

    OMP_NUM_THREADS=1 python benchmarks/async_vs_sync.py [--num-rollout 60] [--max-staleness 1]
        [--concurrency 32] [--seed 1234] [--engine-process]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

from rlvr.runtime.configure import parse_config
from rlvr.data.arith import make_splits, write_jsonl
from rlvr.entrypoints.demo import ASSETS, prepare_assets
from rlvr.runtime.loop import run
from rlvr.entrypoints.sft import run_sft
from rlvr.observe import read_metrics

TAIL_FRACTION, TAIL_K = 0.15, (6, 30)


def tail_rows(rows: list[dict], seed: int) -> list[dict]:
    """The repeat variant: 15% of problems ask for the answer k times (k in [6, 30])."""
    rng = random.Random(seed)
    out = []
    for r in rows:
        if rng.random() < TAIL_FRACTION:
            k = rng.randint(*TAIL_K)
            out.append({"prompt": f"{r['prompt']}#{k}", "label": r["label"] * k})
        else:
            out.append(dict(r))
    return out


def prepare(work: Path, sft_steps: int) -> tuple[Path, Path, Path]:
    """(tail training data, plain held-out data, tail SFT checkpoint), built once."""
    prepare_assets(console=False)
    train, test = make_splits()  # the demo's splits (same seed)
    train_path = write_jsonl(tail_rows(train, seed=7), work / "train_tail.jsonl")
    test_path = write_jsonl(test[:200], work / "test_plain.jsonl")
    sft = work / "sft_tail"
    if not (sft / "config.json").is_file():
        cfg = parse_config(["--hf-checkpoint", str(ASSETS / "sft"), "--prompt-data", str(train_path),
                            "--rollout-batch-size", "64", "--num-rollout", str(sft_steps), "--lr", "5e-4",
                            "--adam-beta2", "0.999", "--clip-grad", "0", "--use-dynamic-batch-size",
                            "--max-tokens-per-gpu", "4096", "--rollout-max-response-len", "96",
                            "--n-samples-per-prompt", "1", "--output-dir", str(work / "sft_run")], rl=False)
        run_sft(cfg, sft, console=False)
    return train_path, test_path, sft


def train(mode: str, work: Path, data: tuple[Path, Path, Path], a: argparse.Namespace) -> dict:
    train_path, test_path, sft = data
    args = ["--config", "examples/arith/grpo.yaml", "--hf-checkpoint", str(sft), "--prompt-data", str(train_path),
            "--rm-type", "exact_match", "--rollout-max-response-len", "96", "--num-rollout", str(a.num_rollout),
            "--eval-prompt-data", "arith", str(test_path), "--eval-interval", str(a.num_rollout),
            "--save-interval", str(10**6), "--no-use-tensorboard",
            "--output-dir", str(work / f"{a.tag}{mode}"), "--seed", str(a.seed),
            # No DAPO filter: it would add resampling rounds to sync mode; the comparison is about the tail.
            "--dynamic-sampling-filter-path", "none"]
    if a.engine_process:  # the engine in a server process of its own (one thread), beside the trainer
        args += ["--use-fault-tolerance", "--rollout-num-engines", "1"]
    if a.ray:  # one training rank and one engine, each an actor (a process and a CPU bundle) of its own
        args += ["--ray", "--rollout-num-engines", "1"]
    if mode == "async":
        args += ["--async", "--max-staleness", str(a.max_staleness), "--rollout-concurrency", str(a.concurrency)]
    cfg = parse_config(args)
    t0 = time.perf_counter()
    run_dir = run(cfg, console=False)
    wall = time.perf_counter() - t0
    records = read_metrics(run_dir)
    rollouts = [r for r in records if "rollout/step" in r]
    evals = [r for r in records if "eval/step" in r]
    trained = sum(1 for line in open(run_dir / "ledger.jsonl") if json.loads(line)["trained"])
    # The training loop's time: every rollout's step time, less the final eval's.
    loop = sum(r["perf/step_time"] for r in rollouts) - sum(r.get("perf/eval_time", 0.0) for r in rollouts)
    return {
        "wall_s": round(wall, 1),
        "loop_s": round(loop, 1),
        "trained_samples": trained,
        "s_per_100_samples": round(100 * loop / trained, 3),
        "heldout_accuracy_before": round(evals[0]["eval/arith/score"], 3),
        "heldout_accuracy": round(evals[-1]["eval/arith/score"], 3),
        "train_accuracy_last5": round(sum(r["rollout/accuracy"] for r in rollouts[-5:]) / 5, 3),
        "response_len_mean": round(sum(r["rollout/response_len/mean"] for r in rollouts) / len(rollouts), 1),
        "response_len_max": max(r["rollout/response_len/max"] for r in rollouts),
        "staleness_mean": round(sum(r.get("rollout/staleness_mean", 0) for r in rollouts) / len(rollouts), 3),
        "staleness_max": max(r.get("rollout/staleness_max", 0) for r in rollouts),
        "stale_regenerated_groups": sum(r.get("rollout/stale_regenerated_groups", 0) for r in rollouts),
        "trainer_wait_s": round(sum(r.get("perf/rollout_wait_time", r.get("perf/rollout_time", 0)) for r in rollouts), 1),
        "train_s": round(sum(r.get("perf/train_time", 0) for r in rollouts), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-rollout", type=int, default=60)
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=32, help="async: prompt groups in flight")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--sft-steps", type=int, default=400)
    p.add_argument("--modes", nargs="+", default=["sync", "async"])
    p.add_argument("--work", default="runs/bench-async", help="data, SFT checkpoint (built once) and the runs")
    p.add_argument("--tag", default="", help="prefix of the runs' directories under --work")
    p.add_argument("--engine-process", action="store_true",
                   help="sample on a supervised `rlvr serve` process instead of the in-process engine")
    p.add_argument("--ray", action="store_true",
                   help="run on a local Ray cluster: the trainer and the engine in actors of their own")
    a = p.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    data = prepare(work, a.sft_steps)
    load_before = os.getloadavg()[0]
    results = {}
    for mode in a.modes:
        results[mode] = train(mode, work, data, a)
        print(mode, results[mode], flush=True)
    out = {"benchmark": "async_vs_sync", "engine": "ray" if a.ray else "process" if a.engine_process else "embedded",
           "torch_threads": torch.get_num_threads(), "num_rollout": a.num_rollout, "samples_per_rollout": 128,
           "max_staleness": a.max_staleness, "concurrency": a.concurrency, "seed": a.seed,
           "loadavg_1m_before": round(load_before, 2), "loadavg_1m_after": round(os.getloadavg()[0], 2), **results}
    if "sync" in results and "async" in results:
        out["speedup"] = round(results["sync"]["s_per_100_samples"] / results["async"]["s_per_100_samples"], 2)
        out["accuracy_diff"] = round(results["async"]["heldout_accuracy"] - results["sync"]["heldout_accuracy"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
