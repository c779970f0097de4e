"""Rollout throughput: the embedded engine vs Hugging Face ``model.generate``, same work.

Workload (identical on both sides): 64 arithmetic prompts x 8 samples, temperature 1.0, no
top-p/top-k, on a tiny Qwen2 built like the demo's (hidden 256, 4 layers) and a ~20M-parameter
Qwen2 built the same way (hidden 512, 6 layers). Response lengths vary widely, as in real RL:
every sample gets its own length budget drawn from a heavy-tailed log-normal (median
``--median-len`` tokens, sigma 1, clipped to [4, ``--max-len``]) with a fixed seed, and stop
tokens are off, so both sides produce exactly the same number of tokens per sample and only the
lengths' spread matters. (A randomly initialised model would rarely emit EOS, and a trained one
would make the two sides' lengths differ by chance; fixed budgets keep the comparison exact.)

- rlvr: one ``generate_sync`` call with all 512 requests (per-request ``max_new_tokens``) on an
  ``EmbeddedEngine`` with ``--max-batch-size`` rows.
- HF: its best reasonable setup: one ``generate`` call per batch of prompts with
  ``num_return_sequences=8``, ``max_new_tokens`` = the batch's largest budget (a batch runs until
  its longest row is done, which is what ``generate`` does when rows stop at different times);
  each row is then cut to its own budget. ``--hf-prompts-per-call`` sets the batch: by default
  both 8 prompts (64 rows) and all 64 (512 rows) are timed and the faster counts (which one wins
  depends on the model: 64 rows on the tiny one, 512 on the 19M one in our runs).

``--deterministic-mode`` adds a third side, ``rlvr-det``: the same engine and requests with
``deterministic=True`` (the call cut into packs of at most ``--max-batch-size`` rows, each decoded
in forwards of its own: a fixed schedule, see ``rlvr.engine.local.embedded``), and reports its cost
against ``rlvr`` in wall and CPU time.
``--skip-hf`` leaves Hugging Face out (the cost of the mode alone, in seconds instead of minutes).

Tokens/s counts the same useful tokens on both sides (the sum of the budgets). The sides are
alternated ``--repeats`` times in one process with ``torch.set_num_threads(--threads)``, and the
best time of each side is used. Ends with one JSON line per model. The 19M model's HF runs take
several minutes each on 2 cores.

    python benchmarks/rollout_throughput.py [--repeats 2] [--threads 2] [--models ...] [--deterministic-mode --skip-hf]
    python benchmarks/rollout_throughput.py --model models/smollm2-135m-instruct [--prompts 16] [--threads 1]

``--model DIR``: a real checkpoint instead of the built models, on ``--prompts`` arithmetic
questions rendered with its chat template (``common.chat_prompts``), the same budgets' law.
"""

from __future__ import annotations

import argparse
import json
import sys
import math
import random
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.data.arith import make_splits
from rlvr.entrypoints.demo import TINY_MODEL
from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.local.embedded import EmbeddedEngine
from rlvr.models.tiny import build_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import chat_prompts  # noqa: E402

MODELS = {
    "tiny-qwen2-h256-l4": TINY_MODEL,
    "qwen2-20m-h512-l6": dict(hidden_size=512, intermediate_size=1536, num_layers=6, num_heads=8, num_kv_heads=4),
}
N_PROMPTS, N_SAMPLES = 64, 8


def budgets(n: int, median: int, max_len: int, seed: int = 0) -> list[int]:
    """Heavy-tailed response lengths: log-normal(log median, 1), clipped to [4, max_len]."""
    rng = random.Random(seed)
    return [min(max_len, max(4, round(math.exp(rng.gauss(math.log(median), 1.0))))) for _ in range(n)]


def run_rlvr(engine: EmbeddedEngine, prompts: list[list[int]], lens: list[int]) -> tuple[float, int, float]:
    """(wall seconds, tokens, CPU seconds of this process) for all requests in one call."""
    reqs = [
        GenerateRequest(prompts[i // N_SAMPLES], SamplingParams(temperature=1.0, max_new_tokens=lens[i]), rid=str(i))
        for i in range(len(lens))
    ]
    t0, c0 = time.perf_counter(), time.process_time()
    out = engine.generate_sync(reqs)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert [len(r.token_ids) for r in out] == lens, "engine did not produce the requested lengths"
    return elapsed, sum(lens), cpu


def run_hf(model, tok, prompts: list[list[int]], lens: list[int], prompts_per_call: int) -> tuple[float, int, float]:
    """(wall seconds, tokens asked for, CPU seconds of this process)."""
    useful = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for start in range(0, len(prompts), prompts_per_call):
        chunk = prompts[start : start + prompts_per_call]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in chunk])
        mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in chunk]).unsqueeze(1)).long()
        row_lens = lens[start * N_SAMPLES : (start + len(chunk)) * N_SAMPLES]
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            num_return_sequences=N_SAMPLES, max_new_tokens=max(row_lens), min_new_tokens=max(row_lens),
            eos_token_id=None, pad_token_id=tok.pad_token_id,
        )
        assert out.shape[1] - width == max(row_lens)
        useful += sum(row_lens)  # each row cut to its own budget
    return time.perf_counter() - t0, useful, time.process_time() - c0


