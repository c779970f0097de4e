"""How many responses per second a reward grades on one CPU core (acceptance: math >= 500/s).

The responses are realistic and all distinct: every case of tests/data/math_cases*.jsonl (boxed
LaTeX, fractions, intervals, matrices, units, multiple choice, malformed and pathological ones;
reasoning-model thinking blocks, GSM8K ``####`` answers, hedges, truncated reasoning) plus
generated arithmetic rollouts, 8 samples per prompt as GRPO draws them, in the formats a model
writes (boxed, "The answer is", "Answer:", a bare number, a worked line, a fraction, wrong answers
nearby). Torch is not involved; the process is pinned to one core when the OS allows it.
Grading goes through ``rlvr.rewards.Grader`` group by group, exactly as the rollout calls it.
The first WARMUP responses (imports, regex compilation) are graded before the clock starts.
``responses_per_s`` is wall-clock; ``responses_per_cpu_s`` divides by the process's CPU time,
which other processes sharing the core cannot inflate.

    python benchmarks/reward_throughput.py --n 4000

The last line is JSON: {"bench": "reward_throughput", "rm_type": ..., "responses_per_s": ...}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import time
from pathlib import Path

CASES = sorted((Path(__file__).resolve().parent.parent / "tests" / "data").glob("math_cases*.jsonl"))
WARMUP = 20
SAMPLES_PER_PROMPT = 8


def _arith_group(rng: random.Random) -> list[tuple[str, str]]:
    """One prompt's 8 sampled responses: (response, label); about 60% right."""
    a, b = rng.randint(10, 9999), rng.randint(10, 9999)
    op = rng.choice("+-*/")
    if op == "/":
        label = rf"\frac{{{a}}}{{{b}}}"
        right = [rf"\boxed{{\frac{{{a}}}{{{b}}}}}", f"The answer is {a}/{b}.", rf"$\dfrac{{{a}}}{{{b}}}$"]
        wrong = [rf"\boxed{{\frac{{{b}}}{{{a}}}}}", f"Answer: {a}/{b + 1}", rf"\boxed{{{round(a / b, 2)}}}"]
    else:
        value = a + b if op == "+" else a - b if op == "-" else a * b
        label = str(value)
        right = [
            rf"{a}{op}{b} = \boxed{{{value}}}",
            f"First {a} {op} {b}. The answer is {value}.",
            f"Answer: {value:,}",
            f"{a}{op}{b}={value}",
            f"Let me work it out step by step.\nWe compute {a} {op} {b} = {value}.\nSo the result is {value}.",
        ]
        wrong = [rf"\boxed{{{value + rng.choice([-10, -1, 1, 10])}}}", f"The answer is {-value}.", f"{value * 10}",
                 f"I am not sure how to compute {a} {op} {b}."]
    picks = [rng.choice(right) if rng.random() < 0.6 else rng.choice(wrong) for _ in range(SAMPLES_PER_PROMPT)]
    return [(p, label) for p in picks]


def build_responses(n: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = [(c["response"], c["label"]) for path in CASES for c in map(json.loads, path.read_text().splitlines())]
    seen = set(rows)
    while len(rows) < n:
        for row in _arith_group(rng):
            if row not in seen:  # distinct responses only: no cache can grade a repeat for free
                seen.add(row)
                rows.append(row)
    rng.shuffle(rows)
    return rows[:n]


def pin_to_one_core() -> str:
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no os.sched_setaffinity)"
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return f"pinned to core {core}"


async def _grade_all(grader, groups) -> None:
    for group in groups:  # one core: concurrency would add no CPU, only interleaving
        await grader.grade_group(group)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4000, help="responses to grade (>= 2000)")
    ap.add_argument("--rm-type", default="math")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.n < 2000:
        ap.error("--n must be >= 2000 for a stable rate")
    pinned = pin_to_one_core()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from rlvr.rewards import Grader, RewardConfig
    from rlvr.core.types import Sample

    grader = Grader(RewardConfig(rm_type=args.rm_type))  # the rollout's own path, failures contained
    samples = [Sample("", [], label=label, response=response) for response, label in build_responses(
        args.n + WARMUP, args.seed)]
    asyncio.run(_grade_all(grader, [samples[:WARMUP]]))
    samples = samples[WARMUP:]
    groups = [samples[i : i + SAMPLES_PER_PROMPT] for i in range(0, len(samples), SAMPLES_PER_PROMPT)]
    wall, cpu = time.perf_counter(), time.process_time()
    asyncio.run(_grade_all(grader, groups))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rate, cpu_rate = len(samples) / wall, len(samples) / cpu
    right = sum(s.scalar_reward() > 0 for s in samples) / len(samples)
    failed = sum("reward_error" in s.metadata for s in samples)
    print(f"{args.rm_type}: {len(samples)} distinct responses, {wall:.2f} s wall / {cpu:.2f} s CPU "
          f"({pinned}, load average {os.getloadavg()[0]:.1f}): {rate:.0f} responses/s "
          f"({cpu_rate:.0f} per CPU-second); {right:.0%} graded right, {failed} grading failures")
    print(json.dumps({"bench": "reward_throughput", "rm_type": args.rm_type, "responses_per_s": round(rate, 1),
                      "responses_per_cpu_s": round(cpu_rate, 1), "n": len(samples)}))


if __name__ == "__main__":
    main()
