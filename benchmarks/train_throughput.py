"""Training throughput, packed vs padded micro-batches, on a realistic RL length distribution.

One training step = the trainer's real ``Trainer.train`` on a GRPO rollout with
``--use-rollout-logprobs`` and no KL (so exactly forward + backward + optimizer step per global
batch; no p0 or reference forward): micro-batches from ``--use-dynamic-batch-size
--max-tokens-per-gpu 4096`` (first-fit count, KK balance), the *same* micro-batches either packed
(one row, no padding, attention within samples, a group's shared prompt computed once), packed
without prompt sharing, or right-padded to their longest sample (the first trainer's layout, what
HF-style trainers do). Tokens/s counts every sample's prompt + response tokens (a shared prompt
counts once per sample), the same count for every layout.

Each layout has its own trainer (``Trainer(layout=...)``, the same initial weights); the layouts
alternate (packed, padded, packed, ...) in one process, with the thread count
fixed (default 1: on a shared machine one thread per process avoids OpenMP barrier stalls; use
``--threads 2`` on a quiet one), and the median of the rounds is reported; the first step of each
is a warm-up.

    python benchmarks/train_throughput.py [--models tiny 20m] [--rounds 3]

Ends with one JSON line per model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import model_dir, rl_samples, set_threads  # noqa: E402

from rlvr.algo import AlgoConfig  # noqa: E402
from rlvr.config import TrainConfig  # noqa: E402
from rlvr.train.packing import Layout, pad  # noqa: E402
from rlvr.train.trainer import Trainer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["tiny", "20m"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--per-prompt", type=int, default=8)
    ap.add_argument("--max-response", type=int, default=1024)
    ap.add_argument("--max-tokens-per-gpu", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    set_threads(args.threads)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="rlvr-bench-"))
    samples = rl_samples(args.prompts, args.per_prompt, args.max_response)
    lengths = [s.total_length for s in samples]
    print(f"{len(samples)} samples, {sum(lengths)} tokens, lengths {min(lengths)}..{max(lengths)} "
          f"(median {statistics.median(lengths):.0f}); --max-tokens-per-gpu {args.max_tokens_per_gpu}")
    results = []
    for name in args.models:
        ckpt = model_dir(name, root)
        cfg = TrainConfig(hf_checkpoint=str(ckpt), lr=1e-5, use_dynamic_batch_size=True,
                          max_tokens_per_gpu=args.max_tokens_per_gpu, use_rollout_logprobs=True)
        layouts = {"packed": Layout(), "padded": Layout(packed=False),
                   "packed_no_prompt_sharing": Layout(share_prompts=False)}
        trainers = {k: Trainer(cfg, AlgoConfig(), n_samples_per_prompt=args.per_prompt, layout=v)
                    for k, v in layouts.items()}
        n_params = sum(p.numel() for p in trainers["packed"].model.parameters())
        bins = trainers["packed"]._micro_batches(samples, list(range(len(samples))))
        slots = sum(pad([samples[i] for i in b]).slots for b in bins)
        print(f"\n[{name}] {n_params / 1e6:.1f}M parameters; {len(bins)} micro-batches; padded layout computes "
              f"{slots} positions for {sum(lengths)} tokens ({slots / sum(lengths):.2f}x)")
        speeds: dict[str, list[float]] = {k: [] for k in layouts}
        cpu_speeds: dict[str, list[float]] = {k: [] for k in layouts}
        for r in range(args.rounds + 1):  # round 0 warms up every layout
            for layout in layouts:
                c0 = time.process_time()
                m = trainers[layout].train(r, samples)
                cpu_tok_s = sum(lengths) / (time.process_time() - c0)
                if r:
                    speeds[layout].append(m["perf/train_tokens_per_s"])
                    cpu_speeds[layout].append(cpu_tok_s)
                print(f"  round {r} {layout:<6} {m['perf/train_tokens_per_s']:8.0f} tok/s ({m['perf/train_time']:.2f} s wall; "
                      f"{cpu_tok_s:.0f} tok per CPU-s){'  (warm-up)' if r == 0 else ''}")
        med = {k: statistics.median(v) for k, v in speeds.items()}
        cpu_med = {k: statistics.median(v) for k, v in cpu_speeds.items()}
        packed, padded, unshared = med["packed"], med["padded"], med["packed_no_prompt_sharing"]
        cpu_ratio = cpu_med["packed"] / cpu_med["padded"]
        print(f"[{name}] packed {packed:.0f} tok/s, padded {padded:.0f} tok/s: {packed / padded:.2f}x "
              f"(per CPU-second: {cpu_ratio:.2f}x); packed without prompt sharing {unshared:.0f} tok/s: "
              f"{unshared / padded:.2f}x (per CPU-second: {cpu_med['packed_no_prompt_sharing'] / cpu_med['padded']:.2f}x)")
        results.append({"bench": "train_throughput", "model": f"{name} ({n_params / 1e6:.1f}M)",
                        "packed_tok_s": round(packed, 1), "padded_tok_s": round(padded, 1),
                        "ratio": round(packed / padded, 3), "cpu_ratio": round(cpu_ratio, 3),
                        "packed_no_prompt_sharing_tok_s": round(unshared, 1),
                        "no_prompt_sharing_ratio": round(unshared / padded, 3)})
    for row in results:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
