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
MODEL = dict(hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4, num_kv_heads=2)


def write_data() -> None:
    train, test = problems()
    ASSETS.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        (ASSETS / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def sft_sample(turns, tok, row: dict):
    from rlvr.types import Sample

    a, b = row["metadata"]["a"], row["metadata"]["b"]
    _, prompt_ids = turns.prompt_ids([{"role": "user", "content": row["prompt"]}])
    s = Sample(row["prompt"], prompt_ids)
    call = turns.encode(call_text(a, b))
    s.append_segment(call, trainable=True, log_probs=[0.0] * len(call))
    obs_text, obs = turns.observation_ids([{"role": "tool", "content": str(a * b)}], call)
    s.append_segment(obs, trainable=False, text=obs_text)
    answer = turns.encode(str(a * b)) + [tok.eos_token_id]
    s.append_segment(answer, trainable=True, log_probs=[0.0] * len(answer))
    return s


def sft(steps: int, batch: int = 16, lr: float = 2e-3, resume: bool = False) -> Path:
    from rlvr.agents.tools import tool_schemas
    from rlvr.agents.turns import ChatTurns
    from rlvr.algo import AlgoConfig
    from rlvr.build import load_tokenizer, save_hf
    from rlvr.config import TrainConfig
    from rlvr.models.tiny import build_tiny_model
    from rlvr.train.trainer import Trainer
    from examples.tools.calculator import TOOLS

    base = ASSETS / "sft" if resume else build_tiny_model(ASSETS / "base", **MODEL)
    tok = load_tokenizer(str(base))
    turns = ChatTurns(tok, tool_schemas({t.__name__: t for t in TOOLS}))
    rows = [json.loads(line) for line in (ASSETS / "train.jsonl").read_text().splitlines()]
    tr = Trainer(TrainConfig(hf_checkpoint=str(base), lr=lr, clip_grad=0.0, adam_beta2=0.999,
                             micro_batch_size=batch), AlgoConfig())
    rng = random.Random(1 if resume else 0)  # a resumed SFT sees a new order of the problems
    t0 = time.perf_counter()
    for step in range(steps):
        m = tr.train_sft([sft_sample(turns, tok, r) for r in rng.sample(rows, batch)])
        if step % 50 == 0 or step == steps - 1:
            print(f"sft step {step}: loss {m['train/loss']:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    save_hf(tr.model, tok, ASSETS / "sft")
    return ASSETS / "sft"


def grpo(num_rollout: int, extra: list[str]) -> Path:
    from rlvr.config import parse_config
    from rlvr.loop import run

    argv = ["--hf-checkpoint", str(ASSETS / "sft"), "--prompt-data", str(ASSETS / "train.jsonl"),
            "--apply-chat-template", "--tools", "examples.tools.calculator:TOOLS", "--max-turns", "2",
            "--custom-rm-path", "examples.tools.calculator:final_answer",
            "--rollout-batch-size", "16", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "96",
            "--rollout-temperature", "1.0", "--num-rollout", str(num_rollout),
            "--lr", "3e-4", "--adam-beta2", "0.999", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "8192",
            "--eval-prompt-data", "tools", str(ASSETS / "test.jsonl"), "--eval-interval", "5",
            "--output-dir", "runs/tools-grpo", *extra]
    return run(parse_config(argv))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sft-steps", type=int, default=200)
    p.add_argument("--num-rollout", type=int, default=30)
    p.add_argument("--skip-sft", action="store_true")
    p.add_argument("--resume-sft", action="store_true", help="continue the SFT from assets/sft")
    args, extra = p.parse_known_args()
    torch.set_num_threads(2)
    t0 = time.perf_counter()
    write_data()
    if not args.skip_sft:
        sft(args.sft_steps, resume=args.resume_sft)
    run_dir = grpo(args.num_rollout, extra)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/step" in r]
    for r in evals:
        print(f"eval at rollout {r['eval/step']:3d}: held-out accuracy with tools {r['eval/tools/score']:.3f}, "
              f"tool calls/sample {r.get('eval/tools/tool_calls/mean', 0):.2f}")
    print(f"tools example: {evals[0]['eval/tools/score']:.3f} -> {evals[-1]['eval/tools/score']:.3f} "
          f"({100 * (evals[-1]['eval/tools/score'] - evals[0]['eval/tools/score']):+.1f} points) "
          f"in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
