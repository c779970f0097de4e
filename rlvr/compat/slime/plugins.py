"""slime-signature plugins run under rlvr: porting one is a change of import path.

slime calls its plugins with ``args`` (its argparse namespace) first; rlvr's own plugin
signatures take only what they need. A plugin whose first parameter is named ``args`` is a slime
plugin, and rlvr calls it the slime way, passing a ``SlimeArgs`` view of the config where slime
passes ``args``: attribute access by slime's flag names (``args.n_samples_per_prompt``,
``args.tis_clip``), read-only. The adapted extension points, with slime's signatures
(docs/en/get_started/customization.md in slime):

==================================  ===========================================================
``--custom-rm-path``                ``[async] f(args, sample) -> float | dict``
                                    (``--group-rm``: ``f(args, samples) -> list``)
``--dynamic-sampling-filter-path``  ``f(args, samples, **kw) -> DynamicFilterOutput | bool``;
                                    drop reasons logged as ``rollout/dynamic_filter/drop_<reason>``
``--custom-reward-post-process-path`` ``f(args, samples) -> (raw_rewards, rewards)``: ``rewards``
                                    are what the estimator sees, with no group normalisation on
                                    top (slime's function replaces ``_post_process_rewards``)
``--custom-tis-function-path``      ``f(args, *, pg_loss, train_log_probs, rollout_log_probs,
                                    loss_masks, total_lengths, response_lengths) ->
                                    (pg_loss, loss_masks, metrics)``: tensors flat over the
                                    batch's tokens, per-sample lists of 1-D tensors
``--rollout-sample-filter-path``    ``f(args, samples)`` setting ``sample.remove_sample``
==================================  ===========================================================

Simplification: rlvr pads each TIS row to the batch width ``T``, so every per-sample tensor a
TIS function sees has length ``T`` (padded positions carry loss mask 0) and
``total_lengths == response_lengths == [T] * B`` (rlvr has no context parallelism to split by).

A ``slime.*`` dotted path names slime's own code, which is not installed with rlvr:
``slime_equivalent`` turns the ones rlvr has into their rlvr name, and names the equivalent of
the others in the error.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable

# slime names rlvr spells as the negation of one of its own fields
_NEGATED = {"rewards_normalization": "disable_rewards_normalization",
            "grpo_std_normalization": "disable_grpo_std_normalization"}


class SlimeArgs:
    """Read-only attribute view of config groups under slime's flag names. Built from a whole
    ``Config`` it also answers the group names (``args.rollout`` is the rollout group) and
    ``args.global_batch_size`` is the derived batch size (the run's, as slime's ``args`` has it).

    >>> from rlvr.config.algo import AlgoConfig
    >>> args = SlimeArgs(AlgoConfig(tis_clip=3.0))
    >>> args.tis_clip, args.grpo_std_normalization
    (3.0, True)
    >>> args.n_samples_per_prompt  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AttributeError: args.n_samples_per_prompt: rlvr gives this plugin only the algo settings (AlgoConfig); it has no field ...
    """

    def __init__(self, *groups: Any):
        items: dict[str, Any] = {}
        for g in groups:
            if is_dataclass(g) and hasattr(g, "algo"):  # a whole Config: every group, by field and by group
                for sub in fields(g):
                    group = getattr(g, sub.name)
                    items |= {f.name: getattr(group, f.name) for f in fields(group)}
                items |= {sub.name: getattr(g, sub.name) for sub in fields(g)}
                items["global_batch_size"] = g.global_batch_size
            else:
                items |= {f.name: getattr(g, f.name) for f in fields(g)}
        items |= {slime: not items[ours] for slime, ours in _NEGATED.items() if ours in items}
        if "async_train" in items:
            items["async"] = items["async_train"]
        object.__setattr__(self, "_items", items)
        object.__setattr__(self, "_what", " + ".join(type(g).__name__ for g in groups))

    def __getattr__(self, name: str) -> Any:
        items = object.__getattribute__(self, "_items")
        if name in items:
            return items[name]
        what = object.__getattribute__(self, "_what")
        scope = "the whole config" if what == "Config" else f"only the {what.replace('Config', '').lower()} settings ({what})"
        raise AttributeError(f"args.{name}: rlvr gives this plugin {scope}; it has no field {name}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"args.{name}: the config is read-only to plugins")


def is_slime_style(fn: Callable) -> bool:
    """A slime plugin: its first parameter is named ``args`` (slime passes its namespace first)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] == "args"


