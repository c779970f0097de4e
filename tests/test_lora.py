"""LoRA on PEFT (rlvr.train.lora): exact gradients under packing, exact adapter sync to the
engine, only adapters trained, reference = adapter disabled, checkpoints and export, bad input."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.algo import AlgoConfig, actor_loss, aggregate_loss, global_denominator
from rlvr.config import TrainConfig
from rlvr.engine.base import GenerateRequest, SamplingParams
from rlvr.engine.local.embedded import EmbeddedEngine
from rlvr.core.errors import ConfigError
from rlvr.train import lora
from rlvr.train.trainer import Trainer
from rlvr.core.types import Sample
from tests.conftest import random_samples

peft = pytest.importorskip("peft")

ALGO = dict(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="low_var_kl")


def lora_trainer(ckpt, rank=4, **train) -> Trainer:
    cfg = TrainConfig(hf_checkpoint=str(ckpt), lr=1e-3, lora_rank=rank, **train)
    return Trainer(cfg, AlgoConfig(**ALGO), temperature=0.9, n_samples_per_prompt=4)


def perturb_adapters(model, seed=0) -> None:
    """B = 0 at start (policy == base); give the adapters values so the policy differs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lora.adapter_weights(model).values():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def test_only_adapters_train_and_the_reference_is_the_base_without_a_copy(tiny_qwen2):
    tr = lora_trainer(tiny_qwen2)
    trainable = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert tr.reference.model is tr.model  # no second copy of the weights
    # all-linear: every projection of every layer, never the output layer
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
    before = {n: p.clone() for n, p in tr.model.named_parameters() if not p.requires_grad}
    perturb_adapters(tr.model)
    samples = random_samples(8, 0, lambda i, rng: float(i % 2))
    m = tr.train(0, samples)
    assert m["train/kl_loss"] > 0  # the policy (adapters on) differs from the reference (adapters off)
    assert all(torch.equal(p, before[n]) for n, p in tr.model.named_parameters() if not p.requires_grad)
    ids = torch.tensor([samples[0].prompt_ids + samples[0].response_ids])
    with lora.reference(tr.policy.lora.peft):
        assert torch.allclose(tr.model(ids).logits, base(ids).logits, atol=1e-5)
    assert len(tr.optimizer.adamw.state) == len(trainable)  # AdamW state for the adapters only


