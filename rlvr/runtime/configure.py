"""Flags and YAML to a checked ``Config``: what the ``rlvr`` command runs before anything starts.

``rlvr.config`` is declarative: it checks the bounds and rules of its fields. The checks here need
the implementations, so they live above them: a name checked against its registry (estimators,
policy losses, KL types, TIS modes, dynamic-sampling filters, reward post-processes, rewards),
user plugins imported (``--custom-advantage-function-path``, ``--tools``), data files readable,
the estimator's traits against the rest of the config, and the model's routed experts. Every
failure is a ``ConfigError`` naming the flag and what to change.

    cfg = parse_config(argv)          # parse + Config.validate + check
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

from rlvr.agents.contract import check_hooks
from rlvr.agents.tools import check_process_tools, load_tools
from rlvr.algo.advantages import ADVANTAGES, estimator_name, estimator_of
from rlvr.algo.corrections import TIS_MODES
from rlvr.algo.kl import kl_loss_types
from rlvr.algo.policy_loss import POLICY_LOSSES
from rlvr.config import AgentConfig, AlgoConfig, Config, DataConfig, EvalConfig, RolloutConfig, TrainConfig
from rlvr.compat.slime.paths import slime_equivalent
from rlvr.config.fields import Names, choices_of, flag_of
from rlvr.config.parse import build_config, given_values
from rlvr.config.parse import make_parser as config_parser
from rlvr.core.errors import ConfigError, DataError
from rlvr.core.registry import resolve
from rlvr.data import reasoning_gym
from rlvr.data.readers import dataset_kind, open_rows
from rlvr.models.moe import has_routed_experts
from rlvr.rewards.registry import check_reward_config
from rlvr.rollout.filters import FILTERS
from rlvr.rollout.postprocess import POST_PROCESS

# The registries behind the config fields declared with ``names=`` (rlvr.config.fields.option).
NAMES: Names = {
    "advantage estimator": ADVANTAGES.names,
    "policy loss": POLICY_LOSSES.names,
    "KL loss type": kl_loss_types,
    "TIS mode": TIS_MODES.names,
}


def check_names(group: Any, values: dict[str, Any] | None = None) -> None:
    """Every field of ``group`` declared with ``names=`` holds a registered name (``values``
    overrides what a field holds)."""
    for f in fields(group):
        value = (values or {}).get(f.name, getattr(group, f.name))
        valid = choices_of(f, NAMES) if "names" in f.metadata else None
        if value is not None and valid is not None and value not in valid:
            raise ConfigError(f.metadata.get("flag", flag_of(f.name)), f"unknown value {value!r}; valid: {', '.join(valid)}")


def check_algo(algo: AlgoConfig) -> None:
    """Registered names (a custom estimator is imported first, so its name is one), and what the
    estimator's own loss allows."""
    check_names(algo, {"advantage_estimator": estimator_name(algo)})
    loss = estimator_of(algo).policy_loss
    if algo.use_score_centering and algo.pg_loss_type is None and loss in ("gspo", "cispo"):
        raise ConfigError("--use-score-centering", f"is a token-level REINFORCE loss; --advantage-estimator "
                          f"{estimator_name(algo)} trains with {loss}: use grpo")


def check_rollout(rollout: RolloutConfig) -> None:
    for flag, registry, value in (
        ("--dynamic-sampling-filter-path", FILTERS, rollout.dynamic_sampling_filter_path),
        ("--custom-reward-post-process-path", POST_PROCESS, rollout.custom_reward_post_process_path),
    ):
        if value is not None:
            try:
                resolve(registry, value, flag, alias=slime_equivalent)
            except KeyError as e:
                raise ConfigError(flag, str(e.args[0])) from None


def check_data(data: DataConfig, eval: EvalConfig) -> None:
    """Every prompt file is of a kind the readers know; every ``reasoning_gym:`` spec parses, names
    tasks and configurations its generators accept, and trains on the train split only."""
    sets = [("--prompt-data", "", data.prompt_data)] if data.prompt_data is not None else []
    for flag, prefix, path in sets + [("--eval-prompt-data", f"{name}: ", path) for name, path in eval.datasets()]:
        try:
            if not reasoning_gym.is_spec(path):
                dataset_kind(path)
            elif reasoning_gym.parse_spec(path).split != "train" and flag == "--prompt-data":
                raise ValueError(f"{path} asks for a held-out split; training prompts come from split=train")
        except (ValueError, DataError) as e:
            raise ConfigError(flag, f"{prefix}{e}") from None
    if reasoning_gym.is_spec(data.prompt_data) and data.rollout_max_prompt_len is not None:
        raise ConfigError("--rollout-max-prompt-len", "applies to prompt files; a reasoning_gym: spec sets its "
                                                      "prompts' size through each task's config: drop the flag")


def check_train(train: TrainConfig) -> None:
    if train.use_rollout_routing_replay and not has_routed_experts(train.hf_checkpoint):
        raise ConfigError("--use-rollout-routing-replay", f"{train.hf_checkpoint} is a dense model (no routed "
                                                          "experts): routing replay has nothing to replay; drop the flag")


