"""The real-model demo under ``--deterministic-mode``: two runs of one seed, bit for bit, and the cost.

``rlvr demo --deterministic-mode`` runs twice (``--pair parallel``: at the same time, one torch
thread each, so each run is the other's busy neighbour and requests reach the engines at
different moments; ``--pair serial``: one after the other with ``--threads``). The check: both end
with the same held-out accuracy before and after, every value in ``metrics.jsonl`` is equal
(timings and memory aside: ``perf/*`` and ``time``), and the final checkpoint's
``model.safetensors`` has the same SHA-256. A third run without the mode (``--cost``), serial
after a deterministic one at the same thread count, gives the mode's cost: the summed
``perf/rollout_time``, ``perf/train_time`` and ``perf/eval_time`` of each run and its process CPU
time. Ends with one JSON line.

    python benchmarks/deterministic_demo.py [--pair parallel|serial] [--cost] [--threads 2] [-- extra demo flags]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMINGS = ("perf/rollout_time", "perf/train_time", "perf/eval_time")


def start(out: Path, deterministic: bool, threads: int, extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rlvr", "demo", "--threads", str(threads), "--output-dir", str(out),
           *(["--deterministic-mode"] if deterministic else []), *extra]
    log = open(out.with_suffix(".log"), "w")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": str(threads)})


def finish(proc: subprocess.Popen, out: Path, t0: float) -> dict:
    """The run's summary: demo line, logged values, weights digest, timings."""
    if proc.wait():
        sys.exit(f"{out} failed:\n{out.with_suffix('.log').read_text()[-3000:]}")
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    values = [{k: v for k, v in r.items() if k != "time" and not k.startswith("perf/")} for r in records]
    (latest,) = sorted((out / "checkpoints").glob("rollout_*"))[-1:]
    digest = hashlib.sha256((latest / "model.safetensors").read_bytes()).hexdigest()
    line = next(x for x in out.with_suffix(".log").read_text().splitlines() if x.startswith("demo: "))
    evals = [r for r in records if "eval/step" in r]
    score = next(k for k in evals[0] if k.endswith("/score"))
    return {"dir": str(out), "line": line, "before": evals[0][score], "after": evals[-1][score], "values": values,
            "sha256": digest, "wall_s": round(wall, 1),
            **{k: round(sum(r.get(k, 0.0) for r in records), 2) for k in TIMINGS}}


def run_pair(root: Path, mode: str, threads: int, extra: list[str]) -> list[dict]:
    outs = [root / "det-a", root / "det-b"]
    if mode == "parallel":  # one thread each: the two runs share the machine's cores
        t0 = time.perf_counter()
        procs = [start(o, True, 1, extra) for o in outs]
        return [finish(p, o, t0) for p, o in zip(procs, outs)]
    runs = []
    for o in outs:
        t0 = time.perf_counter()
        runs.append(finish(start(o, True, threads, extra), o, t0))
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", choices=["parallel", "serial"], default="parallel")
    ap.add_argument("--cost", action="store_true", help="also time a deterministic run against one without the mode")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default="runs/deterministic-demo")
    ap.add_argument("extra", nargs="*", help="flags passed to every `rlvr demo` (after --)")
    a = ap.parse_args()
    root = (ROOT / a.workdir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    first, second = run_pair(root, a.pair, a.threads, a.extra)
    equal = sum(x == y for x, y in zip(first["values"], second["values"]))
    same = first["values"] == second["values"] and first["sha256"] == second["sha256"]
    print(f"run A: {first['line']}\nrun B: {second['line']}")
    print(f"{equal} of {len(first['values'])} metric records equal; weights sha256 {first['sha256'][:16]}... "
          f"{'==' if first['sha256'] == second['sha256'] else '!='} {second['sha256'][:16]}...")
    result = {"bench": "deterministic_demo", "pair": a.pair, "identical": same, "records_equal": equal,
              "records": len(first["values"]), "before": [first["before"], second["before"]],
              "after": [first["after"], second["after"]], "sha256": [first["sha256"], second["sha256"]]}
    if a.cost:
        timed = {}
        for name, det in (("deterministic", True), ("plain", False)):
            out, c0 = root / f"cost-{name}", resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            r = finish(start(out, det, a.threads, a.extra), out, t0)
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            timed[name] = {"wall_s": r["wall_s"], "cpu_s": round(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime, 1),
                           **{k: r[k] for k in TIMINGS}, "after": r["after"]}
            print(f"{name}: {r['line']} ({timed[name]})")
        d, p = timed["deterministic"], timed["plain"]
        result["cost"] = {**timed, **{f"ratio_{k.split('/')[1]}": round(d[k] / p[k], 2) for k in TIMINGS},
                          "ratio_wall": round(d["wall_s"] / p["wall_s"], 2), "ratio_cpu": round(d["cpu_s"] / p["cpu_s"], 2)}
    print(json.dumps(result))
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
