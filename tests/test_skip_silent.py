"""Samples without signal (advantage 0 everywhere, no term that survives it) run no forward or
backward, and the update is the one the full path makes: bit for bit where the micro-batches the
other samples land in are the same, to float rounding where packing regroups them."""

import pytest
import torch

from rlvr.algo import AlgoConfig, silent_samples
from rlvr.config import TrainConfig
from rlvr.core.testing import override_trainer
from rlvr.rollout.filters import nonzero_std
from rlvr.train.trainer import Trainer
from tests.conftest import random_samples

GROUP = 4


def _samples(rewards: list[float], seed: int = 0):
    return random_samples(len(rewards), seed, lambda i, rng: rewards[i])


# groups of 4: group 0 all correct and group 2 all wrong (no variance: every advantage 0), groups 1
# and 3 mixed; in group 3 two samples sit at the group mean (advantage 0 with the std normaliser too).
MIXED = [1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0.5, 1, 0.5]
ALIGNED = [1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1]  # whole groups silent or none of a group


def _run(ckpt, rollouts, skip: bool, algo: AlgoConfig | None = None, **train):
    """(weights, AdamW's state, each step's gradient, each rollout's metrics) after training on
    ``rollouts`` in turn."""
    cfg = TrainConfig(hf_checkpoint=str(ckpt), **{"lr": 1e-2, "weight_decay": 0.1, **train})
    with override_trainer(skip_silent_samples=skip):
        tr = Trainer(cfg, algo or AlgoConfig(), n_samples_per_prompt=GROUP)
        grads, real = [], tr.optimizer.adamw.step
        tr.optimizer.adamw.step = lambda: (grads.append(torch.cat([p.grad.flatten() for p in tr.optimizer.master])), real())
        metrics = [tr.train(r, samples) for r, samples in enumerate(rollouts)]
    state = [t for s in tr.optimizer.adamw.state.values() for t in s.values() if torch.is_tensor(t)]
    return [p.detach().clone() for p in tr.optimizer.params], state, grads, metrics


def _assert_same(a, b, exact: bool):
    if exact:
        for x, y in zip(a[0] + a[1] + a[2], b[0] + b[1] + b[2], strict=True):
            assert torch.equal(x, y)
    else:  # the gradients to float rounding, and so the weights AdamW made of them
        for x, y in zip(a[2], b[2], strict=True):
            assert (x - y).norm() <= 1e-5 * x.norm()
        for x, y in zip(a[0], b[0], strict=True):
            # AdamW normalises each element by its own gradient's scale: an element whose gradient is
            # near 0 turns rounding into a visible part of its step (1.3e-5 seen after 4 steps of lr 1e-2)
            torch.testing.assert_close(x, y, rtol=0, atol=5e-5)
    for ma, mb in zip(a[3], b[3], strict=True):
        # pg_loss is absent when no micro-batch ran (every sample silent)
        for key in ("train/loss", "train/grad_norm", "rollout/advantages") + ("train/pg_loss",) * ("train/pg_loss" in mb):
            assert ma[key] == (mb[key] if exact else pytest.approx(mb[key], rel=1e-5, abs=1e-6)), key


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("lora", [False, True])
def test_aligned_micro_batches_give_the_same_update_bit_for_bit(tiny_qwen2, per_token, lora):
    """Micro-batches of 4 = one group each, and whole groups without signal: the skipped path runs
    exactly the full path's other micro-batches, so the summed gradient and the AdamW step match
    to the bit."""
    algo = AlgoConfig(calculate_per_token_loss=per_token)
    rollouts = [_samples(ALIGNED, seed=0), _samples(ALIGNED[4:] + ALIGNED[:4], seed=1)]
    kw = dict(micro_batch_size=GROUP, lora_rank=4 if lora else 0)
    full, skipped = _run(tiny_qwen2, rollouts, False, algo, **kw), _run(tiny_qwen2, rollouts, True, algo, **kw)
    _assert_same(full, skipped, exact=True)
    assert [m["perf/zero_adv_skipped_frac"] for m in skipped[3]] == [8 / 16, 8 / 16]
    assert [m["perf/zero_adv_skipped_frac"] for m in full[3]] == [0.0, 0.0]


