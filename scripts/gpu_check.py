"""The GPU check: one command, one GPU, a few minutes, JSON lines out.

    python scripts/gpu_check.py [--skip-demo] [--demo-timeout 200] [--out gpu_check.jsonl]

Runs on a bare CUDA machine with PyTorch, transformers and their usual dependencies and no network
(what else the project needs travels as wheels: ``make gpu-wheels``, then ``pip install --no-index
--find-links .gpu-wheels math-verify`` there). Steps, each printing one JSON line (``{"check": ...}``)
and each contained (a failure is reported and the next step runs):

1. ``pytest -m gpu tests/test_gpu.py``: packed vs alone and gradient invariance on CUDA (bf16/fp32 tolerances
   stated in tests/test_gpu.py), engine vs trainer log-probs, the local loop on CUDA colocated.
2. The arithmetic demo with ``--device cuda`` (bootstrap SFT and GRPO on the GPU), under a time cap.
3. Benchmarks on a Qwen2.5-0.5B-shaped random model built here (its layer sizes: hidden 896,
   24 layers, 14 heads, 2 KV heads, MLP 4864; the project's byte-level tokenizer, so the
   vocabulary and embeddings are small), in bfloat16:
   * rollout: the embedded engine vs Hugging Face ``generate`` on benchmarks/rollout_throughput.py's
     long-tail workload (64 prompts x n=8, heavy-tailed per-sample budgets, no stop tokens);
   * training: tokens/s and model FLOPs utilisation (6 x parameters x tokens / s over the GPU's
     dense bf16 peak, ``--peak-tflops``) of packed micro-batches, one optimizer step per rollout;
   * peak memory per phase of one colocated rollout -> train -> weight push cycle;
   * trainer vs engine log-prob difference in bf16 (mean and max |diff| over the sampled tokens),
     with the TIS weights the difference implies (mean, and the share clipped at --tis-clip 2).

``--smoke-cpu`` runs step 3's code on CPU with a small model (no GPU numbers): ``make test`` runs
it (tests/test_gpu_check.py), so the script cannot break unnoticed between GPU sessions.

Nothing here has run on a GPU yet (docs/scaling.md); the numbers go there once it has.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2,
                  max_position_embeddings=2048)
N_PROMPTS, N_SAMPLES = 64, 8  # benchmarks/rollout_throughput.py's workload
MAX_LEN = 256  # the longest response budget of that workload
RESULTS: list[dict] = []
DEVICE = "cuda"  # --smoke-cpu: the same code on CPU with a small model (a check of this script, not of a GPU)


def sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def emit(row: dict, out: Path | None) -> None:
    RESULTS.append(row)
    line = json.dumps(row)
    print(line, flush=True)
    if out is not None:
        with out.open("a") as f:
            f.write(line + "\n")


def contained(name: str, fn, out: Path | None, *args) -> None:
    """Run one check; its failure becomes a JSON line, not the end of the script."""
    t0 = time.perf_counter()
    try:
        row = fn(*args)
        emit({"check": name, "ok": True, **row, "seconds": round(time.perf_counter() - t0, 1)}, out)
    except Exception as e:  # contained: report and go on to the next check
        traceback.print_exc()
        emit({"check": name, "ok": False, "error": repr(e)[:500], "seconds": round(time.perf_counter() - t0, 1)}, out)


# ---- 1 and 2: tests and the demo, as subprocesses ------------------------------------------------
def gpu_tests(timeout: int) -> dict:
    # Only the file with gpu-marked tests: collecting the whole suite would import modules that need
    # what the bare machine lacks (ray, datasets, ...) even though -m gpu deselects them.
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "-q", "-p",
                           "no:cacheprovider", "-o", "addopts="], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-2000:], file=sys.stderr)
        raise RuntimeError(f"pytest -m gpu exited {proc.returncode}: {tail}")
    return {"summary": tail}


def demo(timeout: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "rlvr", "demo", "--tiny", "--device", "cuda"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("demo:")]
    if proc.returncode != 0 or not lines:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        raise RuntimeError(f"rlvr demo --tiny --device cuda exited {proc.returncode}")
    return {"result": lines[-1]}


# ---- 3: benchmarks on the 0.5B-shaped model ----------------------------------------------------
def budgets(n: int, median: int = 24, max_len: int = 256, seed: int = 0) -> list[int]:
    """benchmarks/rollout_throughput.py's heavy-tailed lengths: log-normal(log median, 1) in [4, max_len]."""
    rng = random.Random(seed)
    return [min(max_len, max(4, round(math.exp(rng.gauss(math.log(median), 1.0))))) for _ in range(n)]


def arith_prompts(tok) -> list[list[int]]:
    from rlvr.data.arith import make_splits

    train, _ = make_splits()
    return [tok(p["prompt"], add_special_tokens=False)["input_ids"] for p in train[:N_PROMPTS]]


