"""AlgoConfig: slime defaults, choices from the registries, validation errors naming the flag.

The config checks its declared bounds and rules (``AlgoConfig.validate``); the names that live in
the registries are checked by ``rlvr.runtime.configure.check_algo``: both together are what
``parse_config`` runs."""

import dataclasses

import pytest

from rlvr.algo import ADVANTAGES, KL, AlgoConfig
from rlvr.core.errors import ConfigError
from rlvr.config.fields import choices_of
from rlvr.runtime.configure import NAMES, check_algo


def _checked(cfg: AlgoConfig) -> AlgoConfig:
    check_algo(cfg.validate())
    return cfg


def test_defaults_are_slimes():
    c = AlgoConfig().validate()
    assert (c.advantage_estimator, c.eps_clip, c.eps_clip_high, c.kl_loss_type) == ("grpo", 0.2, None, "k1")
    assert (c.tis_clip, c.tis_clip_low, c.opsm_delta, c.gamma, c.lambd) == (2.0, 0.0, 1e-4, 1.0, 1.0)
    assert c.clip_range() == (0.2, 0.2)
    assert AlgoConfig(eps_clip_high=0.28).clip_range() == (0.2, 0.28)


def test_every_field_has_help_and_registry_choices():
    fields = {f.name: f for f in dataclasses.fields(AlgoConfig)}
    assert all(f.metadata.get("help") for f in fields.values())
    # Asked when a flag is parsed, so names registered later by user code are valid too.
    assert choices_of(fields["advantage_estimator"], NAMES) == ADVANTAGES.names()
    assert choices_of(fields["kl_loss_type"], NAMES) == [*KL.names(), "token_level_kl"]
    assert choices_of(fields["tis_mode"], NAMES) == ["icepop", "tis"]


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"advantage_estimator": "dapo"}, "--advantage-estimator"),
        ({"kl_loss_type": "kl"}, "--kl-loss-type"),
        ({"pg_loss_type": "nope"}, "--pg-loss-type"),
        ({"eps_clip_c": 1.0}, "--eps-clip-c"),
        ({"eps_clip": -0.1}, "--eps-clip"),
        ({"kl_loss_coef": -1.0, "use_kl_loss": True}, "--kl-loss-coef"),
        ({"entropy_coef": -0.01}, "--entropy-coef"),
        ({"tis_clip_low": 3.0}, "--tis-clip-low"),
        ({"gamma": 1.5}, "--gamma"),
        ({"kl_loss_coef": 0.01}, "--kl-loss-coef"),
        ({"kl_coef": 0.1, "kl_loss_coef": 0.1, "use_kl_loss": True}, "--kl-coef"),
        ({"custom_tis_function_path": "a.b:c"}, "--custom-tis-function-path"),
    ],
)
def test_validate_names_the_flag(kwargs, flag):
    with pytest.raises(ConfigError) as e:
        _checked(AlgoConfig(**kwargs))
    assert e.value.flag == flag and str(e.value).startswith(flag + ": ")


def test_unknown_estimator_message_lists_valid_ones():
    with pytest.raises(ConfigError, match="valid: cispo, dcpo, grpo, gspo, ppo"):
        _checked(AlgoConfig(advantage_estimator="grpo++"))
