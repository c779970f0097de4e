"""Where the embedded engine's time goes: ``torch.profiler`` over the workload of
``benchmarks/vllm_engines.py`` (SmolLM2's chat prompts x 8 samples, long-tailed budgets, one call),
its operators grouped into the decoder's linear layers (``aten::linear``/``mm``/``addmm``), attention
(``scaled_dot_product_attention`` and its kernels), the output layer's sampling work
(``softmax``/``log_softmax``/``multinomial``/``topk``/``sort``), element-wise and copy work, and the rest;
what no operator covers is Python and the engine's scheduling. Then fp32 GEMM on the shapes of one
decode step's linears (``--decode-batch`` rows), timed through ``torch.nn.functional.linear`` and
through oneDNN's prepacked path (``torch.ops.mkldnn._reorder_linear_weight`` +
``torch.ops.mkldnn._linear_pointwise``, what vLLM's CPU backend uses for its linears), so the
profile's linear share can be read against what a prepacked kernel would take.

The profile also reads the shapes of every ``aten::mm``/``addmm`` the engine ran and times the same
GEMMs (the same counts of each shape) standalone in the same run: the engine's GEMM rate against
what the CPU gives its own shapes. ``--fuse`` profiles an engine with fused q/k/v and gate/up
projections (``rlvr.engine.local.fused``; off by default in the engine).

``--fused``: instead of the profile, the same workload on an unfused and a fused engine in one run,
alternated (unfused, fused, fused, unfused), each call's wall and CPU time.

``--compile``: instead of the profile, the same workload on an engine whose model has
``--compile-layers``' regional compilation (``rlvr.train.trainer.compile_layers``: each decoder
layer's MLP and norms, dynamic shapes; what the embedded engine runs when it shares a compiled
trainer's module) against an eager one, in one run: the compiled engine's first call (the compile)
and a second call, timed.

    OMP_NUM_THREADS=1 python benchmarks/engine_profile.py --model models/smollm2-135m-instruct [--fused | --compile]

``--model tiny`` builds the demo-size tiny Qwen2 (``common.MODELS``) in a temporary directory.

Ends with one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

GROUPS = {  # operator name fragment -> group (first match wins, in this order)
    "scaled_dot_product": "attention", "_flash_attention": "attention", "bmm": "attention", "baddbmm": "attention",
    "linear": "linear", "addmm": "linear", "aten::mm": "linear", "matmul": "linear",
    "softmax": "sampling", "multinomial": "sampling", "topk": "sampling", "sort": "sampling", "argmax": "sampling",
    "exponential": "sampling", "gather": "sampling",
    "copy": "copy/cat/index", "cat": "copy/cat/index", "index": "copy/cat/index", "stack": "copy/cat/index",
    "mul": "element-wise", "add": "element-wise", "silu": "element-wise", "rsqrt": "element-wise", "pow": "element-wise",
    "mean": "element-wise", "div": "element-wise", "neg": "element-wise", "cos": "element-wise", "sin": "element-wise",
}


def group_of(name: str) -> str:
    return next((g for k, g in GROUPS.items() if k in name), "other ops")


def gemm_rates(model, rows: int, repeats: int = 20) -> dict:
    """fp32 GFLOP/s of one decode step's linears (every distinct weight shape of layer 0), plain and prepacked."""
    import torch

    layer = model.model.layers[0]
    weights = [m.weight.detach() for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    out = {}
    for path in ("plain", "onednn_prepacked"):
        flops, secs = 0, 0.0
        for w in weights:
            x = torch.randn(rows, w.shape[1])
            if path == "plain":
                fn = lambda x=x, w=w: torch.nn.functional.linear(x, w)  # noqa: E731
            else:
                try:
                    packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
                    fn = lambda x=x, p=packed, w=w: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")  # noqa: E731
                    fn()
                except (RuntimeError, AttributeError) as e:
                    out[path] = f"unavailable: {e}"
                    break
            fn()
            t0 = time.perf_counter()
            for _ in range(repeats):
                fn()
            secs += time.perf_counter() - t0
            flops += 2 * rows * w.shape[0] * w.shape[1] * repeats
        else:
            out[path] = round(flops / secs / 1e9, 1)
    return out


def main() -> None:
    from common import MODELS, chat_prompts, chat_workload_parser, model_dir, set_threads

    ap = chat_workload_parser(__doc__.split("\n")[0])
    ap.add_argument("--decode-batch", type=int, default=64, help="rows of the GEMM comparison (requests decoding at once)")
    ap.add_argument("--compile", action="store_true", help="eager vs compiled decoder layers instead of the profile")
    ap.add_argument("--fused", action="store_true", help="unfused vs fused projections instead of the profile")
    ap.add_argument("--fuse", action="store_true", help="profile an engine with fused projections")
    args = ap.parse_args()
    set_threads(args.threads)
    if args.model in MODELS:
        import tempfile

        args.model = str(model_dir(args.model, tempfile.mkdtemp(prefix="rlvr-engine-profile-")))
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoTokenizer

    from rlvr.engine.base import GenerateRequest, SamplingParams
    from rlvr.engine.local.embedded import EmbeddedEngine
    from rollout_throughput import N_SAMPLES, budgets

    tok = AutoTokenizer.from_pretrained(args.model)
    prompts = chat_prompts(tok, args.prompts)
    lens = budgets(len(prompts) * N_SAMPLES, args.median_len, args.max_len)
    reqs = lambda ps, ls: [GenerateRequest(ps[i // N_SAMPLES], SamplingParams(temperature=1.0, max_new_tokens=n),  # noqa: E731
                                           rid=str(i)) for i, n in enumerate(ls)]
    if args.compile:
        return compare_compiled(args, EmbeddedEngine, tok, reqs(prompts, lens), sum(lens), reqs(prompts[:2], lens[:16]))
    if args.fused:
        return compare_fused(args, EmbeddedEngine, tok, reqs(prompts, lens), sum(lens), reqs(prompts[:2], lens[:16]))
    fuse = args.fuse
    warm = EmbeddedEngine(args.model, pad_token_id=tok.pad_token_id, seed=0, max_batch_size=512, fuse_projections=fuse)
    warm.generate_sync(reqs(prompts[:2], lens[:16]))  # one-time set-up of the kernels, outside the profile
    warm.close()
    engine = EmbeddedEngine(args.model, pad_token_id=tok.pad_token_id, seed=0, max_batch_size=512, fuse_projections=fuse)
    # The engine decodes on its own worker thread, and the profiler records the thread it is entered
    # on: the worker's loop runs inside it.
    holder, worker_loop = {}, engine._run

    def profiled_loop():
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
            holder["prof"] = p
            worker_loop()

    engine._run = profiled_loop
    t0, c0 = time.perf_counter(), time.process_time()
    engine.generate_sync(reqs(prompts, lens))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    engine.close()
    engine._worker.join()
    prof = holder["prof"]
    by_group: dict[str, float] = defaultdict(float)
    top = []
    for e in prof.key_averages():
        by_group[group_of(e.key)] += e.self_cpu_time_total / 1e6
        top.append((e.self_cpu_time_total / 1e6, e.key, e.count))
    ops = sum(by_group.values())
    shares = {g: round(t / wall, 3) for g, t in sorted(by_group.items(), key=lambda kv: -kv[1])}
    shares["python and scheduling (no operator)"] = round(max(wall - ops, 0.0) / wall, 3)
    print(f"embedded engine ({'fused' if fuse else 'unfused'} projections), {sum(lens)} tokens in {wall:.1f} s wall "
          f"({sum(lens) / wall:.1f} tok/s, profiled), "
          f"{cpu:.1f} s CPU; share of wall time:")
    for g, x in shares.items():
        print(f"  {g:<38} {x:6.1%}")
    print("top operators by self CPU time:")
    for t, k, n in sorted(top, reverse=True)[:12]:
        print(f"  {k:<45} {t:7.2f} s  {n:7d} calls")
    same = engine_gemms_vs_standalone(prof)
    print(f"the engine's GEMMs ({same['shapes']} shapes, {same['calls']} calls): {same['engine_s']:.2f} s at "
          f"{same['engine_gflops']} GFLOP/s; the same GEMMs standalone, weights in cache: {same['standalone_hot_s']:.2f} s "
          f"at {same['standalone_hot_gflops']} GFLOP/s (engine at {same['ratio_hot']:.0%}); weights from memory: "
          f"{same['standalone_cold_s']:.2f} s at {same['standalone_cold_gflops']} GFLOP/s (engine at {same['ratio_cold']:.0%})")
    rates = gemm_rates(engine.model, args.decode_batch)
    print(f"fp32 GEMM of a decode step's linears ({args.decode_batch} rows): plain {rates.get('plain')} GFLOP/s, "
          f"oneDNN prepacked {rates.get('onednn_prepacked')} GFLOP/s")
    print(json.dumps({"bench": "engine_profile", "threads": args.threads, "fused": fuse, "tokens": sum(lens),
                      "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "shares": shares, "gemm_gflops": rates,
                      "engine_gemms_vs_standalone": same,
                      "top": [{"op": k, "self_s": round(t, 2), "calls": n} for t, k, n in sorted(top, reverse=True)[:12]]}))


def engine_gemms_vs_standalone(prof, min_s: float = 0.01, cold_bytes: int = 96 * 2**20) -> dict:
    """The engine's ``aten::mm``/``addmm`` by input shape (from the profile) against the same GEMMs
    run standalone: each shape timed (``torch.mm(x, w.t())``, a linear's call) over at least
    ``min_s`` and charged for the profile's count of it. Twice: ``hot``, one weight over and over
    (it stays in the CPU's caches), and ``cold``, cycling through copies of it that together exceed
    the last-level cache (``cold_bytes``), as a decode step does when it reads every layer's
    weights once."""
    import torch

    engine_s, flops, shapes, calls = 0.0, 0.0, 0, 0
    standalone = {"hot": 0.0, "cold": 0.0}
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key not in ("aten::mm", "aten::addmm") or not e.input_shapes:
            continue
        dims = [s for s in e.input_shapes if len(s) == 2]
        if len(dims) < 2:
            continue
        (m, k), (_, n) = dims[0], dims[1]
        x = torch.randn(m, k)
        for kind in ("hot", "cold"):
            copies = 1 if kind == "hot" else max(1, cold_bytes // (4 * n * k))
            ws = [torch.randn(n, k) for _ in range(copies)]
            torch.mm(x, ws[0].t())
            reps, t0 = 0, time.perf_counter()
            while reps < 3 or time.perf_counter() - t0 < min_s:
                torch.mm(x, ws[reps % copies].t())
                reps += 1
            standalone[kind] += (time.perf_counter() - t0) / reps * e.count
        engine_s += e.self_cpu_time_total / 1e6
        flops += 2.0 * m * k * n * e.count
        shapes, calls = shapes + 1, calls + e.count
    out = {"engine_s": round(engine_s, 2), "engine_gflops": round(flops / engine_s / 1e9, 1), "shapes": shapes,
           "calls": calls}
    for kind, secs in standalone.items():
        out[f"standalone_{kind}_s"] = round(secs, 2)
        out[f"standalone_{kind}_gflops"] = round(flops / secs / 1e9, 1)
        out[f"ratio_{kind}"] = round(secs / engine_s, 3)
    return out


def compare_fused(args, engine_cls, tok, work: list, tokens: int, warm: list) -> None:
    """Unfused and fused engines on the same requests, alternated: (wall, CPU) of each call."""
    engines = {name: engine_cls(args.model, pad_token_id=tok.pad_token_id, seed=0, max_batch_size=512,
                                fuse_projections=name == "fused") for name in ("unfused", "fused")}
    for engine in engines.values():
        engine.generate_sync(warm)
    row = {"bench": "engine_fused", "threads": args.threads, "tokens": tokens, "model": args.model,
           "unfused": [], "fused": []}
    for name in ("unfused", "fused", "fused", "unfused"):
        t0, c0 = time.perf_counter(), time.process_time()
        engines[name].generate_sync(work)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        row[name].append({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)})
        print(f"{name:>8}: {wall:.1f} s wall, {cpu:.1f} s CPU ({tokens / wall:.1f} tok/s)", flush=True)
    for engine in engines.values():
        engine.close()
    for key in ("wall_s", "cpu_s"):
        row[f"speedup_{key}"] = round(sum(c[key] for c in row["unfused"]) / sum(c[key] for c in row["fused"]), 3)
    print(f"fused vs unfused: {row['speedup_wall_s']:.3f}x wall, {row['speedup_cpu_s']:.3f}x CPU (sums of two calls each)")
    print(json.dumps(row))


def compare_compiled(args, engine_cls, tok, work: list, tokens: int, warm: list) -> None:
    """Eager and compiled engines on the same requests: (wall, CPU) of each call."""
    from rlvr.train.trainer import compile_layers

    row = {"bench": "engine_compile", "threads": args.threads, "tokens": tokens}
    for name in ("eager", "compiled"):
        engine = engine_cls(args.model, pad_token_id=tok.pad_token_id, seed=0, max_batch_size=512)
        if name == "compiled":
            compile_layers(engine.model)
        calls = []
        for label, requests in (("first call", warm), ("workload", work), ("workload again", work)):
            t0, c0 = time.perf_counter(), time.process_time()
            engine.generate_sync(requests)
            calls.append({"call": label, "wall_s": round(time.perf_counter() - t0, 2),
                          "cpu_s": round(time.process_time() - c0, 2)})
        engine.close()
        row[name] = calls
        best = min(c["wall_s"] for c in calls[1:])
        print(f"{name:>8}: first call {calls[0]['wall_s']:.1f} s (the compile, when compiled); workload "
              f"{calls[1]['wall_s']:.1f} s then {calls[2]['wall_s']:.1f} s wall ({tokens / best:.1f} tok/s at best)",
              flush=True)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