def rollout_bench(ckpt: str) -> dict:
    import torch
    from transformers import AutoTokenizer

    from rlvr.engine.base import GenerateRequest, SamplingParams
    from rlvr.engine.local.embedded import EmbeddedEngine
    from rlvr.train.trainer import load_policy

    tok = AutoTokenizer.from_pretrained(ckpt)
    model = load_policy(ckpt, bf16=True, device=DEVICE)
    prompts, lens = arith_prompts(tok), budgets(N_PROMPTS * N_SAMPLES, max_len=MAX_LEN)
    engine = EmbeddedEngine(model, pad_token_id=tok.pad_token_id, seed=0, max_batch_size=512)

    def run_engine() -> float:
        reqs = [GenerateRequest(prompts[i // N_SAMPLES], SamplingParams(temperature=1.0, max_new_tokens=lens[i],
                                                                         stop_token_ids=()), rid=str(i))
                for i in range(len(lens))]
        sync()
        t0 = time.perf_counter()
        out = engine.generate_sync(reqs)
        assert [len(r.token_ids) for r in out] == lens, "the engine did not produce the requested lengths"
        return time.perf_counter() - t0

    def run_hf(per_call: int) -> float:
        t0 = time.perf_counter()
        for start in range(0, N_PROMPTS, per_call):
            chunk = prompts[start : start + per_call]
            width = max(len(p) for p in chunk)
            ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in chunk], device=DEVICE)
            mask = (ids != tok.pad_token_id).long()
            row_lens = lens[start * N_SAMPLES : (start + len(chunk)) * N_SAMPLES]
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                               top_p=1.0, num_return_sequences=N_SAMPLES, max_new_tokens=max(row_lens),
                               min_new_tokens=max(row_lens), eos_token_id=None, pad_token_id=tok.pad_token_id)
        sync()
        return time.perf_counter() - t0

    try:
        run_engine()  # warm-up (kernels, allocator)
        engine_s = min(run_engine() for _ in range(2))
        hf = {k: run_hf(k) for k in (8, 64)}
    finally:
        engine.close()
    tokens = sum(lens)
    best_hf = min(hf, key=hf.get)
    return {"engine_tok_s": round(tokens / engine_s), "hf_generate_tok_s": round(tokens / hf[best_hf]),
            "hf_prompts_per_call": best_hf, "ratio": round(hf[best_hf] / engine_s, 2), "tokens": tokens,
            "dtype": "bfloat16"}