def test_packed_lora_gradients_equal_peft_unpacked(tiny_qwen2):
    """The trainer's GRPO + KL step (packed micro-batches, several of them) against PEFT's own
    model on the same batch, one unpadded sample at a time through its plain forward."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    samples = random_samples(8, 1, lambda i, rng: float(rng.random() > 0.5))
    tr = lora_trainer(tiny_qwen2, use_dynamic_batch_size=True, max_tokens_per_gpu=28, clip_grad=0.0)
    assert len(tr.batches.split(samples, list(range(8)))) >= 3
    perturb_adapters(tr.model)
    before = {k: v.clone() for k, v in get_peft_model_state_dict(tr.policy.lora.peft).items()}  # the step moves them
    batch = tr.rollouts.build(samples)
    names = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    captured = {}
    real_step = tr.optimizer.adamw.step

    def capture():
        captured.update({n: p.grad.clone() for n, p in tr.model.named_parameters() if p.requires_grad})
        real_step()

    tr.optimizer.adamw.step = capture
    tr.train(0, samples)

    # PEFT's model, unpacked: one sample per forward, no packing, no padding
    ref = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32),
                              peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    set_peft_model_state_dict(ref, before)
    ref.eval()
    algo = AlgoConfig(**ALGO)
    denominator = global_denominator([batch.mask], False)
    for i, s in enumerate(samples):
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logits = ref(input_ids=ids).logits[0, len(s.prompt_ids) - 1:-1] / 0.9
        lp = torch.zeros(1, batch.width)
        lp = lp.index_put((torch.zeros(s.response_length, dtype=torch.long), torch.arange(s.response_length)),
                          logits.log_softmax(-1).gather(-1, torch.tensor(s.response_ids)[:, None])[:, 0])
        row = [i]
        old = lp.detach() if batch.p0_in_loss else batch.old_log_probs[row]  # on-policy: p0 is this forward's
        loss_tok, _ = actor_loss(lp, torch.zeros_like(lp), old, batch.rollout_log_probs[row],
                                 batch.advantages[row], batch.mask[row], batch.ref_log_probs[row], algo)
        aggregate_loss(loss_tok, batch.mask[row], False, denominator).backward()
    ref_grads = {n.removeprefix("base_model.model."): p.grad for n, p in ref.named_parameters() if p.requires_grad}
    ours = torch.cat([captured[n].flatten() for n in names])
    theirs = torch.cat([ref_grads[n].flatten() for n in names])
    assert ours.norm() > 0
    rel = float((ours - theirs).abs().max() / theirs.abs().max())
    print(f"packed LoRA vs PEFT unpacked: max rel diff {rel:.2e}")
    assert rel <= 1e-6


@pytest.mark.parametrize("engine_from", ["trainer_copy", "checkpoint"])
def test_engine_log_probs_after_adapter_sync_equal_the_trainers(tiny_qwen2, engine_from):
    """The engine (a copy of the trainer's LoRA model, or a Ray engine actor's ``engine_model``)
    receives only the adapters and then samples with the trainer's log-probs."""
    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    tr = lora_trainer(tiny_qwen2)
    model = tr.model if engine_from == "trainer_copy" else lora.engine_model(tr.cfg)
    eng = EmbeddedEngine(model, pad_token_id=tok.pad_token_id, seed=3)
    perturb_adapters(tr.model, seed=1)
    sent = tr.weights()
    assert set(sent) == {n for n, p in tr.model.named_parameters() if p.requires_grad}
    eng.update_weights(sent, 1)
    prompts = [tok(x, add_special_tokens=False)["input_ids"] for x in ["1+2=", "30-4=", "5+5="]]
    res = eng.generate_sync([GenerateRequest(p, SamplingParams(temperature=0.9, max_new_tokens=6))
                             for p in prompts for _ in range(2)])
    samples = [Sample("", prompts[i // 2], response_ids=r.token_ids, rollout_log_probs=r.log_probs,
                      loss_mask=[1] * len(r.token_ids)) for i, r in enumerate(res)]
    width = max(s.response_length for s in samples)
    with torch.no_grad():
        lp, _ = tr.policy.log_probs(samples, width, False)
    diffs = torch.cat([(lp[i, :s.response_length] - torch.tensor(s.rollout_log_probs)).abs()
                       for i, s in enumerate(samples)])
    print(f"engine vs trainer after adapter sync: mean |diff| {float(diffs.mean()):.2e}")
    assert float(diffs.mean()) <= 1e-5
    # the engine's base was never sent: ~all bytes of the model stayed put
    assert sum(t.numel() for t in sent.values()) * 10 < sum(p.numel() for p in tr.model.parameters())
    if engine_from == "trainer_copy":  # one copy of the base in the process: the engine shares the trainer's
        base = {n: p for n, p in tr.model.named_parameters() if not p.requires_grad}
        ours = dict(eng.model.named_parameters())
        assert base and all(ours[n].data_ptr() == p.data_ptr() for n, p in base.items())
        assert all(ours[n].data_ptr() != p.data_ptr() for n, p in tr.model.named_parameters() if p.requires_grad)
        name = next(iter(base))
        with pytest.raises(KeyError, match="frozen LoRA base"):
            eng.update_weights({name: torch.zeros_like(base[name])}, 2)
        assert base[name].abs().sum() > 0  # refused before anything was written


def test_merged_weights_are_a_plain_checkpoint_with_the_adapter_folded_in(tiny_qwen2):
    tr = lora_trainer(tiny_qwen2, lora_alpha=4.0)
    perturb_adapters(tr.model)
    tr.policy.lora.sync_merged = True
    merged = tr.weights()
    plain = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
    assert set(merged) == {n for n, _ in plain.named_parameters()}
    plain.load_state_dict(merged, strict=False)
    ids = torch.tensor([[5, 17, 33, 2, 9, 41]])
    assert torch.allclose(plain(ids).logits, tr.model(ids).logits, atol=1e-5)
    # what `rlvr serve` does with /update_weights_from_disk: a plain engine takes the merged tensors
    eng = EmbeddedEngine(str(tiny_qwen2), pad_token_id=0, seed=1)
    eng.update_weights(merged, 1)
    res = eng.generate_sync([GenerateRequest([5, 17, 33], SamplingParams(temperature=0.9, max_new_tokens=6))])[0]
    sample = Sample("", [5, 17, 33], response_ids=res.token_ids, loss_mask=[1] * len(res.token_ids))
    with torch.no_grad():
        lp, _ = tr.policy.log_probs([sample], len(res.token_ids), False)
    assert float((lp[0] - torch.tensor(res.log_probs)).abs().mean()) <= 1e-5


def test_bad_target_module_names_the_linear_layers_and_rank_too_large_is_refused(tiny_qwen2):
    with pytest.raises(ConfigError, match=r"--target-modules: 'qkv' is not a linear layer.*'down_proj'"):
        lora_trainer(tiny_qwen2, target_modules=["q_proj", "qkv"])
    with pytest.raises(ConfigError, match=r"--lora-rank: 200 is larger than layer .* allows; use at most 32"):
        lora_trainer(tiny_qwen2, rank=200)
    tr = lora_trainer(tiny_qwen2, target_modules=["q_proj", "v_proj"])
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in lora.adapter_weights(tr.model)} == {"q_proj", "v_proj"}


