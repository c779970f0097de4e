"""Peak memory of one training step.

Default: the ~20M model at --max-tokens-per-gpu 4096, with and without --recompute-activations.
``--lora-rank R``: the ~100M model, one GRPO step with a KL reference (``--use-kl-loss``), full
fine-tuning against LoRA of rank R on all linear layers (the reference is the base with
the adapter disabled, and only the adapters carry gradients and AdamW state).

Each mode runs in its own subprocess: build the trainer (``--use-dynamic-batch-size
--max-tokens-per-gpu``), take one step to allocate AdamW's state, then reset the peak-RSS
counter (``/proc/self/clear_refs``) and take a second step on a rollout that fills one micro-batch
exactly. Reported: resident memory before the step, the step's peak (VmHWM), and the difference
(what the step itself needs: activations, gradients, temporaries). Peak RSS counts everything the
process holds: weights, the reference model, optimizer state; ``--with-engine`` adds the embedded
engine a local ``rlvr train`` builds from the trainer's model (with LoRA it shares the frozen base).

The children run with a fixed glibc mmap threshold (``MALLOC_MMAP_THRESHOLD_=131072``), so every
tensor buffer is its own mapping and goes back to the kernel when freed: resident memory is then
what the process's tensors hold, the CPU counterpart of ``torch.cuda.max_memory_allocated``. With
glibc's default, a freed buffer may stay in the heap and the counts include whatever earlier
phases (loading, the first step) left there (``--glibc-default`` measures that way).

``--model DIR`` (a real checkpoint, e.g. SmolLM2-135M-Instruct): the split of one GRPO step's
memory in the process of a local run (trainer + embedded engine), chat prompts of the model's own
template, ``--prompts`` x ``--samples`` responses all at ``--max-response`` tokens (the worst case
of those settings), one micro-batch cap ``--max-tokens-per-gpu``: the runtime (interpreter, torch,
transformers), the weights, the engine's copy, the gradients, AdamW's state (tensor bytes), the
step's own memory per packed position (activations, gradients and temporaries). Modes: ``main``
(the engine's own copy, one log-prob chunk: before the cuts), ``shared`` (the engine samples from
the trainer's weights, the vocabulary's chunk: the defaults now) and both with
``--recompute-activations``. Without recomputation the step holds ~1.5 MB per position, so those
modes run at ``--small-cap`` (and ``shared`` at half of it: the step's memory follows the cap) and
the recomputing ones at ``--max-tokens-per-gpu`` (default 8192, one micro-batch); ``--modes`` runs
the named modes at ``--max-tokens-per-gpu`` only. Then the output layer alone at vocabularies of
49,152 and 262,144 with one chunk and with the default chunk (``--vocab-rows`` positions). A
child starts only when the machine has the memory its mode may need (``wait_for_memory``).

    python benchmarks/train_memory.py
    python benchmarks/train_memory.py --lora-rank 16 [--recompute-activations] [--with-engine]
    python benchmarks/train_memory.py --model models/smollm2-135m-instruct [--glibc-default]

Ends with one JSON line per mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def rss_gb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def child(model: str, recompute: bool, lora_rank: int, kl: bool, tokens: int, with_engine: bool) -> None:
    from common import set_threads

    set_threads(2)
    from rlvr.algo import AlgoConfig
    from rlvr.config import TrainConfig
    from rlvr.train.memory import peak_memory_gb, reset_peak_memory
    from rlvr.train.trainer import Trainer
    from rlvr.core.types import Sample

    rng = random.Random(0)
    samples = []
    prompt_len, resp_len = tokens // 40, tokens // 8 - tokens // 40  # 8 samples (2 prompts x 4) fill the budget
    for _ in range(2):
        prompt = [rng.randrange(256) for _ in range(prompt_len)]
        for j in range(4):
            resp = [rng.randrange(256) for _ in range(resp_len)]
            samples.append(Sample("", prompt, response_ids=resp, loss_mask=[1] * resp_len,
                                  rollout_log_probs=[-5.5] * resp_len, reward=float(j % 2)))
    cfg = TrainConfig(hf_checkpoint=model, lr=1e-5, use_dynamic_batch_size=True, max_tokens_per_gpu=tokens,
                      recompute_activations=recompute, lora_rank=lora_rank)
    algo = AlgoConfig(use_kl_loss=kl, kl_loss_coef=0.001 if kl else 0.0, kl_loss_type="low_var_kl")
    trainer = Trainer(cfg, algo, n_samples_per_prompt=4)
    engine = None
    if with_engine:  # what local `rlvr train` builds: rlvr.runtime.build.embedded_engine on the trainer's model
        from rlvr.engine.local.embedded import EmbeddedEngine

        # a synchronous local run's engine samples from the trainer's own module (engine_shares_trainer_weights)
        engine = EmbeddedEngine(trainer.model, pad_token_id=0, seed=0, share_weights=True)
    trainer.train(0, samples)  # allocates the optimizer state
    before = rss_gb()
    reset_peak_memory()
    metrics = trainer.train(1, samples)
    if engine is not None:
        engine.update_weights(trainer.weights(), 1)  # the sync after the step (LoRA: the adapters)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    print("RESULT " + json.dumps({"before_gb": before, "peak_gb": peak_memory_gb(), "trainable": trainable,
                                  "params": total,
                                  "has_ref_copy": trainer.reference is not None
                                  and trainer.reference.model is not trainer.model,
                                  "train_time": metrics["perf/train_time"]}))


def run_mode(model: Path, recompute: bool, lora_rank: int, kl: bool, tokens: int, with_engine: bool,
             glibc_default: bool) -> dict:
    env = dict(os.environ)
    if not glibc_default:
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    proc = subprocess.run([sys.executable, __file__, "--child", str(model), str(int(recompute)), str(lora_rank),
                           str(int(kl)), str(tokens), str(int(with_engine))], capture_output=True, text=True, env=env)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        sys.exit(proc.stderr[-3000:])
    return json.loads(line[0].split(" ", 1)[1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        m, rec, rank, kl, tokens, eng = sys.argv[2:8]
        return child(m, rec == "1", int(rank), kl == "1", int(tokens), eng == "1")
    if len(sys.argv) > 1 and sys.argv[1] in ("--real-child", "--vocab-child"):
        return (real_child if sys.argv[1] == "--real-child" else vocab_child)(json.loads(sys.argv[2]))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lora-rank", type=int, default=0, help="compare full fine-tuning with LoRA of this rank "
                                                            "(~100M model, GRPO + KL reference)")
    p.add_argument("--recompute-activations", action="store_true",
                   help="with --lora-rank: both sides recompute activations (what is left is weights and state)")
    p.add_argument("--max-tokens-per-gpu", type=int, default=None, help="tokens of the one micro-batch "
                                                                        "(default 4096; 1024 with --lora-rank)")
    p.add_argument("--with-engine", action="store_true", help="the process also holds the embedded engine "
                                                                "(local rlvr train), synced after the step")
    p.add_argument("--glibc-default", action="store_true", help="leave glibc's dynamic mmap threshold on "
                                                                  "(counts freed buffers the heap kept)")
    p.add_argument("--model", help="a real HF checkpoint: the split of one GRPO step (see above)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=8, help="responses per prompt")
    p.add_argument("--max-response", type=int, default=64, help="tokens of every response (--model)")
    p.add_argument("--small-cap", type=int, default=1024,
                   help="--model: the cap of the modes without recomputation (and half of it, for the slope)")
    p.add_argument("--vocab-rows", type=int, default=1024, help="--model: positions of the output-layer runs")
    p.add_argument("--modes", nargs="*", default=[], choices=list(REAL_MODES),
                   help="--model: run these modes at --max-tokens-per-gpu only (default: the plan above)")
    p.add_argument("--no-vocab", action="store_true", help="--model: skip the output-layer runs")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    if a.model:
        real_main(a)
        return None if a.no_vocab else vocab_main(a)
    from common import model_dir

    name = "100m" if a.lora_rank else "20m"
    tokens = a.max_tokens_per_gpu or (1024 if a.lora_rank else 4096)
    model = model_dir(name, Path(tempfile.mkdtemp(prefix="rlvr-mem-")))
    rec = a.recompute_activations
    modes = [(rec, 0), (rec, a.lora_rank)] if a.lora_rank else [(False, 0), (True, 0)]
    rows = []
    for recompute, rank in modes:
        r = run_mode(model, recompute, rank, kl=bool(a.lora_rank), tokens=tokens, with_engine=a.with_engine,
                     glibc_default=a.glibc_default)
        row = {"bench": "train_memory", "model": name, "params": r["params"], "max_tokens_per_gpu": tokens,
               "recompute_activations": recompute, "lora_rank": rank, "kl_reference_copy": r["has_ref_copy"],
               "with_engine": a.with_engine, "glibc_mmap_threshold": "dynamic" if a.glibc_default else 131072,
               "trainable_params": r["trainable"], "rss_before_gb": round(r["before_gb"], 3),
               "peak_rss_gb": round(r["peak_gb"], 3), "step_gb": round(r["peak_gb"] - r["before_gb"], 3),
               "train_time_s": round(r["train_time"], 2)}
        print(f"recompute={recompute!s:<5} lora_rank={rank:<3}: {row['trainable_params'] / 1e6:.1f}M of "
              f"{row['params'] / 1e6:.1f}M trained, RSS before {row['rss_before_gb']:.2f} GB, step peak "
              f"{row['peak_rss_gb']:.2f} GB (+{row['step_gb']:.2f} GB), {row['train_time_s']:.1f} s")
        rows.append(row)
    if a.lora_rank:
        saved = 1 - rows[1]["peak_rss_gb"] / rows[0]["peak_rss_gb"]
        print(f"LoRA rank {a.lora_rank}: peak {saved:.0%} lower than full fine-tuning")
    for row in rows:
        print(json.dumps(row))


# ---- --model DIR: where a real model's bytes go (the split), before and after the cuts ----------------------------
# One GRPO step as local `rlvr train` takes it: trainer and embedded engine in one process, chat prompts of the
# model's own template, every response at --max-response tokens (the settings' worst case), rewards alternating.
# Each mode is a child process; each reports RSS after each stage and the tensors' own bytes.

ONE_CHUNK = 1 << 30  # --log-probs-chunk-size: the whole micro-batch in one chunk (main's -1 before the cut)
REAL_MODES = {
    # name: (engine shares the trainer's weights, --log-probs-chunk-size, --recompute-activations)
    "main": (False, ONE_CHUNK, False),  # before the cuts: the engine's own copy, one log-prob chunk
    "shared": (True, -1, False),  # the defaults now: the trainer's weights, the vocabulary's chunk
    "main+recompute": (False, ONE_CHUNK, True),
    "shared+recompute": (True, -1, True),
}
# Without recomputation a step holds ~1.5 MB per packed position on SmolLM2 (30 layers): the worst case of
# 8 x 8 x 64 tokens in one micro-batch (4,400 positions) passes 9 GB, which a shared 24 GB machine cannot
# spare, so those modes run at a small cap (--small-cap) and the recomputing ones at the settings' cap.
DEFAULT_PLAN = [("main", "small"), ("shared", "small"), ("shared", "half"), ("main+recompute", "full"),
                ("shared+recompute", "full")]


def wait_for_memory(need_gb: float, timeout_s: float = 900) -> None:
    """Start a child only when the machine has ``need_gb`` available (other jobs share it)."""
    t0 = time.time()
    while True:
        avail = next(int(x.split()[1]) for x in open("/proc/meminfo") if x.startswith("MemAvailable:")) / 2**20
        if avail >= need_gb or time.time() - t0 > timeout_s:
            return
        print(f"  waiting: {avail:.1f} GB available, this mode may need {need_gb:.1f} GB", flush=True)
        time.sleep(15)


def tensor_gb(tensors) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 2**30


def real_child(spec: dict) -> None:
    """One mode on a real checkpoint; prints RESULT {stage RSS, tensor bytes, step peak, times}."""
    from common import set_threads

    set_threads(spec["threads"])
    import torch  # noqa: F401  (the runtime: interpreter, torch, transformers, rlvr)

    from rlvr.algo import AlgoConfig
    from rlvr.config import TrainConfig
    from rlvr.engine.local.embedded import EmbeddedEngine
    from rlvr.train.memory import peak_memory_gb, reset_peak_memory
    from rlvr.train.trainer import Trainer

    from transformers import AutoTokenizer

    from common import chat_samples

    out = {"rss_runtime_gb": rss_gb()}
    samples = chat_samples(AutoTokenizer.from_pretrained(spec["model"]), spec["prompts"], spec["samples"],
                           spec["max_response"], full=True)
    cfg = TrainConfig(hf_checkpoint=spec["model"], lr=1e-6, use_dynamic_batch_size=True,
                      max_tokens_per_gpu=spec["tokens"], recompute_activations=spec["recompute"],
                      log_probs_chunk_size=spec["chunk"])
    trainer = Trainer(cfg, AlgoConfig(), n_samples_per_prompt=spec["samples"])
    # The loaded weights are views of the mmapped checkpoint, resident only once read: read them
    # here, so that they count as the trainer's and not as whatever touches them first.
    float(sum(p.detach().sum() for p in trainer.model.parameters()))
    out["rss_trainer_gb"] = rss_gb()
    engine = EmbeddedEngine(trainer.model, pad_token_id=0, seed=0, share_weights=spec["share"])
    out["rss_engine_gb"] = rss_gb()
    # A short first step allocates AdamW's state (and the gradients, kept until the next step): one
    # group, its responses cut to 4 tokens.
    first = [dataclasses.replace(s, response_ids=s.response_ids[:4], loss_mask=[1] * 4, rollout_log_probs=[-2.0] * 4)
             for s in samples[: spec["samples"]]]
    trainer.train(0, first)
    params = list(trainer.model.parameters())
    out |= {"params": sum(p.numel() for p in params), "weights_gb": tensor_gb(params),
            "grads_gb": tensor_gb(p.grad for p in params if p.grad is not None),
            "adam_gb": tensor_gb(v for st in trainer.optimizer.adamw.state.values() for v in st.values()
                                 if isinstance(v, torch.Tensor)),
            "rss_before_gb": rss_gb()}
    mbs = trainer.batches.split(samples, list(range(len(samples))))
    from rlvr.train.packing import pack

    out["positions_per_micro_batch"] = max(pack([samples[i] for i in mb]).slots for mb in mbs)
    out["micro_batches"] = len(mbs)
    reset_peak_memory()
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train(1, samples)
    out |= {"train_s": time.perf_counter() - t0, "train_cpu_s": time.process_time() - c0,
            "peak_gb": peak_memory_gb(), "chunk": trainer.policy.chunk()}
    engine.update_weights(trainer.weights(), 1)  # the sync after the step
    out["rss_after_sync_gb"] = rss_gb()
    print("RESULT " + json.dumps(out))


def run_child(flag: str, spec: dict, glibc_default: bool) -> dict:
    env = dict(os.environ)
    if not glibc_default:
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    proc = subprocess.run([sys.executable, __file__, flag, json.dumps(spec)], capture_output=True,
                          text=True, env=env)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        sys.exit(proc.stderr[-3000:])
    return json.loads(line[0].split(" ", 1)[1])


def real_row(name: str, spec: dict, r: dict, glibc_default: bool) -> dict:
    """The split of one mode (GiB; bytes per parameter where it is state)."""
    n = r["params"]
    engine = r["rss_engine_gb"] - r["rss_trainer_gb"]
    step = r["peak_gb"] - r["rss_before_gb"]
    state = r["rss_before_gb"] - r["rss_runtime_gb"]  # weights, engine copy, gradients, AdamW (and load leftovers)
    row = {"bench": "train_memory_real", "mode": name, "model": Path(spec["model"]).name, "params": n,
           "max_tokens_per_gpu": spec["tokens"], "micro_batches": r["micro_batches"],
           "positions_per_micro_batch": r["positions_per_micro_batch"], "log_probs_chunk": r["chunk"],
           "recompute_activations": spec["recompute"], "engine_shares_weights": spec["share"],
           "glibc_mmap_threshold": "dynamic" if glibc_default else 131072,
           "runtime_gb": r["rss_runtime_gb"], "weights_gb": r["weights_gb"], "engine_copy_gb": engine,
           "grads_gb": r["grads_gb"], "adam_gb": r["adam_gb"], "state_gb": state,
           "state_bytes_per_param": state * 2**30 / n,
           "trainer_tensor_bytes_per_param": (r["weights_gb"] + r["grads_gb"] + r["adam_gb"]) * 2**30 / n,
           "step_gb": step, "step_kb_per_position": step * 2**20 / r["positions_per_micro_batch"],
           "peak_gb": r["peak_gb"], "train_s": r["train_s"], "train_cpu_s": r["train_cpu_s"]}
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


def real_main(a) -> None:
    base = {"model": str(Path(a.model).resolve()), "prompts": a.prompts, "samples": a.samples,
            "max_response": a.max_response, "threads": a.threads}
    caps = {"full": a.max_tokens_per_gpu or 8192, "small": a.small_cap, "half": a.small_cap // 2}
    rows = []
    for name, cap in ([(m, "full") for m in a.modes] if a.modes else DEFAULT_PLAN):
        share, chunk, rec = REAL_MODES[name]
        spec = base | {"share": share, "chunk": chunk, "recompute": rec, "tokens": caps[cap]}
        wait_for_memory(3.0 + (0 if rec else 1.6 * caps[cap] / 1024) + (0 if share else 0.6))
        row = real_row(name, spec, run_child("--real-child", spec, a.glibc_default), a.glibc_default)
        print(f"{name:<16} cap {caps[cap]:>5}: peak {row['peak_gb']:.2f} GB | runtime {row['runtime_gb']:.2f} weights "
              f"{row['weights_gb']:.2f} engine copy {row['engine_copy_gb']:.2f} grads {row['grads_gb']:.2f} AdamW "
              f"{row['adam_gb']:.2f} | state {row['state_bytes_per_param']:.1f} B/param | step +{row['step_gb']:.2f} "
              f"GB ({row['step_kb_per_position']:.0f} KiB/position, {row['positions_per_micro_batch']} positions, "
              f"{row['micro_batches']} micro-batches) | {row['train_s']:.1f} s ({row['train_cpu_s']:.1f} s CPU)",
              flush=True)
        rows.append(row)
    for row in rows:
        print(json.dumps(row))


def vocab_child(spec: dict) -> None:
    """The output layer's log-probs and entropy, forward and backward, over ``rows`` response
    positions of a ``vocab``-token head (hidden 576, SmolLM2's) at ``chunk`` rows per chunk."""
    from common import set_threads

    set_threads(spec["threads"])
    import torch

    from rlvr.train.logprobs import auto_chunk_size, token_log_probs
    from rlvr.train.memory import peak_memory_gb, reset_peak_memory

    torch.manual_seed(0)
    head = torch.nn.Linear(576, spec["vocab"], bias=False)
    hidden = torch.randn(spec["rows"], 576, requires_grad=True)
    targets = torch.randint(0, spec["vocab"], (spec["rows"],))
    chunk = spec["chunk"] if spec["chunk"] > 0 else auto_chunk_size(spec["vocab"])
    before = rss_gb()
    reset_peak_memory()
    t0, c0 = time.perf_counter(), time.process_time()
    lp, ent = token_log_probs(head, hidden, targets, 1.0, True, chunk)
    (lp.sum() + ent.sum()).backward()
    grad_gb = head.weight.numel() * 4 / 2**30  # the head's weight gradient: there at any chunk size
    print("RESULT " + json.dumps({"chunk": chunk, "extra_gb": peak_memory_gb() - before - grad_gb,
                                  "s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}))


def vocab_main(a) -> None:
    rows = []
    for vocab in (49152, 262144):
        for chunk in (a.vocab_rows, -1):
            spec = {"vocab": vocab, "rows": a.vocab_rows, "chunk": chunk, "threads": a.threads}
            logits_gb = a.vocab_rows * vocab * 4 / 2**30
            wait_for_memory(1.5 + 4 * logits_gb)
            r = run_child("--vocab-child", spec, a.glibc_default)
            row = {"bench": "log_probs_chunks", "vocab": vocab, "rows": a.vocab_rows, "chunk": r["chunk"],
                   "full_logits_gb": round(logits_gb, 3), "extra_gb": round(r["extra_gb"], 3),
                   "s": round(r["s"], 2), "cpu_s": round(r["cpu_s"], 2)}
            print(f"vocab {vocab:>6}, {a.vocab_rows} rows, chunk {r['chunk']:>5}: +{row['extra_gb']:.2f} GB beyond the "
                  f"hidden states and the head's gradient (full logits would be {logits_gb:.2f} GB), "
                  f"{row['s']:.1f} s ({row['cpu_s']:.1f} s CPU)", flush=True)
            rows.append(row)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