@pytest.mark.parametrize("per_token", [False, True])
def test_packed_dynamic_micro_batches_match_to_float_rounding(tiny_qwen2, per_token):
    """Token-capped packing regroups the remaining samples: the same update to float rounding,
    with two optimizer steps per rollout (the second one off-policy)."""
    algo = AlgoConfig(calculate_per_token_loss=per_token)
    rollouts = [_samples(MIXED, seed=2), _samples(MIXED, seed=3)]
    kw = dict(use_dynamic_batch_size=True, max_tokens_per_gpu=28)
    _assert_same(_run(tiny_qwen2, rollouts, False, algo, **kw), _run(tiny_qwen2, rollouts, True, algo, **kw),
                 exact=False)
    two_steps = [_run(tiny_qwen2, rollouts, skip, algo, global_batch_size=8, **kw) for skip in (False, True)]
    _assert_same(*two_steps, exact=False)


def test_after_dynamic_sampling(tiny_qwen2):
    """DAPO's filter keeps groups with reward variance only; samples at their group's mean still
    have advantage 0 and are skipped."""
    pool = _samples(MIXED + [0, 0.5, 0.5, 1], seed=4)
    kept = [s for g in range(0, len(pool), GROUP) if nonzero_std(pool[g:g + GROUP]) for s in pool[g:g + GROUP]]
    assert len(kept) == 12
    kw = dict(use_dynamic_batch_size=True, max_tokens_per_gpu=40)
    full, skipped = _run(tiny_qwen2, [kept], False, **kw), _run(tiny_qwen2, [kept], True, **kw)
    _assert_same(full, skipped, exact=False)
    assert skipped[3][0]["perf/zero_adv_skipped_frac"] == 4 / 12


def test_every_sample_silent_still_steps_the_optimizer(tiny_qwen2):
    """No micro-batch at all: AdamW still steps on a zero gradient (its moments decay, weight
    decay and the momentum move the weights), exactly as the full path's zero gradient does."""
    rollouts = [_samples(MIXED, seed=5), _samples([1.0] * 8 + [0.0] * 8, seed=6)]
    full, skipped = _run(tiny_qwen2, rollouts, False), _run(tiny_qwen2, rollouts, True)
    _assert_same(full, skipped, exact=True)
    assert skipped[3][1]["perf/zero_adv_skipped_frac"] == 1.0
    first = _run(tiny_qwen2, rollouts[:1], True)
    assert any(not torch.equal(a, b) for a, b in zip(first[0], skipped[0]))  # the second step moved weights


@pytest.mark.parametrize("algo", [AlgoConfig(entropy_coef=0.01), AlgoConfig(use_kl_loss=True, kl_loss_coef=0.1)])
def test_terms_that_survive_a_zero_advantage_keep_every_sample(tiny_qwen2, algo):
    *_, metrics = _run(tiny_qwen2, [_samples(MIXED)], True, algo)
    assert metrics[0]["perf/zero_adv_skipped_frac"] == 0.0