def test_save_load_is_exact_and_the_adapter_exports(tiny_qwen2, tmp_path):
    from peft import PeftModel

    from rlvr.runtime.build import export_hf

    tok = AutoTokenizer.from_pretrained(tiny_qwen2)
    tr = lora_trainer(tiny_qwen2, bf16=False)
    samples = random_samples(8, 2, lambda i, rng: float(i % 3 == 0))
    perturb_adapters(tr.model)
    tr.train(0, samples)
    ckpt = tr.save(tmp_path / "ckpt", tokenizer=tok)
    assert not (ckpt / "model.safetensors").exists()  # the adapter, not the base
    tr.train(1, samples)
    after = lora.adapter_weights(tr.model)

    again = lora_trainer(tiny_qwen2)
    again.load(ckpt)
    again.train(1, samples)
    assert all(torch.equal(after[n], t) for n, t in lora.adapter_weights(again.model).items())
    with pytest.raises(ValueError, match="does not match the run's LoRA layers"):  # other targets
        lora_trainer(tiny_qwen2, target_modules=["q_proj"]).load(ckpt)

    adapter = export_hf(ckpt, tmp_path / "adapter", adapter_only=True)
    merged = export_hf(ckpt, tmp_path / "merged")
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, str(adapter))
    ids = torch.tensor([[5, 17, 33, 2, 9, 41]])
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)(ids).logits
        got = loaded(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    # --lora-adapter-path starts a run from it (the adapter's rank and targets, its values)
    start = lora_trainer(tiny_qwen2, rank=0, lora_adapter_path=str(adapter))
    assert start.reference.model is start.model
    with torch.no_grad():
        assert torch.allclose(start.model(ids).logits, want, atol=1e-5)


@pytest.mark.slow
def test_sigkill_during_a_lora_run_then_resume_matches_uninterrupted_run(tiny_qwen2, arith_files, tmp_path):
    """tests/test_resume.py's pattern with --lora-rank: the adapter and its AdamW state come back
    exactly, so the two rollouts after the kill log what the uninterrupted run logged."""
    import signal

    from rlvr.runtime.checkpoint import read_latest
    from tests.support import logged_values, resume_args, run_rlvr

    test = tmp_path / "test.jsonl"
    test.write_text("".join(arith_files[1].read_text().splitlines(keepends=True)[:6]))

    def run(out, kill_at=None):
        return run_rlvr(*resume_args(tiny_qwen2, arith_files[0], test, tmp_path / out), "--lora-rank", "8",
                        "--lora-alpha", "16", kill_at=kill_at)

    full = run("full")
    assert full.returncode == 0, full.stderr[-3000:]
    assert "no reference copy" in full.stderr
    killed = run("resumed", kill_at="rollout:4")
    assert killed.returncode == -signal.SIGKILL and read_latest(tmp_path / "resumed" / "ckpt") == 4
    resumed = run("resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    a, b = logged_values(tmp_path / "full"), logged_values(tmp_path / "resumed")
    assert a.keys() == b.keys()
    after = [("rollout/step", 4), ("rollout/step", 5), ("train/step", 10), ("train/step", 12)]
    assert a[("train/step", 12)]["train/kl_loss"] != 0  # the adapter moved the policy off the base
    assert a[("train/step", 10)]["train/entropy_loss"] != a[("train/step", 12)]["train/entropy_loss"]
    worst, compared = 0.0, 0
    for k in after:
        assert a[k].keys() == b[k].keys(), k
        for name, x in a[k].items():
            assert x == pytest.approx(b[k][name], abs=1e-6), (k, name, x, b[k][name])
            if isinstance(x, float):
                worst, compared = max(worst, abs(x - b[k][name])), compared + 1
    print(f"LoRA resume: {compared} values of the next two rollouts, max |uninterrupted - resumed| = {worst:g}")


@pytest.mark.parametrize("estimator", ["grpo", "gspo", "cispo", "rloo", "reinforce_plus_plus",
                                       "reinforce_plus_plus_baseline", "ppo"])
def test_every_estimator_trains_the_adapters_only(tiny_qwen2, estimator):
    """One rollout of two optimizer steps (the second off-policy), dynamic micro-batches; PPO's
    critic is its own full model, the policy's base stays frozen."""
    algo = AlgoConfig(advantage_estimator=estimator, use_kl_loss=True, kl_loss_coef=0.01, kl_coef=0.0)
    cfg = TrainConfig(hf_checkpoint=str(tiny_qwen2), lr=1e-2, lora_rank=4, use_dynamic_batch_size=True,
                      max_tokens_per_gpu=40)
    tr = Trainer(cfg, algo, temperature=1.0, global_batch_size=4, n_samples_per_prompt=4)
    base = {n: p.clone() for n, p in tr.model.named_parameters() if not p.requires_grad}
    adapters = {n: t.clone() for n, t in lora.adapter_weights(tr.model).items()}
    m = tr.train(0, random_samples(8, 3, lambda i, rng: float(rng.random() > 0.5)))
    assert tr.step == 2 and m["train/skipped_steps"] == 0
    assert all(torch.equal(p, base[n]) for n, p in tr.model.named_parameters() if not p.requires_grad)
    assert any(not torch.equal(t, adapters[n]) for n, t in lora.adapter_weights(tr.model).items())


def test_lora_dropout_acts_in_the_training_forward_only(tiny_qwen2):
    """p0 and the reference come from dropout-free forwards; the training forward drops LoRA inputs."""
    samples = random_samples(8, 4, lambda i, rng: float(i % 2))
    algo = AlgoConfig(use_kl_loss=False)
    with_dropout = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2), lr=1e-3, lora_rank=4, lora_dropout=0.5), algo,
                           n_samples_per_prompt=4)
    without = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2), lr=1e-3, lora_rank=4), algo, n_samples_per_prompt=4)
    for tr in (with_dropout, without):
        perturb_adapters(tr.model)
    assert with_dropout.train(0, samples)["train/ppo_kl"] != 0  # p_theta (dropout) != p0 (none) on-policy
    assert without.train(0, samples)["train/ppo_kl"] == 0
    assert all(not m.training for m in with_dropout.model.modules())  # back in eval mode after the step
