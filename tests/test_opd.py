"""On-policy distillation (``--use-opd``): the advantage shaping by hand, the teacher loaded in the
trainer, the teacher served by a real ``rlvr serve`` on 127.0.0.1 (the same numbers), a failed
teacher contained, the config rules, and 2-rollout CLI runs in both modes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from rlvr.algo import AlgoConfig
from rlvr.algo.opd import opd_advantages
from rlvr.config import TrainConfig
from rlvr.runtime.configure import parse_config
from rlvr.core.errors import ConfigError
from rlvr.models.tiny import build_tiny_model
from rlvr.train.packing import Layout
from rlvr.train.teacher import LoadedTeacher, ServedTeacher, response_logprobs_of
from rlvr.train.trainer import Trainer, load_policy
from tests.conftest import SMALL, random_samples
from tests.support import free_port, post, served


def test_opd_advantages_by_hand():
    # A = [[0.5, 0.5, 0.5], [-1, -1, 0]]; student - teacher = [[-1, 0.5, 2], [0.25, -0.75, 9]];
    # row 1's last token is padding (mask 0). coef 0.4: A - 0.4 * diff * mask.
    adv = torch.tensor([[0.5, 0.5, 0.5], [-1.0, -1.0, 0.0]])
    student = torch.tensor([[-2.0, -0.5, -1.0], [-0.25, -1.0, 0.0]])
    teacher = torch.tensor([[-1.0, -1.0, -3.0], [-0.5, -0.25, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    new, rkl = opd_advantages(adv, student, teacher, mask, 0.4)
    torch.testing.assert_close(rkl, torch.tensor([[-1.0, 0.5, 2.0], [0.25, -0.75, 0.0]]))
    torch.testing.assert_close(new, torch.tensor([[0.9, 0.3, -0.3], [-1.1, -0.7, 0.0]]))


def test_response_logprobs_of_checks_alignment():
    reply = {"meta_info": {"input_token_logprobs": [[None, 7, None], [-0.1, 8, None], [-0.2, 9, None]]}}
    assert response_logprobs_of(reply, [8, 9]) == [-0.1, -0.2]
    with pytest.raises(ValueError, match="misaligned"):
        response_logprobs_of(reply, [9, 8])
    with pytest.raises(ValueError, match="no input log-prob"):
        response_logprobs_of(reply, [7, 8, 9])


def test_config_rules(tiny_qwen2, arith_files):
    base = ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0])]
    with pytest.raises(ConfigError, match="--opd-type"):
        parse_config(base + ["--use-opd"])
    with pytest.raises(ConfigError, match="--opd-teacher-load"):
        parse_config(base + ["--use-opd", "--opd-type", "megatron"])
    with pytest.raises(ConfigError, match="--opd-teacher-load"):
        parse_config(base + ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(arith_files[0])])
    with pytest.raises(ConfigError, match="--rm-url"):
        parse_config(base + ["--use-opd", "--opd-type", "sglang"])
    with pytest.raises(ConfigError, match="--opd-teacher-load"):
        parse_config(base + ["--use-opd", "--opd-type", "sglang", "--rm-url", "http://x/generate",
                             "--opd-teacher-load", str(tiny_qwen2)])
    with pytest.raises(ConfigError, match="--rm-type"):
        parse_config(base + ["--use-opd", "--opd-type", "sglang", "--rm-url", "http://x/generate",
                             "--rm-type", "remote_rm"])
    with pytest.raises(ConfigError, match="--opd-type"):
        parse_config(base + ["--opd-type", "sglang"])
    cfg = parse_config(base + ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(tiny_qwen2),
                               "--opd-kl-coef", "0.5"])
    assert cfg.algo.opd_kl_coef == 0.5


@pytest.fixture(scope="module")
def teacher_ckpt(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("teacher"), seed=11, **SMALL)


def _equal_reward_samples():
    # Every reward equal: GRPO's advantages are 0, so what remains is the OPD term alone.
    return random_samples(8, 3, lambda i, rng: 1.0)


def test_loaded_teacher_shapes_advantages_exactly(tiny_qwen2, teacher_ckpt):
    samples = _equal_reward_samples()
    algo = AlgoConfig(use_opd=True, opd_type="megatron", opd_teacher_load=str(teacher_ckpt), opd_kl_coef=0.5)
    teacher = LoadedTeacher(load_policy(str(teacher_ckpt), False))
    tr = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2), lr=1e-3), algo, n_samples_per_prompt=4, teacher=teacher)
    width = max(s.response_length for s in samples)
    from rlvr.train.logprobs import response_log_probs

    with torch.no_grad():
        student = response_log_probs(tr.model, samples, 1.0, width, False)[0]
        teach = response_log_probs(teacher.model, samples, 1.0, width, False)[0]
    seen = {}
    real = tr.rollouts.build

    def spy(samples):
        seen["batch"] = real(samples)
        return seen["batch"]

    tr.rollouts.build = spy
    m = tr.train(0, samples)
    batch = seen["batch"]
    mask = batch.mask
    assert torch.allclose(batch.advantages, -0.5 * (student - teach) * mask, atol=1e-5)
    expected = ((student - teach) * mask).sum() / mask.sum()
    assert m["train/opd_reverse_kl"] == pytest.approx(expected.item(), rel=1e-4)
    assert m["train/opd_teacher_failures"] == 0


@pytest.fixture(scope="module")
def teacher_server(teacher_ckpt):
    with served(teacher_ckpt) as (port, _):
        yield port


def test_served_teacher_matches_the_loaded_one(teacher_ckpt, teacher_server):
    samples = random_samples(6, 4, lambda i, rng: 0.0)
    width = max(s.response_length for s in samples)
    loaded = LoadedTeacher(load_policy(str(teacher_ckpt), False)).log_probs(samples, 0.9, width, 1 << 30, Layout())
    port = teacher_server
    status, reply = post(port, "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 0},
                                             "return_logprob": True, "logprob_start_len": 0})
    assert status == 200 and reply["meta_info"]["input_token_logprobs"][0][0] is None
    assert [e[1] for e in reply["meta_info"]["input_token_logprobs"]] == [1, 2, 3] and reply["output_ids"] == []
    status, _ = post(port, "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 0}})
    assert status == 400
    served = ServedTeacher(f"http://127.0.0.1:{port}/generate", retries=1, deadline=60)
    got = served.log_probs(samples, 0.9, width, 1 << 30, Layout())
    assert torch.allclose(got, loaded, atol=1e-5) and served.failures == 0


def test_unreachable_teacher_gives_nan_rows_and_counts():
    samples = random_samples(2, 4, lambda i, rng: 0.0)
    dead = ServedTeacher(f"http://127.0.0.1:{free_port()}/generate", retries=1, deadline=2)
    out = dead.log_probs(samples, 0.9, 9, 1 << 30, Layout())
    assert out.isnan().all() and dead.failures == 2


def test_failed_teacher_samples_keep_their_estimator_advantages(tiny_qwen2):
    samples = _equal_reward_samples()
    algo = AlgoConfig(use_opd=True, opd_type="sglang")
    tr = Trainer(TrainConfig(hf_checkpoint=str(tiny_qwen2), lr=1e-3), algo, n_samples_per_prompt=4,
                 teacher=ServedTeacher(f"http://127.0.0.1:{free_port()}/generate", retries=0, deadline=1))
    seen = {}
    real = tr.rollouts.build
    tr.rollouts.build = lambda samples: seen.setdefault("batch", real(samples))
    m = tr.train(0, samples)
    assert m["train/opd_teacher_failures"] == 8
    assert torch.equal(seen["batch"].advantages, torch.zeros_like(seen["batch"].advantages))


def _train(args, out):
    cmd = [sys.executable, "-m", "rlvr", "train", *args, "--output-dir", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [x for x in records if "train/step" in x]


def _cli_args(tiny_qwen2, arith_files):
    return ["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0]), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6", "--num-rollout", "2",
            "--lr", "1e-3", "--use-opd", "--opd-kl-coef", "0.5"]


def _check(trains):
    assert len(trains) == 2
    assert all(x["train/opd_teacher_failures"] == 0 and x["train/opd_reverse_kl"] != 0 for x in trains)


@pytest.mark.slow
def test_cli_two_rollouts_teacher_in_the_trainer(tiny_qwen2, teacher_ckpt, arith_files, tmp_path):
    _check(_train(_cli_args(tiny_qwen2, arith_files) + ["--opd-type", "megatron", "--opd-teacher-load",
                                                        str(teacher_ckpt)], tmp_path / "run"))


@pytest.mark.slow
def test_cli_two_rollouts_served_teacher(tiny_qwen2, arith_files, teacher_server, tmp_path):
    _check(_train(_cli_args(tiny_qwen2, arith_files) + ["--opd-type", "sglang", "--rm-url",
                                                        f"http://127.0.0.1:{teacher_server}/generate"], tmp_path / "run"))