def test_silent_samples_rule():
    adv = torch.tensor([[0.0, 0.0, 5.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [3.0, 3.0, 3.0], [float("nan"), 0, 0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    # row 0: the non-zero advantage is masked out; row 3: no masked token; row 4: NaN is never silent
    assert silent_samples(adv, mask, AlgoConfig()).tolist() == [True, True, False, True, False]
    for cfg in (AlgoConfig(entropy_coef=0.01), AlgoConfig(use_kl_loss=True, kl_loss_coef=0.1),
                AlgoConfig(use_tis=True, custom_tis_function_path="pkg.mod:fn")):
        assert silent_samples(adv, mask, cfg).tolist() == [False, False, False, True, False]
    for cfg in (AlgoConfig(use_kl_loss=True, kl_loss_coef=0.0), AlgoConfig(use_tis=True, use_opsm=True),
                AlgoConfig(pg_loss_type="cispo"), AlgoConfig(advantage_estimator="gspo")):
        assert silent_samples(adv, mask, cfg).tolist() == [True, True, False, True, False]


# ---- data-parallel: two gloo ranks in their own processes --------------------------------------
UNEVEN = [1, 1, 1, 1, 0, 0.5, 0.75, 0.75]  # 5 silent (the 0.5 sits at its group's mean), 3 with signal


def _rank(rank: int, port: int, ckpt: str, backend: str, rollouts, out: str) -> None:
    import gc

    import torch.distributed as dist

    from rlvr.train.parallel import DataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tr = Trainer(TrainConfig(hf_checkpoint=ckpt, lr=1e-2, weight_decay=0.1), AlgoConfig(), n_samples_per_prompt=GROUP,
                 parallel=DataParallel(backend, balance=False))
    metrics = [tr.train(r, samples) for r, samples in enumerate(rollouts)]
    weights = tr.weights()  # FSDP2: gathered on rank 0 (a collective)
    if rank == 0:
        torch.save({"weights": [w.clone() for w in weights.values()], "metrics": metrics}, out)
    # The trainer (its DDP Reducer) goes first, while the process group is still registered: were
    # the Reducer the group's last holder, freeing it would destroy the gloo group with the GIL
    # held, joining gloo's work thread, which may be waiting for the GIL to free its last
    # all-reduce's tensors (a deadlock at exit, seen about once in 10-40 runs on a loaded machine).
    del tr, weights
    gc.collect()
    dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
def test_data_parallel_ranks_stay_in_step(tiny_qwen2, tmp_path, backend):
    """Two ranks: an odd number of samples with signal (one silent sample put back so the shares
    stay equal), then a rollout with none at all (no micro-batch on any rank). Both ranks finish,
    and the weights are the single process's to float rounding."""
    import multiprocessing

    from rlvr.engine.remote.processes import free_port

    rollouts = [_samples(UNEVEN, seed=7), _samples([0.0] * 8, seed=8)]
    out, port, ctx = tmp_path / "rank0.pt", free_port(), multiprocessing.get_context("spawn")
    ranks = [ctx.Process(target=_rank, args=(r, port, str(tiny_qwen2), backend, rollouts, str(out))) for r in (0, 1)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=120)
    alive = [p for p in ranks if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive and [p.exitcode for p in ranks] == [0, 0], "a rank hung or failed (collectives out of step)"
    got = torch.load(out, weights_only=False)
    assert [m["perf/zero_adv_skipped_frac"] for m in got["metrics"]] == [4 / 8, 1.0]
    single, _, _, metrics = _run(tiny_qwen2, rollouts, True)
    assert [m["perf/zero_adv_skipped_frac"] for m in metrics] == [5 / 8, 1.0]
    for x, y in zip(single, got["weights"], strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=5e-5)


def test_log_prob_metrics_cover_the_samples_that_ran(tiny_qwen2):
    """On-policy p0 comes from the training forward: the samples it skipped have none, so
    ``rollout/log_probs`` and ``train/train_rollout_logprob_abs_diff`` are means over the others,
    and absent when every sample was skipped."""
    samples = _samples(ALIGNED, seed=9)
    with_signal = [s for s in samples if s.index >= 4 and s.index // GROUP != 2]
    *_, (both,) = _run(tiny_qwen2, [samples], True)
    *_, (alone,) = _run(tiny_qwen2, [with_signal], True)  # the same samples, trained on their own
    for key in ("rollout/log_probs", "train/train_rollout_logprob_abs_diff"):
        assert both[key] == pytest.approx(alone[key], rel=1e-5)
    *_, (silent,) = _run(tiny_qwen2, [_samples([1.0] * 8, seed=9)], True)
    assert "rollout/log_probs" not in silent and "train/train_rollout_logprob_abs_diff" not in silent