def check_agent(agent: AgentConfig, eval_function_path: str | None = None) -> None:
    """The hooks import and take rlvr's arguments; ``--tools`` is a list of functions (that pickle,
    with ``--tool-executor process``)."""
    check_hooks(agent, eval_function_path)
    if agent.tools is not None:
        tools = load_tools(agent.tools)
        if agent.tool_executor == "process":
            check_process_tools(tools)


def check_estimator(cfg: Config) -> None:
    """What the estimator's traits (``rlvr.algo.register_estimator``) ask of the rest of the config."""
    name, est = estimator_name(cfg.algo), estimator_of(cfg.algo)
    if est.group_relative and cfg.rollout.n_samples_per_prompt < 2:
        raise ConfigError("--n-samples-per-prompt", f"{cfg.rollout.n_samples_per_prompt}: {name} compares the "
                                                    "samples of one prompt, so it needs groups of >= 2 samples")
    if est.side_inputs and cfg.rollout.custom_reward_post_process_path is None:
        raise ConfigError("--advantage-estimator", f"{name} reads per-sample inputs {list(est.side_inputs)} that "
                                                   f"no reward post-process writes: {est.side_inputs_hint}")
    if cfg.cluster.ray and est.needs_critic:
        raise ConfigError("--advantage-estimator", f"under --ray: {name}'s critic is not data-parallel yet; use a "
                                                   "critic-free estimator (grpo, rloo, ...) under --ray")


def check_inputs(cfg: Config) -> None:
    """What sampling a checkpoint needs (``rlvr eval`` checks only this): the data files, the
    model, the rollout's filters and post-processes."""
    check_data(cfg.data, cfg.eval)
    check_train(cfg.train)
    check_rollout(cfg.rollout)


def check(cfg: Config, rl: bool = True) -> Config:
    """The checks that need the implementations, after ``cfg.validate(rl)`` passed: each group's,
    then (``rl=True``; SFT skips them) what the estimator asks of the rest."""
    check_inputs(cfg)
    check_algo(cfg.algo)
    check_reward_config(cfg.reward)
    check_agent(cfg.agent, cfg.eval.eval_function_path)
    if rl:
        check_estimator(cfg)
    return cfg


# ---- the command line ------------------------------------------------------------------------
def make_parser(prog: str = "rlvr train") -> argparse.ArgumentParser:
    """Every config field as a flag; the help lists the names registered now (the ``rlvr``
    command parses with ``rlvr.config.parse.make_parser``, which imports no implementation)."""
    return config_parser(prog, NAMES)


def merged_values(ns: argparse.Namespace) -> dict[str, Any]:
    """Flat ``{field: value}`` from defaults < YAML (``--config``) < flags given, with slime's
    ``--num-epoch`` turned into ``--num-rollout``."""
    values = given_values(ns)
    _num_rollout_from_epochs(values)
    _eval_specs_on_training_mix(values)
    return values


def _eval_specs_on_training_mix(values: dict[str, Any]) -> None:
    """An ``--eval-prompt-data`` spec without tasks (``reasoning_gym:?split=val``) takes the
    tasks of ``--prompt-data`` (``reasoning_gym.on_training_mix``)."""
    if not values.get("eval_prompt_data"):
        return
    try:
        values["eval_prompt_data"] = [reasoning_gym.on_training_mix(v, values.get("prompt_data"))
                                      for v in values["eval_prompt_data"]]
    except DataError as e:
        raise ConfigError("--eval-prompt-data", str(e)) from None


def _num_rollout_from_epochs(values: dict[str, Any]) -> None:
    """slime's ``--num-epoch``: when ``--num-rollout`` is not given, it is the epochs times the
    prompts of ``--prompt-data`` (rows, before any --rollout-max-prompt-len drop) over the batch."""
    if values.get("num_epoch") is None:
        return
    if "num_rollout" in values:
        logging.getLogger(__name__).info("--num-epoch is ignored: --num-rollout %s is given (slime)", values["num_rollout"])
        return
    path = values.get("prompt_data")
    if path is None or not (reasoning_gym.is_spec(path) or Path(path).exists()):
        raise ConfigError("--num-epoch", "needs --prompt-data (its size sets --num-rollout)")
    batch = values.get("rollout_batch_size", RolloutConfig.rollout_batch_size)
    size = reasoning_gym.parse_spec(path).size if reasoning_gym.is_spec(path) else len(open_rows(path))
    values["num_rollout"] = max(1, values["num_epoch"] * size // batch)


def config_from_values(values: dict[str, Any], rl: bool = True) -> Config:
    """A validated and checked ``Config`` from flat ``{field: value}``."""
    return check(build_config(values).validate(rl=rl), rl=rl)


def parse_config(argv: list[str], rl: bool = True) -> Config:
    """Flags (and ``--config``) to a validated, checked ``Config``; ``rl=False`` for SFT."""
    return config_from_values(merged_values(make_parser().parse_args(argv)), rl=rl)
