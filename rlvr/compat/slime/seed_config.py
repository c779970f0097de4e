"""A nested YAML config for slime (``examples/slime_seed/grpo_math_7b.yaml``) onto rlvr's flat config fields.

The file has seven groups: ``actor_rollout_ref.model.path``, ``training``,
``algorithm``, ``rollout``, ``distributed``, ``async_rollout`` and ``reward`` (a list of
``{type, weight}``). ``is_seed_schema`` recognises such a file by those groups; ``translate`` maps
every field of it onto rlvr's fields and returns, besides the values, the lines to warn and the
lines that refuse. It is a pure function: the few things it needs from the config (the fields
the command line sets, the defaults) are passed in; ``read`` (what ``rlvr.config.parse`` calls)
raises the refusals as one ``ConfigError`` and logs each warning. docs/slime_flags.md ("The
nested YAML file and its commands") is this module's table in prose, field by field.

Three choices are made here, each stated where it is made:

* sizes the file counts in prompts (``train_batch_size``, ``ppo_mini_batch_size``) become
  rlvr's sample counts (x ``group_size``), and ``train_batch_size`` must equal
  ``ppo_mini_batch_size x gradient_accumulation`` (the example's own numbers: 64 x 4 = 256);
* ``kl_coef`` is the KL *loss* coefficient (``--use-kl-loss --kl-loss-coef``), as slime's GRPO
  recipes set it, and ``kl_type`` names follow slime's code, not the schema's table (``KL_TYPES``);
* a field with no meaning here is accepted at its neutral value with one line saying why, and
  refused with what to do otherwise, as ``rlvr.compat.slime.flags`` treats slime's flags.

>>> raw = {"algorithm": {"name": "reinforce++", "group_size": 4, "kl_type": "kl_estimator_k1",
...                      "kl_coef": 0.01}, "reward": [{"type": "math_verify", "weight": 1.0}]}
>>> out = translate(raw, "f.yaml", given={}, defaults={"n_samples_per_prompt": 8})
>>> sorted(out.values.items())  # doctest: +NORMALIZE_WHITESPACE
[('advantage_estimator', 'reinforce_plus_plus'), ('kl_loss_coef', 0.01), ('kl_loss_type', 'k1'),
 ('n_samples_per_prompt', 4), ('rm_type', 'math=1.0'), ('use_kl_loss', True)]
>>> out.refused, len(out.warnings)
([], 1)
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

from rlvr.compat.slime.flags import SLIME_FLAGS
from rlvr.core.errors import ConfigError

log = logging.getLogger(__name__)

# The nested file's groups; the first five only such a file has (rlvr's grouped YAML also has
# ``rollout`` and ``reward``, as dicts of rlvr fields).
SEED_GROUPS = ("actor_rollout_ref", "training", "algorithm", "rollout", "distributed", "async_rollout", "reward")
_SEED_ONLY = ("actor_rollout_ref", "training", "algorithm", "distributed", "async_rollout")

# Fields that mean what an rlvr field means, in the same unit.
RENAMES: dict[str, str] = {
    "actor_rollout_ref.model.path": "hf_checkpoint",
    "training.total_epochs": "num_epoch",
    "training.rollout_batch_size": "rollout_batch_size",
    "training.lr": "lr",
    "training.weight_decay": "weight_decay",
    "training.save_interval": "save_interval",
    "training.eval_interval": "eval_interval",
    "algorithm.group_size": "n_samples_per_prompt",
    "algorithm.clip_eps": "eps_clip",
    "algorithm.entropy_coef": "entropy_coef",
    "rollout.num_engines": "rollout_num_engines",
    "rollout.max_new_tokens": "rollout_max_response_len",
    "rollout.temperature": "rollout_temperature",
    "rollout.top_p": "rollout_top_p",
    "distributed.use_colocate": "colocate",
    "async_rollout.enabled": "async_train",
    "async_rollout.max_staleness": "max_staleness",
}
# Fields translated by a rule of their own (below).
RULED = ("training.train_batch_size", "training.ppo_mini_batch_size", "training.gradient_accumulation",
         "algorithm.name", "algorithm.kl_type", "algorithm.kl_coef", "rollout.gpu_per_engine",
         "distributed.training_nodes", "distributed.rollout_nodes", "distributed.tp_size", "distributed.pp_size",
         "async_rollout.concurrency", "reward")

ALGORITHMS = {"ppo": "ppo", "grpo": "grpo", "reinforce++": "reinforce_plus_plus", "gspo": "gspo"}
# The schema's kl_type names -> slime's --kl-loss-type. The schema's table writes r - 1 - log r under
# "k1" and a third-order series under "k3"; slime's code (and rlvr.algo.kl) calls log r "k1" and
# r - 1 - log r (r = p_ref / p) "k3". The names follow the code: a slime user's k1 run is a k1 run.
KL_TYPES = {"kl_estimator_k1": "k1", "kl_estimator_k3": "k3", "token_level_kl": "token_level_kl"}
SLIME_KL_TYPES = ("k1", "k2", "k3", "low_var_kl", "token_level_kl")
REWARDS = {"math_verify": "math", "format_check": "format"}  # other types are rlvr --rm-type names


@dataclass
class SeedConfig:
    """What a nested file sets: flat ``{rlvr field: value}``, the file's key each came from, the
    lines to warn (accepted) and the lines that refuse (one per field)."""

    values: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def set(self, name: str, value: Any, key: str) -> None:
        self.values[name], self.origin[name] = value, key


def is_seed_schema(raw: Mapping[str, Any]) -> bool:
    """A file in the nested schema: one of its own groups, or ``reward`` as a list."""
    return any(k in raw for k in _SEED_ONLY) or isinstance(raw.get("reward"), list)


def documented_keys() -> list[str]:
    """Every nested field this module reads (docs/slime_flags.md lists each; a test checks)."""
    return [*RENAMES, *RULED]


def _flatten(raw: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"training": {"lr": 1}}`` -> ``{"training.lr": 1}``; lists (``reward``) stay values."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and key != "reward":
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def translate(raw: Mapping[str, Any], path: str, given: Mapping[str, Any], defaults: Mapping[str, Any]) -> SeedConfig:
    """The nested file ``raw`` (top level: its groups only) as rlvr values. ``given`` holds the
    fields the command line sets (it overrides the file; the sizes counted in prompts use its
    ``n_samples_per_prompt``), ``defaults`` rlvr's defaults."""
    items, out = _flatten(raw), SeedConfig()
    for key, value in items.items():
        if key in RENAMES:
            out.set(RENAMES[key], value, key)
        elif key not in RULED:
            close = difflib.get_close_matches(key, documented_keys(), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            out.refused.append(f"{key}: not a field of the nested slime schema (docs/slime_flags.md){hint}")
    group = given.get("n_samples_per_prompt", items.get("algorithm.group_size", defaults.get("n_samples_per_prompt")))
    _batch_sizes(items, out, group if isinstance(group, int) else None)
    _algorithm(items, out)
    _parallelism(items, out, bool(given.get("ray")))
    _concurrency(items, out, group if isinstance(group, int) else None)
    _reward(items.get("reward"), out)
    return out


def read(raw: Mapping[str, Any], path: str, given: Mapping[str, Any], defaults: Mapping[str, Any]) -> SeedConfig:
    """``translate``, then refuse (one ``ConfigError`` with a line per field) or warn (a line each)."""
    out = translate(raw, path, given, defaults)
    if out.refused:
        raise ConfigError("--config", f"{path}: {len(out.refused)} field(s) of the nested slime schema that rlvr cannot "
                                      "run as written (docs/slime_flags.md):" + "".join(f"\n  {line}" for line in out.refused))
    for line in out.warnings:
        log.warning("%s: %s", path, line)
    return out


def _int(items: Mapping[str, Any], key: str, out: SeedConfig) -> int | None:
    """The nested field ``key`` as an int (None when absent; a refusal line when not an integer)."""
    value = items.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        out.refused.append(f"{key}: expected a positive integer, got {value!r}")
        return None
    return value


def _batch_sizes(items: Mapping[str, Any], out: SeedConfig, group: int | None) -> None:
    """The file counts prompts: ``train_batch_size`` per optimizer step, made of
    ``gradient_accumulation`` mini-batches of ``ppo_mini_batch_size`` (its comments; 64 x 4 = 256).
    rlvr counts samples: --global-batch-size and --micro-batch-size are those x the group size.
    A micro-batch only bounds memory (every one is normalised by the whole step's size)."""
    train, mini, accum = (_int(items, f"training.{k}", out)
                          for k in ("train_batch_size", "ppo_mini_batch_size", "gradient_accumulation"))
    if train and mini and accum and train != mini * accum:
        out.refused.append(f"training.train_batch_size: {train} prompts per optimizer step is not ppo_mini_batch_size "
                           f"{mini} x gradient_accumulation {accum} = {mini * accum}; make them agree")
        return
    if train and accum and not mini:
        if train % accum:
            out.refused.append(f"training.gradient_accumulation: {accum} does not divide train_batch_size {train}")
            return
        mini = train // accum
    train = train or (mini * accum if mini and accum else None)
    if accum and not (train or mini):
        out.warnings.append(f"training.gradient_accumulation {accum}: sets nothing without train_batch_size or "
                            "ppo_mini_batch_size (rlvr's --micro-batch-size, in samples, bounds memory only)")
    if group is None:
        return
    if train:
        out.set("global_batch_size", train * group, "training.train_batch_size")
    if mini:
        out.set("micro_batch_size", mini * group, "training.ppo_mini_batch_size")


def _algorithm(items: Mapping[str, Any], out: SeedConfig) -> None:
    """``name`` -> --advantage-estimator; ``kl_coef`` -> the KL loss (slime's GRPO recipes:
    --use-kl-loss --kl-loss-coef; token_level_kl exists only as a loss term); ``kl_type`` by
    slime's names, with one warning when the file uses the schema's (``KL_TYPES``)."""
    name = items.get("algorithm.name")
    if name is not None:
        out.set("advantage_estimator", ALGORITHMS.get(str(name), str(name)), "algorithm.name")
    coef = items.get("algorithm.kl_coef")
    if coef is not None:
        out.set("kl_loss_coef", coef, "algorithm.kl_coef")
        if coef != 0:
            out.set("use_kl_loss", True, "algorithm.kl_coef")
    kl = items.get("algorithm.kl_type")
    if kl is None:
        return
    if kl not in KL_TYPES and kl not in SLIME_KL_TYPES:
        valid = ", ".join({**KL_TYPES, **dict.fromkeys(SLIME_KL_TYPES)})
        out.refused.append(f"algorithm.kl_type: unknown {kl!r}; valid: {valid}")
        return
    out.set("kl_loss_type", KL_TYPES.get(kl, kl), "algorithm.kl_type")
    if kl in ("kl_estimator_k1", "kl_estimator_k3"):
        out.warnings.append(KL_WARNING.format(kl=kl, slime=KL_TYPES[kl]))


KL_WARNING = ("algorithm.kl_type {kl} is slime's --kl-loss-type {slime}: k1 = log(p/p_ref), k3 = r - 1 - log r with "
              "r = p_ref/p (slime's code, rlvr.algo.kl). The schema's table gives k1 the formula r - 1 - log r, which is "
              "k3, and k3 a third-order series no estimator here computes; write kl_type: k3 for r - 1 - log r "
              "(docs/slime_flags.md)")


def _neutral(items: Mapping[str, Any], key: str, out: SeedConfig, ok: bool, why: str, refuse: str) -> None:
    """A field with no meaning here: one warning line at its neutral value, else one refusal."""
    if key in items:
        (out.warnings if ok else out.refused).append(f"{key} {items[key]}: {why if ok else refuse}")


# (field, slime flag whose rule it follows, what rlvr lacks)
_MEGATRON = (("distributed.tp_size", "tensor_model_parallel_size", "tensor parallelism"),
             ("distributed.pp_size", "pipeline_model_parallel_size", "pipeline parallelism"))


def _parallelism(items: Mapping[str, Any], out: SeedConfig, ray: bool) -> None:
    """Megatron parallelism (the rule of slime's --tensor-model-parallel-size and
    --pipeline-model-parallel-size: ignored at 1, refused above), engine GPUs, node counts."""
    for key, flag, what in _MEGATRON:
        rule = SLIME_FLAGS[flag]
        ok = key in items and rule.neutral is not None and rule.neutral(str(items[key]))
        _neutral(items, key, out, ok, f"ignored, {rule.topic}", f"rlvr trains the whole model in each data-parallel "
                 f"rank (no {what}): set 1, and scale with data-parallel ranks (--ray, docs/scaling.md)")
    _neutral(items, "rollout.gpu_per_engine", out, items.get("rollout.gpu_per_engine") == 1,
             "ignored: each rlvr engine runs on one device (--device; under --ray --rollout-num-gpus, docs/scaling.md)",
             "an embedded engine runs on one GPU (no tensor-parallel engines): set 1, or serve the model with SGLang "
             "and pass --rollout-external-engine-addrs (docs/scaling.md)")
    nodes = _int(items, "distributed.training_nodes", out)
    if nodes is not None and (nodes == 1 or ray):
        out.set("actor_num_nodes", nodes, "distributed.training_nodes")
    elif nodes is not None:
        out.refused.append(f"distributed.training_nodes {nodes}: more than one machine needs Ray: add --ray (the "
                           "training ranks go to the Ray cluster's nodes, docs/scaling.md) or set 1")
    _neutral(items, "distributed.rollout_nodes", out, items.get("distributed.rollout_nodes") == 1,
             "ignored: rlvr counts engines (rollout.num_engines), not their nodes",
             "rlvr counts engines, not their nodes: set 1 and give rollout.num_engines (under --ray, "
             "--rollout-num-gpus places GPU engines where the cluster has room, docs/scaling.md)")


def _concurrency(items: Mapping[str, Any], out: SeedConfig, group: int | None) -> None:
    """``concurrency`` counts requests in flight; rlvr's --rollout-concurrency counts prompt groups
    (each ``group_size`` requests): the largest whole number of groups within it."""
    requests = _int(items, "async_rollout.concurrency", out)
    if requests is None or group is None:
        return
    groups = max(1, requests // group)
    out.set("rollout_concurrency", groups, "async_rollout.concurrency")
    if groups * group != requests:
        out.warnings.append(f"async_rollout.concurrency {requests}: rlvr keeps whole prompt groups in flight: "
                            f"{groups} groups of {group} = {groups * group} requests (--rollout-concurrency {groups})")


def _reward(entries: Any, out: SeedConfig) -> None:
    """``[{type, weight}, ...]`` -> the weighted composite ``--rm-type math=1.0,format=0.1``."""
    if entries is None:
        return
    if not isinstance(entries, list) or not entries:
        out.refused.append(f"reward: expected a list of {{type, weight}}, got {entries!r}")
        return
    parts = []
    for i, entry in enumerate(entries):
        extra = set(entry) - {"type", "weight"} if isinstance(entry, Mapping) else None
        if extra is None or "type" not in entry or extra:
            out.refused.append(f"reward[{i}]: expected {{type: NAME, weight: NUMBER}}, got {entry!r}")
            continue
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            out.refused.append(f"reward[{i}].weight: expected a number, got {weight!r}")
            continue
        parts.append(f"{REWARDS.get(str(entry['type']), entry['type'])}={float(weight)}")
    out.set("rm_type", ",".join(parts), "reward")
