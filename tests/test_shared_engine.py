"""The embedded engine on the trainer's own weights (``share_weights``; local synchronous runs):
it samples exactly what an engine on a copy samples, before and after an optimizer step, keeps
the trainer's module trainable, and refuses tensors that are not the trainer's."""

import pytest
import torch
from transformers import AutoTokenizer

from rlvr.config import TrainConfig
from rlvr.config.algo import AlgoConfig
from rlvr.core.types import Sample
from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.local.embedded import EmbeddedEngine
from rlvr.runtime.build import build_local, engine_shares_trainer_weights
from rlvr.runtime.configure import parse_config
from rlvr.train.trainer import Trainer


def _requests(tok, seed: int) -> list[GenerateRequest]:
    prompts = [tok(x, add_special_tokens=False)["input_ids"] for x in ("12+34=", "7-3=")]
    return [GenerateRequest(p, SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=(), seed=seed + i))
            for p in prompts for i in range(3)]


def _same(a, b) -> bool:
    """Same tokens and versions; log-probs to float rounding (the copy's buffers are laid out anew,
    which can change a GEMM's summation order: 4.8e-7 seen on the tiny model)."""
    return all(x.token_ids == y.token_ids and x.weight_version == y.weight_version
               and torch.allclose(torch.tensor(x.log_probs), torch.tensor(y.log_probs), atol=1e-5, rtol=0)
               for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("recompute", [False, True])
def test_shared_engine_samples_what_a_copy_samples_across_a_step(tiny_qwen2, recompute):
    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    tr = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2), lr=1e-2, recompute_activations=recompute), AlgoConfig(),
                 n_samples_per_prompt=3)
    shared = EmbeddedEngine(tr.model, pad_token_id=tok.pad_token_id, seed=0, share_weights=True)
    copy = EmbeddedEngine(tr.model, pad_token_id=tok.pad_token_id, seed=0)
    try:
        assert shared.model is tr.model and all(p.requires_grad for p in tr.model.parameters())
        first = shared.generate_sync(_requests(tok, 0))
        assert _same(first, copy.generate_sync(_requests(tok, 0)))
        samples = [Sample("", r.prompt_ids, response_ids=res.token_ids, loss_mask=[1] * 12,
                          rollout_log_probs=res.log_probs, reward=float(i % 2), index=i)
                   for i, (r, res) in enumerate(zip(_requests(tok, 0), first))]
        tr.train(0, samples)
        for eng in (shared, copy):
            eng.update_weights(tr.weights(), 1)
        after = shared.generate_sync(_requests(tok, 0))
        assert _same(after, copy.generate_sync(_requests(tok, 0)))
        # (with recomputation on, a decode step that dropped its KV cache would see only its last
        # token and sample from other log-probs than the copy's)
        assert after[0].weight_version == 1 and [r.log_probs for r in after] != [r.log_probs for r in first]
    finally:
        shared.close()
        copy.close()


def test_shared_engine_refuses_tensors_that_are_not_the_trainers(tiny_qwen2):
    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    tr = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2)), AlgoConfig())
    eng = EmbeddedEngine(tr.model, pad_token_id=tok.pad_token_id, share_weights=True)
    name, param = next(iter(tr.model.named_parameters()))
    before = param.detach().clone()
    with pytest.raises(KeyError, match="trainer's own weights"):
        eng.update_weights({name: torch.zeros_like(param)}, 1)
    assert torch.equal(param, before) and eng.weight_version == 0
    with pytest.raises(ValueError, match="computes on the module's own"):
        EmbeddedEngine(tr.model, pad_token_id=0, share_weights=True, dtype=torch.bfloat16)


def test_local_sync_runs_share_and_other_modes_copy(tiny_qwen2, arith_files, tmp_path):
    train, _ = arith_files
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(train), "--rm-type", "math",
            "--output-dir", str(tmp_path)]
    assert engine_shares_trainer_weights(parse_config(base))
    for extra in (["--async"], ["--update-weights-interval", "2"], ["--colocate"]):
        assert not engine_shares_trainer_weights(parse_config(base + extra)), extra
    with build_local(parse_config(base)) as c:
        assert c.rollout.engine.model is c.trainer.model
