"""Peak memory of one training step.

Default: the ~20M model at --max-tokens-per-gpu 4096, with and without --recompute-activations.
``--lora-rank R``: the ~100M model, one GRPO step with a KL reference (``--use-kl-loss``), full
fine-tuning against LoRA of rank R on all linear layers (issue 18: the reference is the base with
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

    python benchmarks/train_memory.py
    python benchmarks/train_memory.py --lora-rank 16 [--recompute-activations] [--with-engine]

Ends with one JSON line per mode.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
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
    for g in range(2):
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
        from rlvr.engine.embedded import EmbeddedEngine

        engine = EmbeddedEngine(trainer.model, pad_token_id=0, seed=0)
    trainer.train(0, samples)  # allocates the optimizer state
    before = rss_gb()
    reset_peak_memory()
    metrics = trainer.train(1, samples)
    if engine is not None:
        engine.update_weights(trainer.weights(), 1)  # the sync after the step (LoRA: the adapters)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    print("RESULT " + json.dumps({"before_gb": before, "peak_gb": peak_memory_gb(), "trainable": trainable,
                                  "params": total, "has_ref_copy": trainer.ref_model not in (None, trainer.model),
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
    a = p.parse_args()
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


if __name__ == "__main__":
    main()
