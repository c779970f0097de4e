"""The embedded engine's fused q/k/v and gate/up projections: same outputs as the model's own
linears, weight updates reach the fused GEMM through the members' views, the trainer's module is
never fused."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.local.embedded import EmbeddedEngine
from rlvr.engine.local.fused import FusedSlice, fuse_projections
from rlvr.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("llama"), arch="llama")


@pytest.fixture(params=["qwen2", "llama"])
def checkpoint(request, tiny_qwen2, tiny_llama):
    return tiny_qwen2 if request.param == "qwen2" else tiny_llama  # qwen2 has q/k/v biases, llama none


def _ids(n: int = 2, t: int = 9) -> torch.Tensor:
    return torch.randint(3, 200, (n, t), generator=torch.Generator().manual_seed(0))


def test_fused_model_gives_the_unfused_logits(checkpoint):
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    fused = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    groups = fuse_projections(fused)
    assert len(groups) == 2 * fused.config.num_hidden_layers
    assert dict(fused.state_dict()).keys() == dict(model.state_dict()).keys()
    with torch.no_grad():
        torch.testing.assert_close(fused(_ids()).logits, model(_ids()).logits, atol=1e-5, rtol=0)
        attn, ref = fused.model.layers[0].self_attn, model.model.layers[0].self_attn
        x = torch.randn(3, 5, model.config.hidden_size)
        # one member on an input of its own, then the group on another: each its own output
        torch.testing.assert_close(attn.k_proj(x), ref.k_proj(x), atol=1e-5, rtol=0)
        y = x + 1
        for name in ("q_proj", "k_proj", "v_proj"):
            torch.testing.assert_close(getattr(attn, name)(y), getattr(ref, name)(y), atol=1e-5, rtol=0)
        assert groups[0]._out is None  # no activations held between forwards


def test_update_weights_reach_the_fused_tensors_and_wake_rebinds(checkpoint):
    tok = AutoTokenizer.from_pretrained(checkpoint)
    eng = EmbeddedEngine(checkpoint, pad_token_id=tok.pad_token_id, seed=0, fuse_projections=True)
    assert eng.fused and isinstance(eng.model.model.layers[0].mlp.gate_proj, FusedSlice)
    other = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.1)

    def check():
        with torch.no_grad():
            torch.testing.assert_close(eng.model(_ids()).logits, other(_ids()).logits, atol=1e-5, rtol=0)
        g = eng.fused[0]
        assert g.weight.data_ptr() == g.members[0].weight.data_ptr()

    eng.update_weights(dict(other.named_parameters()), version=1)
    check()
    eng.sleep()
    assert sum(p.numel() for p in eng.model.parameters()) == 0 and all(g.weight.numel() == 0 for g in eng.fused)
    eng.wake()
    eng.update_weights(dict(other.named_parameters()), version=2)
    check()
    eng.close()


def test_engine_samples_the_same_with_and_without_fusion(tiny_qwen2):
    """Greedy tokens equal and log-probs within float tolerance, in deterministic mode too."""
    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    prompts = [tok(s, add_special_tokens=False)["input_ids"] for s in ("12+34=", "7-3=", "100+1=")]
    reqs = [GenerateRequest(p, SamplingParams(temperature=0.0 if i % 2 else 1.0, max_new_tokens=12, seed=i))
            for i, p in enumerate(prompts * 3)]
    out = {}
    for fuse in (False, True):
        for det in (False, True):
            eng = EmbeddedEngine(tiny_qwen2, pad_token_id=tok.pad_token_id, seed=0, deterministic=det,
                                 fuse_projections=fuse)
            out[fuse, det] = eng.generate_sync(reqs)
            if det:
                again = eng.generate_sync(reqs)
                assert [r.log_probs for r in again] == [r.log_probs for r in out[fuse, det]]  # bit for bit
            eng.close()
    for det in (False, True):
        for a, b in zip(out[False, det], out[True, det], strict=True):
            assert a.token_ids == b.token_ids
            torch.testing.assert_close(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5, rtol=0)


def test_the_trainers_module_is_never_fused(tiny_qwen2):
    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2).eval()
    eng = EmbeddedEngine(model, pad_token_id=tok.pad_token_id, share_weights=True, fuse_projections=True)
    assert eng.fused == [] and type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    eng.close()
