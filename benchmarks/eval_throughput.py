"""`rlvr eval` throughput vs the embedded engine alone, same prompts, same greedy decoding.

Workload: ``--prompts`` arithmetic questions ("What is a + b? Answer with just the number."),
rendered with the checkpoint's chat template, greedy, at most ``--max-new-tokens`` tokens, stopping
at the tokenizer's EOS (SmolLM2: ``<|im_end|>``), graded by ``--rm-type math``.

- ``rlvr eval``: the command a user runs (``python -m rlvr eval --hf-checkpoint DIR
  --eval-prompt-data arith FILE --apply-chat-template --rm-type math ...``), a process of its own.
- engine: a process that loads the same checkpoint into an ``EmbeddedEngine`` and sends the same
  requests in one ``generate_sync`` call (no data set, no grading, no metrics).

Both sides are whole processes (interpreter start, imports, checkpoint load included), alternated
``--repeats`` times; wall time and the process's CPU time (``RUSAGE_CHILDREN``) are reported, and
the engine side also its generation time alone. Greedy on both sides, so the tokens are the same:
the check compares the mean response length ``rlvr eval`` reports with the engine's.

    python benchmarks/eval_throughput.py --model models/smollm2-135m-instruct [--prompts 200]

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_prompts(path: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randrange(100), rng.randrange(100)
            f.write(json.dumps({"prompt": f"What is {a} + {b}? Answer with just the number.", "label": str(a + b)}) + "\n")
    return path


def engine_child(model: str, data: str, max_new: int, threads: int) -> None:
    """The engine alone on the prompts ``rlvr eval`` renders (same template, same EOS stop)."""
    import torch

    torch.set_num_threads(threads)
    from transformers import AutoTokenizer

    from rlvr.engine.base import GenerateRequest, SamplingParams
    from rlvr.engine.local.embedded import EmbeddedEngine

    tok = AutoTokenizer.from_pretrained(model)
    rows = [json.loads(line) for line in open(data)]
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                           add_generation_prompt=True), add_special_tokens=False)["input_ids"]
               for r in rows]
    engine = EmbeddedEngine(model, pad_token_id=tok.pad_token_id, seed=0, max_batch_size=256, tokenizer=tok)
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new, stop_token_ids=(tok.eos_token_id,))
    t0 = time.perf_counter()
    out = engine.generate_sync([GenerateRequest(p, params, rid=str(i)) for i, p in enumerate(prompts)])
    gen = time.perf_counter() - t0
    engine.close()
    tokens = sum(len(r.token_ids) for r in out)
    print("RESULT " + json.dumps({"generate_s": gen, "tokens": tokens, "mean_len": tokens / len(out)}))


def timed(cmd: list[str], threads: int) -> tuple[float, float, str]:
    """Wall and CPU seconds of a child process, and its stdout."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--engine-child":
        return engine_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    data = write_prompts(Path(tempfile.mkdtemp(prefix="rlvr-eval-")) / "arith.jsonl", a.prompts)
    eval_cmd = [sys.executable, "-m", "rlvr", "eval", "--hf-checkpoint", a.model, "--eval-prompt-data", "arith",
                str(data), "--apply-chat-template", "--rm-type", "math", "--eval-max-response-len",
                str(a.max_new_tokens), "--rollout-max-response-len", str(a.max_new_tokens)]
    engine_cmd = [sys.executable, __file__, "--engine-child", a.model, str(data), str(a.max_new_tokens), str(a.threads)]
    runs: dict[str, list[tuple[float, float]]] = {"rlvr eval": [], "engine": []}
    engine_result, eval_len = None, None
    for rep in range(a.repeats):
        for side in (["rlvr eval", "engine"] if rep % 2 == 0 else ["engine", "rlvr eval"]):
            wall, cpu, out = timed(eval_cmd if side == "rlvr eval" else engine_cmd, a.threads)
            runs[side].append((wall, cpu))
            if side == "engine":
                engine_result = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT ")).split(" ", 1)[1])
            else:
                eval_len = float(next(x for x in out.splitlines() if "arith/response_len/mean" in x).split()[-1])
            print(f"  {side:<9} run {rep}: {wall:6.1f} s ({cpu:.1f} s CPU)", flush=True)
    best = {k: min(v) for k, v in runs.items()}
    tokens = engine_result["tokens"]
    row = {"bench": "eval_throughput", "model": Path(a.model).name, "prompts": a.prompts, "threads": a.threads,
           "tokens": tokens, "engine_mean_len": round(engine_result["mean_len"], 2), "eval_mean_len": eval_len,
           "eval_s": round(best["rlvr eval"][0], 2), "eval_cpu_s": round(best["rlvr eval"][1], 2),
           "engine_s": round(best["engine"][0], 2), "engine_cpu_s": round(best["engine"][1], 2),
           "engine_generate_s": round(engine_result["generate_s"], 2),
           "eval_tok_s": round(tokens / best["rlvr eval"][0], 1), "engine_tok_s": round(tokens / best["engine"][0], 1),
           "ratio": round(best["rlvr eval"][0] / best["engine"][0], 3)}
    print(f"rlvr eval {row['eval_s']} s ({row['eval_cpu_s']} s CPU) vs the engine alone {row['engine_s']} s "
          f"({row['engine_cpu_s']} s CPU; generation {row['engine_generate_s']} s): eval takes {row['ratio']:.2f}x; "
          f"mean response length {eval_len} vs {row['engine_mean_len']}")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