def random_samples(n: int, prompt_len: int, response_len: int, group: int, seed: int = 0):
    from rlvr.core.types import Sample

    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % group == 0:
            prompt = [rng.randrange(3, 250) for _ in range(prompt_len)]
        resp = [rng.randrange(3, 250) for _ in range(rng.randint(response_len // 4, response_len))]
        out.append(Sample("", prompt, response_ids=resp, loss_mask=[1] * len(resp),
                          rollout_log_probs=[-5.0] * len(resp), reward=float(rng.random() < 0.5), index=i))
    return out


def train_bench(ckpt: str, peak_tflops: float) -> dict:

    from rlvr.algo import AlgoConfig
    from rlvr.config import TrainConfig
    from rlvr.train.trainer import Trainer

    cfg = TrainConfig(hf_checkpoint=ckpt, bf16=True, use_dynamic_batch_size=True, max_tokens_per_gpu=16384, lr=1e-6)
    tr = Trainer(cfg, AlgoConfig(), n_samples_per_prompt=8, device=DEVICE)
    n_params = sum(p.numel() for p in tr.model.parameters())
    samples = random_samples(128, 128, 1024, 8) if DEVICE == "cuda" else random_samples(16, 16, 32, 8)
    tr.train(0, samples[:16])  # warm-up
    sync()
    m = tr.train(1, samples)
    tok_s = m["perf/train_tokens_per_s"]
    mfu = 6 * n_params * tok_s / (peak_tflops * 1e12)
    return {"train_tok_s": round(tok_s), "mfu": round(mfu, 4), "params_m": round(n_params / 1e6, 1),
            "samples": len(samples), "tokens": sum(s.total_length for s in samples), "packed": True,
            "peak_memory_gb": round(m["perf/peak_memory_gb"], 2), "peak_tflops_assumed": peak_tflops}


def colocated_cycle(ckpt: str) -> dict:
    """One rollout -> train -> weight push on one GPU, as local --colocate runs it: peak memory per
    phase, and the trainer-vs-engine log-prob gap in bf16 on the sampled tokens."""
    import torch
    from transformers import AutoTokenizer

    from rlvr.algo import AlgoConfig
    from rlvr.runtime.colocate import Colocated
    from rlvr.config import TrainConfig
    from rlvr.engine.base import GenerateRequest, SamplingParams
    from rlvr.engine.local.embedded import EmbeddedEngine
    from rlvr.train.memory import peak_memory_gb
    from rlvr.train.logprobs import response_log_probs
    from rlvr.train.trainer import Trainer
    from rlvr.core.types import Sample

    tok = AutoTokenizer.from_pretrained(ckpt)
    cfg = TrainConfig(hf_checkpoint=ckpt, bf16=True, use_dynamic_batch_size=True, max_tokens_per_gpu=16384, lr=1e-6)
    trainer = Trainer(cfg, AlgoConfig(), n_samples_per_prompt=N_SAMPLES, device=DEVICE)
    engine = EmbeddedEngine(trainer.model, pad_token_id=tok.pad_token_id, seed=0, max_batch_size=512,
                            mem_fraction=0.5)
    both = Colocated(trainer, engine, offload_optimizer=True)
    n = min(16, N_PROMPTS)
    prompts, lens = arith_prompts(tok)[:n], budgets(n * N_SAMPLES, seed=1)
    try:
        reqs = [GenerateRequest(prompts[i // N_SAMPLES], SamplingParams(temperature=1.0, max_new_tokens=lens[i],
                                                                         stop_token_ids=()), rid=str(i))
                for i in range(len(lens))]
        out = engine.generate_sync(reqs)
        samples = [Sample("", prompts[i // N_SAMPLES], response_ids=r.token_ids, loss_mask=[1] * len(r.token_ids),
                          rollout_log_probs=r.log_probs, reward=float(i % 2), index=i) for i, r in enumerate(out)]
        width = max(s.response_length for s in samples)
        with torch.no_grad():
            lp = response_log_probs(trainer.model, samples, 1.0, width, False)[0].float().cpu()
        diffs, log_ratio = [], []
        for i, s in enumerate(samples):
            d = lp[i, : s.response_length] - torch.tensor(s.rollout_log_probs)
            diffs.append(d.abs())
            log_ratio.append(d)
        diff, ratio = torch.cat(diffs), torch.cat(log_ratio).exp()
        metrics = both.train(0, samples)
        engine.update_weights(both.weights(), 1)  # device to device, then the next rollout phase
        engine.generate_sync(reqs[:8])
        push_and_sample_gb = peak_memory_gb(DEVICE)
    finally:
        engine.close()
    return {"rollout_peak_memory_gb": round(metrics["perf/rollout_peak_memory_gb"], 2),
            "train_peak_memory_gb": round(metrics["perf/peak_memory_gb"], 2),
            "after_push_sample_peak_memory_gb": round(push_and_sample_gb, 2),
            "logprob_abs_diff_mean": round(float(diff.mean()), 5), "logprob_abs_diff_max": round(float(diff.max()), 4),
            "tis_weight_mean": round(float(ratio.mean()), 4),
            "tis_clipped_share_at_2": round(float((ratio > 2).float().mean()), 4),
            "tokens": int(diff.numel()), "kv_budget_gb": round(engine.kv_budget_bytes / 2**30, 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--skip-demo", action="store_true")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--demo-timeout", type=int, default=200, help="seconds the demo may take (it is cut off after)")
    p.add_argument("--tests-timeout", type=int, default=150)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100/H200 SXM: 989)")
    p.add_argument("--out", type=Path, default=None, help="also append the JSON lines to this file")
    p.add_argument("--smoke-cpu", action="store_true",
                   help="run the benchmarks' code on CPU with a small model (tests this script; no GPU numbers)")
    a = p.parse_args()
    import torch

    global DEVICE, QWEN25_05B
    if a.smoke_cpu:
        DEVICE, a.skip_tests, a.skip_demo = "cpu", True, True
        QWEN25_05B = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1)
        globals().update(N_PROMPTS=4, MAX_LEN=32)
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to check (the CPU suite is `make test`)", file=sys.stderr)
        return 2
    try:
        import math_verify  # noqa: F401  (the demo's and the tests' math rewards)
    except ImportError:
        print("gpu_check: math-verify is missing; on a machine with network run `make gpu-wheels`, carry "
              ".gpu-wheels/ here and `pip install --no-index --find-links .gpu-wheels math-verify`", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if DEVICE == "cuda":
        emit({"check": "machine", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cuda": torch.version.cuda, "memory_gb": round(torch.cuda.mem_get_info()[1] / 2**30, 1)}, a.out)
    if not a.skip_tests:
        contained("pytest -m gpu", gpu_tests, a.out, a.tests_timeout)
    if not a.skip_demo:
        contained("demo --device cuda", demo, a.out, a.demo_timeout)
    from rlvr.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as d:
        ckpt = str(build_tiny_model(Path(d) / "qwen25-05b-shape", arch="qwen2", **QWEN25_05B))
        contained("rollout: engine vs HF generate (0.5B-shaped, bf16)", rollout_bench, a.out, ckpt)
        contained("train: packed bf16 tokens/s and MFU (0.5B-shaped)", train_bench, a.out, ckpt, a.peak_tflops)
        contained("colocated cycle: peak memory per phase, trainer vs engine log-probs (bf16)", colocated_cycle,
                  a.out, ckpt)
    failed = [r["check"] for r in RESULTS if r.get("ok") is False]
    emit({"check": "summary", "ok": not failed, "failed": failed}, a.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