def bench(name: str, path: Path, args) -> dict:
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    n_params = sum(p.numel() for p in model.parameters())
    if args.model:
        prompts = chat_prompts(tok, args.prompts)
    else:
        train, _ = make_splits()
        prompts = [tok(p["prompt"], add_special_tokens=False)["input_ids"] for p in train[:args.prompts]]
    lens = budgets(len(prompts) * N_SAMPLES, args.median_len, args.max_len)
    engines = {"rlvr": EmbeddedEngine(model, pad_token_id=tok.pad_token_id, seed=0, max_batch_size=args.max_batch_size)}
    if args.deterministic_mode:
        engines["rlvr-det"] = EmbeddedEngine(model, pad_token_id=tok.pad_token_id, seed=0,
                                             max_batch_size=args.max_batch_size, deterministic=True)
    print(f"\n{name}: {n_params / 1e6:.1f}M params; {len(lens)} samples, lengths mean {sum(lens) / len(lens):.1f} "
          f"min {min(lens)} max {max(lens)}")
    for engine in engines.values():  # warm-up every side
        run_rlvr(engine, prompts[:2], lens[:16])
    if not args.skip_hf:
        run_hf(model, tok, prompts[:2], lens[:16], 2)
    sides = list(engines) + ([] if args.skip_hf else [f"hf{k}" for k in args.hf_prompts_per_call])
    best, cpu = {side: math.inf for side in sides}, {}
    tokens = sum(lens)
    with torch.no_grad():
        for rep in range(args.repeats):
            for side in sides if rep % 2 == 0 else sides[::-1]:
                if side in engines:
                    t, n, c = run_rlvr(engines[side], prompts, lens)
                else:
                    t, n, c = run_hf(model, tok, prompts, lens, int(side[2:]))
                cpu[side] = min(cpu.get(side, math.inf), c)
                assert n == tokens
                best[side] = min(best[side], t)
                print(f"  {side:>8} run {rep}: {t:7.2f} s  {n / t:8.0f} tok/s  cpu {c:6.2f} s")
    for engine in engines.values():
        engine.close()
    row = {"bench": "rollout_throughput", "model": name, "params_m": round(n_params / 1e6, 1),
           "rlvr_tok_s": round(tokens / best["rlvr"], 1), "rlvr_cpu_s": round(cpu["rlvr"], 2)}
    if not args.skip_hf:
        hf_side = min(sides[len(engines):], key=best.get)
        row |= {"hf_tok_s": round(tokens / best[hf_side], 1), "hf_cpu_s": round(cpu[hf_side], 2),
                "hf_setup": f"{hf_side[2:]} prompts x {N_SAMPLES} per generate call",
                "ratio": round(best[hf_side] / best["rlvr"], 2)}
        print(f"  rlvr {row['rlvr_tok_s']:.0f} tok/s vs HF generate {row['hf_tok_s']:.0f} tok/s "
              f"({row['hf_setup']}): {row['ratio']:.2f}x")
    if args.deterministic_mode:
        row |= {"det_tok_s": round(tokens / best["rlvr-det"], 1), "det_cpu_s": round(cpu["rlvr-det"], 2),
                "det_wall_cost": round(best["rlvr-det"] / best["rlvr"], 2),
                "det_cpu_cost": round(cpu["rlvr-det"] / cpu["rlvr"], 2)}
        print(f"  deterministic mode: {row['det_tok_s']:.0f} tok/s vs {row['rlvr_tok_s']:.0f}: "
              f"{row['det_wall_cost']:.2f}x the wall time, {row['det_cpu_cost']:.2f}x the CPU time")
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--median-len", type=int, default=24)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--max-batch-size", type=int, default=512)
    p.add_argument("--hf-prompts-per-call", type=int, nargs="+", default=[8, 64])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--deterministic-mode", action="store_true", help="also time the engine's deterministic mode")
    p.add_argument("--skip-hf", action="store_true", help="time rlvr's engine only")
    p.add_argument("--model", help="a real HF checkpoint instead of --models (chat prompts)")
    p.add_argument("--prompts", type=int, default=None, help=f"default {N_PROMPTS}; 16 with --model")
    args = p.parse_args()
    args.prompts = args.prompts or (16 if args.model else N_PROMPTS)
    torch.set_num_threads(args.threads)
    rows = []
    if args.model:
        rows.append(bench(Path(args.model).name, Path(args.model), args))
        args.models = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            path = build_tiny_model(Path(tmp) / name, arch="qwen2", **MODELS[name])
            rows.append(bench(name, path, args))
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
