"""The tools example end to end: tiny model, a short multi-turn SFT that teaches the call format,
then GRPO with the calculator tool (``--tools``), held-out accuracy with tools before -> after.

    python -m examples.tools.run [--sft-steps N] [--num-rollout N]

Assets go to ``examples/tools/assets/`` (git-ignored): ``base/`` (tiny Qwen2), ``train.jsonl`` /
``test.jsonl``, ``sft/``. The SFT samples are built exactly as the rollout builds them: the call
(loss mask 1), the tool result through the chat template (loss mask 0: ``ChatTurns``), the answer.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from examples.tools.calculator import call_text, problems

HERE = Path(__file__).parent
ASSETS = HERE / "assets"
N_VAL = 200
MODEL = dict(hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4, num_kv_heads=2)


def write_data() -> None:
    train, test = problems()
    train, val = train[N_VAL:], train[:N_VAL]  # settings are chosen on val; test is reported
    ASSETS.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("val", val), ("test", test)):
        (ASSETS / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def sft_sample(turns, tok, row: dict, use_tool: bool = True):
    """One SFT sample: the call, the tool's result (masked), the answer; or (``use_tool`` False)
    the answer written directly, which the model cannot learn to get right (it cannot multiply)."""
    from rlvr.api import Sample

    a, b = row["metadata"]["a"], row["metadata"]["b"]
    _, prompt_ids = turns.prompt_ids([{"role": "user", "content": row["prompt"]}])
    s = Sample(row["prompt"], prompt_ids)
    if not use_tool:
        answer = turns.encode(str(a * b)) + [tok.eos_token_id]
        return s.append_segment(answer, trainable=True, log_probs=[0.0] * len(answer))
    call = turns.encode(call_text(a, b))
    s.append_segment(call, trainable=True, log_probs=[0.0] * len(call))
    obs_text, obs = turns.observation_ids([{"role": "tool", "content": str(a * b)}], call)
    s.append_segment(obs, trainable=False, text=obs_text)
    answer = turns.encode(str(a * b)) + [tok.eos_token_id]
    s.append_segment(answer, trainable=True, log_probs=[0.0] * len(answer))
    return s


def sft(tool_rounds: list[int], direct_steps: int, direct_lr: float, batch: int = 16, lr: float = 2e-3,
          resume: bool = False) -> Path:
    """Two short SFT phases: rounds of steps on samples that call the tool (the format, copying the
    result; each round a fresh optimizer from the last round's weights and its own data order),
    then ``direct_steps`` on samples that answer directly -- which the model cannot get right -- so
    that it starts GRPO calling the tool only *sometimes*. Saves ``assets/sft``; with ``resume`` the
    tool phase is skipped (its result, ``assets/sft-tool``, is reused)."""
    from rlvr.agents.tools import tool_schemas
    from rlvr.agents.turns import ChatTurns
    from rlvr.algo import AlgoConfig
    from rlvr.runtime.build import load_tokenizer, save_hf
    from rlvr.config import TrainConfig
    from rlvr.models.tiny import build_tiny_model
    from rlvr.train.trainer import Trainer
    from examples.tools.calculator import TOOLS

    base = build_tiny_model(ASSETS / "base", **MODEL)
    tok = load_tokenizer(str(base))
    turns = ChatTurns(tok, tool_schemas({t.__name__: t for t in TOOLS}))
    rows = [json.loads(line) for line in (ASSETS / "train.jsonl").read_text().splitlines()]
    t0 = time.perf_counter()
    tool = [("tool", steps, True, base if k == 0 else ASSETS / "sft-tool", lr, k) for k, steps in enumerate(tool_rounds)]
    for phase, steps, use_tool, start, rate, seed in ([] if resume else tool) + [
            ("direct", direct_steps, False, ASSETS / "sft-tool", direct_lr, 0)]:
        tr = Trainer(TrainConfig(hf_checkpoint=str(start), lr=rate, clip_grad=0.0, adam_beta2=0.999,
                                 micro_batch_size=batch), AlgoConfig())
        rng = random.Random(seed)
        for step in range(steps):
            m = tr.train_sft([sft_sample(turns, tok, r, use_tool) for r in rng.sample(rows, batch)])
            if step % 100 == 0 or step == steps - 1:
                print(f"sft ({phase}) step {step}: loss {m['train/loss']:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
        save_hf(tr.model, tok, ASSETS / ("sft-tool" if phase == "tool" else "sft"))
    return ASSETS / "sft"


def grpo(num_rollout: int, extra: list[str]) -> Path:
    from rlvr.runtime.configure import parse_config
    from rlvr.runtime.loop import run

    argv = ["--hf-checkpoint", str(ASSETS / "sft"), "--prompt-data", str(ASSETS / "train.jsonl"),
            "--apply-chat-template", "--tools", "examples.tools.calculator:TOOLS", "--max-turns", "2",
            "--custom-rm-path", "examples.tools.calculator:final_answer",
            "--rollout-batch-size", "16", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "96",
            "--rollout-temperature", "1.0", "--num-rollout", str(num_rollout),
            "--lr", "3e-4", "--adam-beta2", "0.999", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "8192",
            "--eval-prompt-data", "val", str(ASSETS / "val.jsonl"), "test", str(ASSETS / "test.jsonl"),
            "--eval-interval", "5",
            "--output-dir", "runs/tools-grpo", *extra]
    return run(parse_config(argv))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sft-steps", default="450,200", help="SFT steps on samples that call the tool, in rounds (comma-separated)")
    p.add_argument("--direct-steps", type=int, default=8, help="then SFT steps on samples that answer directly")
    p.add_argument("--direct-lr", type=float, default=1e-4, help="learning rate of the direct-answer steps")
    p.add_argument("--num-rollout", type=int, default=25)
    p.add_argument("--skip-sft", action="store_true")
    p.add_argument("--resume-sft", action="store_true", help="reuse the tool phase's result (assets/sft-tool)")
    args, extra = p.parse_known_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    write_data()
    if not args.skip_sft:
        sft([int(x) for x in args.sft_steps.split(",")], args.direct_steps, args.direct_lr, resume=args.resume_sft)
    run_dir = grpo(args.num_rollout, extra)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/step" in r]
    for r in evals:
        print(f"eval at rollout {r['eval/step']:3d}: " + ", ".join(
            f"{s} accuracy with tools {r[f'eval/{s}/score']:.3f} tool calls/sample "
            f"{r.get(f'eval/{s}/tool_calls/mean', 0):.2f}" for s in ("val", "test")), flush=True)
    first, last = evals[0]["eval/test/score"], evals[-1]["eval/test/score"]
    print(f"tools example (test split): {first:.3f} -> {last:.3f} ({100 * (last - first):+.1f} points), tool calls/sample "
          f"{evals[0].get('eval/test/tool_calls/mean', 0):.2f} -> {evals[-1].get('eval/test/tool_calls/mean', 0):.2f}, "
          f"in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