# ---- rewards --------------------------------------------------------------------------------
def adapt_reward(fn: Callable, args: SlimeArgs) -> Callable:
    """``f(args, sample)`` as rlvr's ``f(sample)`` (async stays async; a group reward alike)."""
    if not is_slime_style(fn):
        return fn
    if inspect.iscoroutinefunction(fn):
        async def reward(sample):
            return await fn(args, sample)
    else:
        def reward(sample):
            return fn(args, sample)
    return functools.wraps(fn)(reward)


# ---- dynamic sampling filters ---------------------------------------------------------------
@dataclass
class DynamicFilterOutput:
    """What a slime dynamic filter returns (slime's ``filter_hub.base_types``): keep the group or
    not, and why not (logged as ``rollout/dynamic_filter/drop_<reason>``)."""

    keep: bool
    reason: str | None = None
    keep_when_insufficient: bool = False  # rlvr tops an unfilled batch up with dropped groups anyway


class SlimeGroupFilter:
    """A slime filter as rlvr's ``f(group) -> bool``, counting drop reasons for the rollout's metrics."""

    def __init__(self, fn: Callable, args: SlimeArgs):
        self.fn, self.args, self.reasons = fn, args, {}

    def __call__(self, group) -> bool:
        out = self.fn(self.args, group)
        keep, reason = (bool(out.keep), out.reason) if hasattr(out, "keep") else (bool(out), None)
        if not keep and reason:
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
        return keep

    def drain_metrics(self) -> dict[str, float]:
        out = {f"rollout/dynamic_filter/drop_{r}": float(c) for r, c in self.reasons.items()}
        self.reasons = {}
        return out


def adapt_filter(fn: Callable, args: SlimeArgs) -> Callable:
    return SlimeGroupFilter(fn, args) if is_slime_style(fn) else fn


# ---- reward post-process --------------------------------------------------------------------
def adapt_post_process(fn: Callable, args: SlimeArgs, key: str) -> Callable:
    """``f(args, samples) -> (raw_rewards, rewards)`` as rlvr's ``f(samples, tokenizer)``: each
    sample's ``rewards[i]`` goes to ``train_metadata[key]``, the reward the estimator sees
    (``rlvr.algo.advantages.ESTIMATOR_REWARD``); the logged reward stays the raw one."""
    if not is_slime_style(fn):
        return fn

    def post_process(samples, tokenizer) -> None:
        out = fn(args, samples)
        if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(len(x) == len(samples) for x in out)):
            raise ValueError(f"--custom-reward-post-process-path {fn.__module__}.{fn.__name__} must return "
                             f"(raw_rewards, rewards), one of each per sample ({len(samples)})")
        for s, r in zip(samples, out[1]):
            s.train_metadata[key] = float(r)

    return functools.wraps(fn)(post_process)


def post_processed_algo(algo, fn: Callable):
    """The algo group the estimator runs with: a slime post-process (``fn``) hands it finished
    rewards, already normalised as the plugin wished, so group normalisation is off; any other
    ``fn`` (or None) leaves ``algo`` as it is."""
    if fn is None or not is_slime_style(fn):
        return algo
    import dataclasses

    return dataclasses.replace(algo, disable_rewards_normalization=True)


# ---- sample filter ---------------------------------------------------------------------------
def adapt_sample_filter(fn: Callable, args: SlimeArgs) -> Callable:
    """slime's ``--rollout-sample-filter-path`` ``f(args, groups)`` as ``f(groups)``."""
    return functools.wraps(fn)(lambda groups: fn(args, groups))


# ---- custom TIS -----------------------------------------------------------------------------
def adapt_tis(fn: Callable) -> Callable:
    """slime's keyword TIS function as rlvr's ``f(pg_loss, train_log_probs, rollout_log_probs,
    loss_mask, cfg) -> (pg_loss, loss_mask, metrics)`` on [B, T] tensors (see module docstring)."""
    if not is_slime_style(fn):
        return fn
    import torch

    def tis(pg_loss, train_log_probs, rollout_log_probs, loss_mask, cfg):
        b, t = pg_loss.shape
        rows = lambda x: list(x.unbind(0))  # noqa: E731 -- per-sample 1-D tensors, as slime's lists
        out_loss, masks, metrics = fn(SlimeArgs(cfg), pg_loss=pg_loss.reshape(-1), train_log_probs=rows(train_log_probs),
                                      rollout_log_probs=rows(rollout_log_probs), loss_masks=rows(loss_mask),
                                      total_lengths=[t] * b, response_lengths=[t] * b)
        mask = torch.stack(list(masks)) if isinstance(masks, (list, tuple)) else masks.reshape(b, t)
        shaped = {k: (v.reshape(b, t) if torch.is_tensor(v) and v.numel() == b * t else v) for k, v in metrics.items()}
        return out_loss.reshape(b, t), mask, shaped

    return functools.wraps(fn)(tis)
