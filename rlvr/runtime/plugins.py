"""Users' functions, resolved once for the builders: the flags' registered names and dotted paths
turned into the callables the components take, slime-signature plugins adapted on the way.

This is where ``rlvr.compat.slime`` meets the components (adapters at the edge): a function
whose first parameter is ``args`` gets ``args`` bound here (``SlimeArgs``: the config by slime's
flag names, and by group for the multi-turn hooks, which ``rlvr.runtime.build.make_agent`` hands
the same view), and slime's dotted paths of functions rlvr has under a name of its
own resolve to that name (``slime_equivalent``). The rollout, the grader and the trainer receive
plain rlvr callables and never import ``compat``.
"""

from __future__ import annotations

from typing import Callable

from rlvr.algo.advantages import ESTIMATOR_REWARD
from rlvr.algo.corrections import load_custom_tis_function
from rlvr.compat.slime.paths import slime_equivalent
from rlvr.compat.slime.plugins import (
    SlimeArgs,
    adapt_filter,
    adapt_post_process,
    adapt_reward,
    adapt_sample_filter,
    adapt_tis,
    post_processed_algo,
)
from rlvr.config import AlgoConfig, Config, RewardConfig, RolloutConfig
from rlvr.core.registry import load_function, resolve
from rlvr.rollout.filters import FILTERS
from rlvr.rollout.postprocess import POST_PROCESS
from rlvr.rollout.rollout import RolloutPlugins


def slime_args(cfg: Config) -> SlimeArgs:
    """What slime-signature plugins and the multi-turn hooks get as ``args``: a read-only view of
    the whole config by slime's flag names (as in slime) and by group (``args.rollout``)."""
    return SlimeArgs(cfg)


def post_process_fn(rollout: RolloutConfig) -> Callable | None:
    """``--custom-reward-post-process-path`` as given (a registered name, or a function)."""
    path = rollout.custom_reward_post_process_path
    if path is None:
        return None
    return resolve(POST_PROCESS, path, "--custom-reward-post-process-path", alias=slime_equivalent)


def rollout_plugins(rollout: RolloutConfig, args: SlimeArgs) -> RolloutPlugins:
    """The rollout's filter, reward post-process and sample filter as rlvr calls them."""
    f, s = rollout.dynamic_sampling_filter_path, rollout.rollout_sample_filter_path
    post = post_process_fn(rollout)
    return RolloutPlugins(
        group_filter=None if f is None else adapt_filter(
            resolve(FILTERS, f, "--dynamic-sampling-filter-path", alias=slime_equivalent), args),
        post_process=None if post is None else adapt_post_process(post, args, ESTIMATOR_REWARD),
        sample_filter=None if s is None else adapt_sample_filter(load_function(s, "--rollout-sample-filter-path"), args),
    )


def custom_reward(reward: RewardConfig, args: SlimeArgs) -> Callable | None:
    """``--custom-rm-path`` as ``f(sample)`` (``f(samples)`` with ``--group-rm``)."""
    if reward.custom_rm_path is None:
        return None
    return adapt_reward(load_function(reward.custom_rm_path, "--custom-rm-path"), args)


def custom_tis(algo: AlgoConfig) -> Callable | None:
    """``--custom-tis-function-path`` as rlvr's ``f(pg_loss, train_log_probs, rollout_log_probs,
    loss_mask, cfg)`` (``rlvr.algo.corrections``)."""
    if algo.custom_tis_function_path is None:
        return None
    return adapt_tis(load_custom_tis_function(algo.custom_tis_function_path))


def trainer_algo(cfg: Config) -> AlgoConfig:
    """The algo group the trainer's estimator runs with: a slime reward post-process hands it
    rewards already normalised as the plugin wished, so group normalisation is off then."""
    return post_processed_algo(cfg.algo, post_process_fn(cfg.rollout))
