"""Shared pieces of the benchmarks: the models, a realistic RL length distribution and the chat
workload's flags. Importing it loads no torch (a benchmark sets its threads first)."""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlvr.core.types import Sample

# "tiny": the demo's model shape (NOTES.md: 4 layers, hidden 256, 2.7M parameters);
# "20m": the same family scaled to ~19M parameters.
MODELS = {
    "tiny": dict(hidden_size=256, intermediate_size=768, num_layers=4, num_heads=4, num_kv_heads=2),
    "20m": dict(hidden_size=512, intermediate_size=1536, num_layers=6, num_heads=8, num_kv_heads=4),
    # ~104M parameters (LoRA's memory benchmark: benchmarks/train_memory.py --lora-rank 16)
    "100m": dict(hidden_size=768, intermediate_size=3072, num_layers=12, num_heads=12, num_kv_heads=4),
}


def set_threads(n: int = 2) -> None:
    import torch

    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)


def chat_workload_parser(description: str) -> argparse.ArgumentParser:
    """A parser with the flags of the SmolLM2 chat workload that ``vllm_engines.py`` times and
    ``engine_profile.py`` profiles: ``--prompts`` ``chat_prompts`` x 8 samples with long-tailed
    budgets (``rollout_throughput.budgets``: median ``--median-len``, at most ``--max-len``)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default="models/smollm2-135m-instruct")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--median-len", type=int, default=48)
    p.add_argument("--max-len", type=int, default=192)
    p.add_argument("--threads", type=int, default=1)
    return p


def model_dir(name: str, root: str | Path) -> Path:
    from rlvr.models.tiny import build_tiny_model

    out = Path(root) / name
    if not (out / "config.json").is_file():
        build_tiny_model(out, max_position_embeddings=4096, **MODELS[name])
    return out


def rl_samples(n_prompts: int, n_per_prompt: int, max_response: int, seed: int = 0) -> list[Sample]:
    """GRPO-shaped samples: prompts of 40-200 tokens shared by their group; response lengths
    log-normal (median ~max/5, long tail), truncated at ``max_response`` (a reasoning rollout where
    ~5-10% of responses hit the limit). Rewards alternate so advantages are non-zero."""
    from rlvr.core.types import Sample

    rng = random.Random(seed)
    out = []
    for g in range(n_prompts):
        prompt = [rng.randrange(0, 256) for _ in range(rng.randint(40, 200))]
        for j in range(n_per_prompt):
            r = int(min(max(rng.lognormvariate(0, 0.9) * max_response / 5, 8), max_response))
            resp = [rng.randrange(0, 256) for _ in range(r)]
            out.append(Sample("", prompt, response_ids=resp, loss_mask=[1] * r, rollout_log_probs=[-5.5] * r,
                              reward=float(j % 2), group_index=g, index=len(out)))
    return out


def chat_prompts(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` arithmetic questions rendered as the user turn of ``tokenizer``'s chat template
    (SmolLM2's adds its default system prompt: 46-48 tokens each), as token ids."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        question = f"What is {rng.randrange(100)} + {rng.randrange(100)}? Answer with just the number."
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def chat_samples(tokenizer, n_prompts: int, n_per_prompt: int, max_response: int, seed: int = 0,
                 full: bool = False) -> list[Sample]:
    """GRPO-shaped samples on ``chat_prompts``: every response ``max_response`` tokens (``full``,
    the worst case of a length limit) or RL's long tail (log-normal, median ~max/5, as
    ``rl_samples``); token ids drawn from the vocabulary, rewards alternating."""
    from rlvr.core.types import Sample

    rng = random.Random(seed)
    out = []
    for g, prompt in enumerate(chat_prompts(tokenizer, n_prompts, seed)):
        for j in range(n_per_prompt):
            r = max_response if full else int(min(max(rng.lognormvariate(0, 0.9) * max_response / 5, 8), max_response))
            resp = [rng.randrange(len(tokenizer)) for _ in range(r)]
            out.append(Sample("", prompt, response_ids=resp, loss_mask=[1] * r, rollout_log_probs=[-2.0] * r,
                              reward=float(j % 2), group_index=g, index=len(out)))
    return out
