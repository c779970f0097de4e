"""The driver's declared view of a rollout and a trainer (``rlvr.runtime.roles``): every
implementation, local and Ray, has every method, and the local components built for a run (plain
and ``--colocate``) satisfy the protocols and carry their checkpoint state as plain data."""

from __future__ import annotations

import inspect

import pytest
import torch

from rlvr.rollout.rollout import Rollout
from rlvr.runtime.roles import RolloutRole, TrainerRole
from rlvr.train.trainer import Trainer

SERIAL_GROUP = "ray"  # one xdist worker for the group's modules (tests/conftest.py)


def _methods(protocol) -> set[str]:
    return {n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")}


def test_every_implementation_has_every_method():
    pytest.importorskip("ray")  # the dev extra
    from rlvr.distributed.rollout_manager import RayRollout
    from rlvr.distributed.train_group import RayTrainer

    assert {"data_state", "rng_state", "health"} <= _methods(RolloutRole) and "save_hf" in _methods(TrainerRole)
    from rlvr.runtime.colocate import Colocated

    for cls, protocol in ((Rollout, RolloutRole), (RayRollout, RolloutRole), (Trainer, TrainerRole),
                          (RayTrainer, TrainerRole), (Colocated, TrainerRole)):
        assert [m for m in sorted(_methods(protocol)) if not callable(getattr(cls, m, None))] == [], cls


@pytest.mark.parametrize("colocate", [False, True])
def test_local_components_are_roles_and_keep_their_state_as_data(tiny_qwen2, arith_files, tmp_path, colocate):
    from rlvr.runtime.build import build_local
    from rlvr.runtime.configure import parse_config

    cfg = parse_config(["--hf-checkpoint", str(tiny_qwen2), "--prompt-data", str(arith_files[0]),
                        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "3",
                        "--output-dir", str(tmp_path), *(["--colocate"] if colocate else [])])
    with build_local(cfg) as c:
        assert isinstance(c.rollout, RolloutRole) and isinstance(c.trainer, TrainerRole)
        before, rng = c.rollout.data_state(), c.rollout.rng_state()
        c.rollout.generate(0)  # draws prompts and sampling seeds
        assert c.rollout.data_state() != before
        c.rollout.load_data_state(before)
        c.rollout.set_rng_state(rng)
        assert c.rollout.data_state() == before and torch.equal(c.rollout.rng_state(), rng)
        assert c.rollout.health() == [True]
        c.trainer.check_bad_steps(str)  # no skipped step yet: nothing to stop
        out = c.trainer.save_hf(c.tokenizer, tmp_path / "hf")
        assert (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file()
