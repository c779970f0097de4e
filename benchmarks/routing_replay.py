"""R3 acceptance: a bfloat16 engine samples, a float32 trainer recomputes, with and without replay.

Builds a tiny Qwen3-MoE (hidden 128, 4 layers, 16 experts, top-2), samples ``--prompts`` responses
with the embedded engine in bfloat16 (recording the routed experts), then runs the trainer's
packed forward in float32 twice: routing on its own (R3 off) and replaying the engine's experts
(R3 on). For each it prints the fraction of (token, MoE layer) pairs and of tokens whose experts
differ from the engine's -- read from the experts the trainer's MoE blocks actually received -- and
the train-inference log-prob difference |log p_train - log q| over the response tokens.

    .venv/bin/python benchmarks/routing_replay.py [--prompts 32] [--new-tokens 48]
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from benchmarks.common import set_threads


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=48)
    a = ap.parse_args()
    set_threads(1)

    from rlvr.engine.base import GenerateRequest, SamplingParams
    from rlvr.engine.local.embedded import EmbeddedEngine
    from rlvr.models.moe import RoutingRecorder
    from rlvr.models.tiny import build_tiny_model
    from rlvr.train import routing_replay
    from rlvr.train.logprobs import response_log_probs
    from rlvr.train.trainer import load_policy
    from rlvr.core.types import Sample

    path = build_tiny_model(tempfile.mkdtemp(prefix="r3-"), arch="qwen3_moe", hidden_size=128, intermediate_size=256,
                            num_layers=4, num_heads=4, num_kv_heads=2, num_experts=16, num_experts_per_tok=2)
    model = load_policy(str(path), bf16=False)
    engine = EmbeddedEngine(model, pad_token_id=256, seed=0, return_routed_experts=True, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    reqs = [GenerateRequest(torch.randint(0, 250, (12,), generator=g).tolist(), SamplingParams(max_new_tokens=a.new_tokens))
            for _ in range(a.prompts)]
    try:
        results = engine.generate_sync(reqs)
    finally:
        engine.close()
    samples = [Sample("", q.prompt_ids, response_ids=r.token_ids, rollout_log_probs=r.log_probs,
                      loss_mask=[1] * len(r.token_ids), rollout_routed_experts=r.routed_experts, index=i)
               for i, (q, r) in enumerate(zip(reqs, results))]
    width = max(s.response_length for s in samples)
    q = torch.zeros(len(samples), width)
    mask = torch.zeros(len(samples), width)
    for i, s in enumerate(samples):
        q[i, : s.response_length], mask[i, : s.response_length] = torch.tensor(s.rollout_log_probs), 1.0
    positions = sum(s.total_length - 1 for s in samples)
    print(f"engine bfloat16, trainer float32; {len(samples)} samples, {int(mask.sum())} response tokens, "
          f"{positions} positions; routing stored: {routing_replay.storage_bytes(samples)} bytes "
          f"(positions x 4 MoE layers x top-2 x 1 byte)")
    replay = routing_replay.install(model)[0]
    used = RoutingRecorder(model)  # registered after the replay hook: sees the experts actually used
    for replay.replay in (False, True):
        with torch.no_grad():
            lp, _ = response_log_probs(model, samples, 1.0, width, False)
        replay.counts()
        differ = (used.take().long().sort(-1).values != replay.plan.sort(-1).values).any(-1)  # [positions, layers]
        diff = (lp - q).abs() * mask
        print(f"R3 {'on ' if replay.replay else 'off'}: experts differ on {differ.float().mean():.4f} of (token, layer) "
              f"pairs, {differ.any(-1).float().mean():.4f} of tokens; |log p_train - log q| mean "
              f"{float(diff.sum() / mask.sum()):.5f}, max {float(diff.max()):.4f}")


if __name__ == "__main__":
    main()
