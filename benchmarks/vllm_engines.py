"""Rollout engines side by side on SmolLM2: rlvr's embedded engine, vLLM in process
(``--rollout-engine vllm``) and Hugging Face ``model.generate``, same work, one process.

Workload (identical on every side): ``--prompts`` chat arithmetic questions (SmolLM2's chat
template, 46-48 prompt tokens) x 8 samples, temperature 1.0, no top-p/top-k; every sample has its
own length budget from a heavy-tailed log-normal (median ``--median-len``, clipped to
[4, ``--max-len``], fixed seed) and EOS is ignored, so each side produces exactly the same number
of tokens (``rollout_throughput.py``'s law). The engines get all requests in one call; HF gets one
``generate`` call per ``--hf-prompts-per-call`` prompts with ``num_return_sequences=8``, run to
the call's longest budget and cut to each row's.

Tokens/s counts the budgets' sum; CPU time is this process's (every thread, vLLM's included:
it runs in process). After timing, the train/inference gap of each engine on the samples it drew:
the trainer's own function (``rlvr.train.logprobs.response_log_probs``, float32) recomputes each
sampled token's log-prob, and the gap is mean and max |log p - log q| per token and the k3 estimate
of KL(q || p) (what ``train/train_rollout_logprob_abs_diff`` and ``train/train_rollout_kl`` log).
Ends with one JSON line. Needs vLLM (run it with .venv-vllm/bin/python: ``make vllm``).

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm_engines.py --model models/smollm2-135m-instruct [--threads 1]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.core.types import Sample
from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.local.embedded import EmbeddedEngine
from rlvr.train.logprobs import response_log_probs
from rlvr.train.trainer import load_policy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import chat_prompts, chat_workload_parser  # noqa: E402
from rollout_throughput import N_SAMPLES, budgets, run_hf  # noqa: E402


def timed(engine, prompts: list[list[int]], lens: list[int]) -> tuple[float, float, list]:
    """(wall s, CPU s, results) of one call with every request."""
    reqs = [GenerateRequest(prompts[i // N_SAMPLES], SamplingParams(temperature=1.0, max_new_tokens=n), rid=str(i))
            for i, n in enumerate(lens)]
    t0, c0 = time.perf_counter(), time.process_time()
    out = engine.generate_sync(reqs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert [len(r.token_ids) for r in out] == lens, "the engine did not produce the requested lengths"
    return wall, cpu, out


def gap(model, prompts: list[list[int]], results: list) -> dict[str, float]:
    """The trainer's recomputed log-probs against the engine's, over every sampled token."""
    samples = [Sample("", prompts[i // N_SAMPLES], response_ids=r.token_ids) for i, r in enumerate(results)]
    diffs = []
    with torch.no_grad():
        for start in range(0, len(samples), 16):
            chunk = samples[start:start + 16]
            width = max(s.response_length for s in chunk)
            p, _ = response_log_probs(model, chunk, 1.0, width, False)
            for s, r, row in zip(chunk, results[start:start + 16], p):
                diffs.append(row[: s.response_length] - torch.tensor(r.log_probs))  # log p - log q
    d = torch.cat(diffs)
    return {"gap_mean_abs": float(d.abs().mean()), "gap_max_abs": float(d.abs().max()),
            "kl_k3": float((torch.expm1(d) - d).mean()), "tokens": d.numel()}


def main() -> None:
    p = chat_workload_parser(__doc__.split("\n")[0])
    p.add_argument("--hf-prompts-per-call", type=int, default=16)
    p.add_argument("--skip-hf", action="store_true")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    torch.set_num_threads(args.threads)
    from rlvr.engine.local.vllm import VllmEngine

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    policy = load_policy(args.model, bf16=False)  # as the trainer loads it (packed-sequence attention)
    prompts = chat_prompts(tok, args.prompts)
    lens = budgets(len(prompts) * N_SAMPLES, args.median_len, args.max_len)
    tokens = sum(lens)
    print(f"{Path(args.model).name}: {len(lens)} samples, {tokens} tokens, lengths mean {tokens / len(lens):.1f} "
          f"max {max(lens)}; {args.threads} thread(s)")
    t0 = time.perf_counter()
    engines = {"embedded": EmbeddedEngine(args.model, pad_token_id=tok.pad_token_id, seed=0, max_batch_size=512)}
    start = {"embedded": time.perf_counter() - t0}
    t0 = time.perf_counter()
    engines["vllm"] = VllmEngine(args.model, seed=0, max_running_requests=256, kv_cache_gb=1.0)
    start["vllm"] = time.perf_counter() - t0
    row: dict = {"bench": "vllm_engines", "model": Path(args.model).name, "threads": args.threads,
                 "samples": len(lens), "tokens": tokens}
    for name, engine in engines.items():
        timed(engine, prompts[:2], lens[:16])  # warm-up
        wall, cpu, results = timed(engine, prompts, lens)
        row[name] = {"tok_s": round(tokens / wall, 1), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                     "startup_s": round(start[name], 1), **gap(policy, prompts, results)}
        print(f"  {name:>8}: {tokens / wall:6.1f} tok/s  wall {wall:7.2f} s  cpu {cpu:7.2f} s  "
              f"gap mean {row[name]['gap_mean_abs']:.2e} max {row[name]['gap_max_abs']:.2e} kl {row[name]['kl_k3']:.2e}")
        engine.close()
    if not args.skip_hf:
        run_hf(model, tok, prompts[:2], lens[:16], 2)  # warm-up
        with torch.no_grad():
            wall, n, cpu = run_hf(model, tok, prompts, lens, args.hf_prompts_per_call)
        row["hf_generate"] = {"tok_s": round(n / wall, 1), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                              "setup": f"{args.hf_prompts_per_call} prompts x {N_SAMPLES} per call"}
        print(f"  hf_generate: {n / wall:6.1f} tok/s  wall {wall:7.2f} s  cpu {cpu:7.2f} s")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
