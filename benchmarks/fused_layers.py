"""Fused element-wise kernels on CPU: ``torch.compile`` (inductor's C++ backend) on the decoder
layer's pieces, forward + backward, against eager, on the real model's layer shapes.

What is measured: one decoder layer of ``--model`` (SmolLM2-135M-Instruct: hidden 576, MLP 1,536)
on a packed row laid out as the trainer lays out the demo's micro-batches (``rlvr.train.packing``:
``--groups`` prompts of the chat template's ~47 tokens, each shared by 8 responses of RL's
long-tailed lengths up to ``--max-response``), attention through the trainer's packed attention
(``rlvr_varlen``), forward and backward of the output's sum. Variants:

* ``eager``: as the trainer runs today;
* ``regional``: ``torch.compile(dynamic=True)`` of the layer's MLP (SwiGLU) and its two RMSNorms,
  the element-wise work between the matmuls (attention, with its per-sample Python loop, and the
  projections stay eager); compiled once, for layer 0, and the same compiled code then serves
  layer 1 (``recompiles_for_layer_1`` says whether it did);
* ``layer``: ``torch.compile(dynamic=True)`` of the whole decoder layer (graph breaks at the
  packed attention, whose layout argument is a Python list that dynamo guards on).

Each variant's first forward+backward (the compile) is timed on its own; then ``--repeats``
rounds over three packed layouts of different lengths (so a variant that recompiles per length
shows it in ``graphs``), median per length. Wall and process CPU time; the thread count pinned
(``--threads``). Log-probs-free: the output layer is not part of the layer.

    python benchmarks/fused_layers.py --model models/smollm2-135m-instruct [--threads 1]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import set_threads  # noqa: E402


def timed(fn, *args) -> tuple[float, float]:
    """(wall s, process CPU s) of ``fn(*args)``."""
    w, c = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - w, time.process_time() - c


def layouts(seed: int, groups: int, max_response: int, prompt: int = 47) -> list[list[tuple[int, list[int]]]]:
    """Three packed layouts (``packed_groups``) with different total lengths."""
    rng = random.Random(seed)
    out = []
    for scale in (0.7, 1.0, 1.3):
        out.append([(prompt, [int(min(max(rng.lognormvariate(0, 0.6) * max_response * scale / 2, 3), max_response))
                              for _ in range(8)]) for _ in range(groups)])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/smollm2-135m-instruct")
    ap.add_argument("--groups", type=int, default=8, help="prompts per packed row (8 samples each)")
    ap.add_argument("--max-response", type=int, default=24, help="response length limit (the demo's: 24)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", nargs="+", default=["eager", "regional", "layer"])
    args = ap.parse_args()
    set_threads(args.threads)
    import torch
    import torch._dynamo

    from rlvr.train.trainer import load_policy

    model = load_policy(args.model, bf16=False)
    base = model.model
    results = {}
    for variant in args.variants:
        torch._dynamo.reset()
        layers = [base.layers[0], base.layers[1]]
        calls = []
        for layer in layers:
            if variant == "regional":
                mods = {"mlp": torch.compile(layer.mlp, dynamic=True),
                        "input_layernorm": torch.compile(layer.input_layernorm, dynamic=True),
                        "post_attention_layernorm": torch.compile(layer.post_attention_layernorm, dynamic=True)}
                calls.append(_with_modules(layer, mods))
            elif variant == "layer":
                calls.append(torch.compile(layer, dynamic=True))
            else:
                calls.append(layer)
        torch.manual_seed(0)
        step = partial(fwd_bwd, base)
        lay = layouts(0, args.groups, args.max_response)
        first = timed(step, calls[0], lay[1])
        graphs_after_first = _graphs()
        second_layer = timed(step, calls[1], lay[1])
        graphs_after_layer_1 = _graphs()
        rows = {}
        for groups in lay:
            n = sum(p + sum(r) for p, r in groups)
            step(calls[0], groups)  # a new length: any recompile happens here, not in the timing
            times = [timed(step, calls[0], groups) for _ in range(args.repeats)]
            rows[n] = {"wall_s": statistics.median(t for t, _ in times), "cpu_s": statistics.median(c for _, c in times)}
        results[variant] = {"first_call_wall_s": first[0], "first_call_cpu_s": first[1],
                            "layer_1_first_call_wall_s": second_layer[0],
                            "graphs": _graphs(), "recompiles_for_layer_1": graphs_after_layer_1 > graphs_after_first,
                            "per_length": rows}
        print(variant, json.dumps(results[variant]), flush=True)
    if "eager" in results:
        for variant, r in results.items():
            ratios = [results["eager"]["per_length"][n]["cpu_s"] / r["per_length"][n]["cpu_s"] for n in r["per_length"]]
            r["speedup_vs_eager_cpu"] = ratios
            print(f"{variant}: fwd+bwd of one layer, eager CPU time / this CPU time per length: "
                  + ", ".join(f"{x:.2f}x" for x in ratios)
                  + f"; compile (first call) {r['first_call_wall_s']:.1f} s wall", flush=True)
    print(json.dumps({"bench": "fused_layers", "threads": args.threads, "results": results}))


def fwd_bwd(base, call, groups) -> None:
    """Forward and backward of one decoder layer ``call`` on a random packed row laid out as ``groups``."""
    import torch

    from rlvr.train.attention import PACKED_FORWARD

    n = sum(p + sum(r) for p, r in groups)
    x = torch.randn(1, n, base.config.hidden_size, requires_grad=True)
    pos = torch.cat([torch.cat([torch.arange(p), *[torch.arange(p, p + k) for k in r]]) for p, r in groups])[None]
    pe = base.rotary_emb(x, pos)
    token = PACKED_FORWARD.set(True)
    try:
        out = call(x, attention_mask=None, position_ids=pos, position_embeddings=pe, packed_groups=groups)
    finally:
        PACKED_FORWARD.reset(token)
    out = out[0] if isinstance(out, tuple) else out
    out.sum().backward()


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _with_modules(layer, mods: dict):
    """``layer``'s forward with some submodules replaced by compiled ones (restored after the call)."""
    def call(*a, **kw):
        saved = {k: getattr(layer, k) for k in mods}
        for k, m in mods.items():
            setattr(layer, k, m)
        try:
            return layer(*a, **kw)
        finally:
            for k, m in saved.items():
                setattr(layer, k, m)
    return call


if __name__ == "__main__":
    main()
