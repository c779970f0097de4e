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
    python benchmarks/train_throughput.py --model models/smollm2-135m-instruct [--threads 2]

``--model DIR`` (a real checkpoint): one trainer, GRPO rollouts of ``--prompts`` x ``--per-prompt``
chat prompts of the model's template with RL's long-tailed response lengths (``common.chat_samples``,
at most ``--max-response``), packed and padded steps alternating, and between them the machine's
float32 matmul rate at the same thread count (best of 3 square GEMMs of ``--gemm-size``). Model
FLOPs utilisation = 6 x parameters x positions the packed step computes per second / that rate,
by wall time and by process CPU time (steady when other jobs share the cores); with
``--recompute-activations`` the hardware does 8 x, the recomputed forward included.
``--silent-groups F``: the first F of the groups get one reward for every sample (no variance, so
every GRPO advantage is 0, as in ~78% of the demo's first groups); the trainer then runs forward
and backward on the other groups only, and a third variant, ``packed_no_skip``, runs every sample
(``override_trainer(skip_silent_samples=False)``) in the same rounds; the MFU counts the positions
the skipping step computes.

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
from rlvr.core.testing import override_trainer  # noqa: E402
from rlvr.train.packing import Layout, pad  # noqa: E402
from rlvr.train.trainer import Trainer  # noqa: E402


def gemm_flops(n: int, repeats: int = 3) -> tuple[float, float]:
    """The float32 matmul rate of this process's threads, best of ``repeats`` n x n x n GEMMs:
    FLOP per wall second and FLOP per CPU second (the latter holds on a shared machine)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    times = [_timed(lambda: torch.mm(a, b)) for _ in range(repeats)]
    return 2 * n**3 / min(t for t, _ in times), 2 * n**3 / min(c for _, c in times)


def _timed(fn) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def real_model(args) -> None:
    """--model DIR: packed vs padded steps of one trainer on chat rollouts, and the MFU (see above)."""
    from transformers import AutoTokenizer

    from common import chat_samples

    tok = AutoTokenizer.from_pretrained(args.model)
    samples = chat_samples(tok, args.prompts, args.per_prompt, args.max_response)
    silent = round(args.silent_groups * args.prompts) * args.per_prompt  # the first groups: every reward 0
    for s in samples[:silent]:
        s.reward = 0.0
    cfg = TrainConfig(hf_checkpoint=args.model, lr=1e-7, use_dynamic_batch_size=True, use_rollout_logprobs=True,
                      max_tokens_per_gpu=args.max_tokens_per_gpu, recompute_activations=args.recompute_activations)
    trainer = Trainer(cfg, AlgoConfig(), n_samples_per_prompt=args.per_prompt)
    n_params = sum(p.numel() for p in trainer.model.parameters())
    bins = trainer.batches.split(samples, list(range(len(samples))))
    tokens = sum(s.total_length for s in samples)
    positions = {"packed": sum(Layout().batch([samples[i] for i in b]).slots
                               for b in trainer.batches.split(samples, list(range(silent, len(samples))))),
                 "padded": sum(pad([samples[i] for i in b]).slots for b in bins)}
    print(f"{args.model}: {n_params / 1e6:.1f}M parameters; {len(samples)} samples, {tokens} tokens in {len(bins)} "
          f"micro-batches; positions computed: packed {positions['packed']}, padded {positions['padded']}")
    layouts = {"packed": (Layout(), True)} | ({} if args.packed_only else {"padded": (Layout(packed=False), True)})
    if silent:
        layouts["packed_no_skip"] = (Layout(), False)
        print(f"  {silent} of {len(samples)} samples in groups without reward variance")
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in layouts}
    rates = []
    for r in range(args.rounds + 1):  # round 0 warms up
        rates.append(gemm_flops(args.gemm_size))
        for name, (layout, skip) in layouts.items():
            trainer.policy.layout = layout
            c0 = time.process_time()
            with override_trainer(skip_silent_samples=skip):
                m = trainer.train(r, samples)
            cpu = time.process_time() - c0
            if r:
                runs[name].append((m["perf/train_time"], cpu))
            print(f"  round {r} {name}: {m['perf/train_time']:.1f} s ({cpu:.1f} s CPU), {tokens / m['perf/train_time']:.0f} "
                  f"tok/s; matmul {rates[-1][0] / 1e9:.1f} GFLOP/s ({rates[-1][1] / 1e9:.1f} per CPU-s)"
                  f"{'  (warm-up)' if r == 0 else ''}", flush=True)
    rate = statistics.median(x[0] for x in rates[1:])
    cpu_rate = statistics.median(x[1] for x in rates[1:])
    wall = {k: statistics.median(t for t, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    flops = 6 * n_params * positions["packed"]
    mfu, cpu_mfu = flops / wall["packed"] / rate, flops / cpu["packed"] / cpu_rate
    row = {"bench": "train_throughput_real", "model": Path(args.model).name, "params": n_params, "tokens": tokens,
           "positions_packed": positions["packed"], "positions_padded": positions["padded"], "threads": args.threads,
           "max_tokens_per_gpu": args.max_tokens_per_gpu, "recompute_activations": args.recompute_activations,
           "packed_tok_s": round(tokens / wall["packed"], 1),
           "padded_tok_s": round(tokens / wall["padded"], 1) if "padded" in wall else None,
           "ratio": round(wall["padded"] / wall["packed"], 3) if "padded" in wall else None,
           "cpu_ratio": round(cpu["padded"] / cpu["packed"], 3) if "padded" in wall else None,
           "packed_s": round(wall["packed"], 2), "packed_cpu_s": round(cpu["packed"], 2),
           "matmul_gflop_s": round(rate / 1e9, 1), "matmul_gflop_per_cpu_s": round(cpu_rate / 1e9, 1),
           "mfu": round(mfu, 3), "mfu_cpu_time": round(cpu_mfu, 3), "silent_samples": silent}
    if silent:
        row |= {"no_skip_s": round(wall["packed_no_skip"], 2), "no_skip_cpu_s": round(cpu["packed_no_skip"], 2),
                "skip_speedup": round(wall["packed_no_skip"] / wall["packed"], 3),
                "skip_speedup_cpu": round(cpu["packed_no_skip"] / cpu["packed"], 3)}
        print(f"skipping {silent} silent samples: {row['skip_speedup']}x by wall time, {row['skip_speedup_cpu']}x by "
              f"CPU time ({row['packed_s']} vs {row['no_skip_s']} s)")
    vs = "" if args.packed_only else f" vs padded {row['padded_tok_s']} tok/s: {row['ratio']}x (CPU {row['cpu_ratio']}x)"
    print(f"packed {row['packed_tok_s']:.0f} tok/s{vs}; matmul {row['matmul_gflop_s']} GFLOP/s "
          f"({row['matmul_gflop_per_cpu_s']} per CPU-s); MFU {mfu:.1%} by wall time, {cpu_mfu:.1%} by CPU time")
    print(json.dumps(row))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["tiny", "20m"])
    ap.add_argument("--rounds", type=int, default=3)
    # defaults: toy models 2 x 8 x <= 1024 tokens, cap 4096; --model 8 x 8 x <= 64 (the demo's shape), cap 1024
    # (a padded micro-batch at the demo's 8192 would hold ~7,000 positions, ~10 GB of activations on SmolLM2)
    ap.add_argument("--prompts", type=int, default=None)
    ap.add_argument("--per-prompt", type=int, default=8)
    ap.add_argument("--max-response", type=int, default=None)
    ap.add_argument("--max-tokens-per-gpu", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--model", help="a real HF checkpoint (see above)")
    ap.add_argument("--gemm-size", type=int, default=2048)
    ap.add_argument("--recompute-activations", action="store_true")
    ap.add_argument("--packed-only", action="store_true", help="--model: no padded steps (the MFU alone)")
    ap.add_argument("--silent-groups", type=float, default=0.0,
                    help="--model: fraction of the groups whose rewards are all equal (advantage 0; see above)")
    args = ap.parse_args()
    set_threads(args.threads)
    real = args.model is not None
    args.prompts = args.prompts or (8 if real else 2)
    args.max_response = args.max_response or (64 if real else 1024)
    args.max_tokens_per_gpu = args.max_tokens_per_gpu or (1024 if real else 4096)
    if real:
        return real_model(args)
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
        bins = trainers["packed"].batches.split(samples, list(range(len(samples))))
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
