"""``--compile-layers``: each decoder layer's MLP and norms compiled (inductor, dynamic shapes) give
the eager trainer's log-probs and gradients within float tolerance, on packed rows of changing
lengths, without a recompile per length. (Exact resume of a compiled run: tests/test_resume.py.)"""

import pytest
import torch

from rlvr.algo import AlgoConfig
from rlvr.config import TrainConfig
from rlvr.train.trainer import COMPILED_PARTS, Trainer
from tests.conftest import random_samples

GROUP = 4
REWARDS = [1, 0, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0.5, 1, 0, 0]


def _run(ckpt, compiled: bool):
    """(each micro-batch's log-probs and entropies, each step's gradient, the weights after) over
    three rollouts of different packed lengths."""
    cfg = TrainConfig(hf_checkpoint=str(ckpt), lr=1e-2, use_dynamic_batch_size=True, max_tokens_per_gpu=64,
                      compile_layers=compiled)
    tr = Trainer(cfg, AlgoConfig(), n_samples_per_prompt=GROUP)
    grads, real = [], tr.optimizer.adamw.step
    tr.optimizer.adamw.step = lambda: (grads.append(torch.cat([p.grad.flatten() for p in tr.optimizer.master])), real())
    log_probs, graphs = [], []
    for rollout in range(3):
        samples = random_samples(len(REWARDS), rollout, lambda i, rng: REWARDS[i])
        width = max(s.response_length for s in samples)
        with torch.no_grad():
            for mb in tr.batches.split(samples, list(range(len(samples)))):
                log_probs.append(tr.policy.log_probs([samples[i] for i in mb], width, True))
        tr.train(rollout, samples)
        graphs.append(_graphs())
    return tr, log_probs, grads, [p.detach().clone() for p in tr.optimizer.params], graphs


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@pytest.mark.slow
def test_compiled_layers_match_eager_log_probs_and_gradients(tiny_qwen2):
    torch._dynamo.reset()
    eager, compiled = _run(tiny_qwen2, False), _run(tiny_qwen2, True)
    layer = compiled[0].model.model.layers[0]
    assert all(getattr(layer, name)._compiled_call_impl is not None for name in COMPILED_PARTS)
    assert eager[0].model.model.layers[0].mlp._compiled_call_impl is None
    assert len(eager[1]) == len(compiled[1]) >= 6  # packed micro-batches of several lengths
    for (lp_e, ent_e), (lp_c, ent_c) in zip(eager[1], compiled[1], strict=True):
        torch.testing.assert_close(lp_c, lp_e, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ent_c, ent_e, rtol=1e-5, atol=1e-5)
    for g_e, g_c in zip(eager[2], compiled[2], strict=True):
        assert (g_c - g_e).norm() <= 1e-4 * g_e.norm()
    for w_e, w_c in zip(eager[3], compiled[3], strict=True):
        torch.testing.assert_close(w_c, w_e, rtol=0, atol=1e-4)
    # dynamic shapes: the graphs compiled for the first rollout serve the later rollouts' lengths
    graphs = compiled[4]
    assert graphs[0] > 0 and graphs[2] == graphs[0], graphs
