"""slime flags that are not rlvr config fields: the one policy for a slime launch script.

A slime launch script carries flags for Megatron, SGLang and GPUs besides the RL
ones. Every RL flag rlvr honours is a config field (``rlvr.config``), parsed like any other. The
flags below are the rest, each with one rule, and ``docs/slime_flags.md`` is this table in prose:

* ``ignored`` -- no meaning in rlvr at the value given (Megatron parallelism of size 1, kernels,
  fp32 accumulation rlvr always does, SGLang memory/kernel tuning the embedded engine has no use
  for). Accepted; ONE warning line lists every ignored flag of the command line and why.
* ``refused`` -- a value that would change the result (tensor parallelism 2, dropout 0.1, a
  Megatron model shape that is not the checkpoint's): ``ConfigError`` saying what to use instead.
  An ``ignored`` flag is refused the same way when its value is not its neutral one.
* ``builtin`` -- asks for what rlvr always does (``--use-slime-router``: every request goes to the
  least-loaded engine, ``rlvr.engine.remote.balance``). Accepted silently.
* ``alias`` -- slime's second name for an rlvr field (``--sglang-max-running-requests`` is
  ``--rollout-max-running-requests``): sets that field.

Megatron model-shape flags (``--num-layers``, ``--hidden-size``, ...) describe the architecture,
which rlvr reads from ``--hf-checkpoint``'s ``config.json``: accepted when they agree with it,
refused when they do not. GPU placement flags (``--actor-num-gpus-per-node``, ``--colocate``, ...)
are config fields (``rlvr.config.cluster``; docs/scaling.md), not entries here.

>>> from argparse import Namespace
>>> ns = Namespace(**{dest("tensor_model_parallel_size"): "1", dest("sequence_parallel"): True})
>>> sorted(apply(ns, {}))
[]
>>> apply(Namespace(**{dest("tensor_model_parallel_size"): "2"}), {})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
rlvr.core.errors.ConfigError: --tensor-model-parallel-size: 2 would change the result: rlvr trains the whole model in each ...
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rlvr.core.errors import ConfigError

log = logging.getLogger("rlvr.compat.slime.flags")

PREFIX = "slime__"  # argparse dest of a table flag, kept apart from the config fields


@dataclass(frozen=True)
class SlimeFlag:
    """One slime flag rlvr has no field for, and what it does with it."""

    name: str  # slime's flag with underscores: tensor_model_parallel_size
    kind: str  # "ignored" | "refused" | "builtin" | "alias" | "shape"
    why: str  # ignored: why it has no meaning here; refused: what to use instead
    takes_value: bool = True  # False: a switch (--sequence-parallel)
    neutral: Callable[[str], bool] | None = None  # ignored with a value: the values accepted
    target: str | None = None  # alias: the rlvr field it sets; shape: the config.json key
    topic: str = ""  # the warning line groups ignored flags by this


def _num_is(*good: float) -> Callable[[str], bool]:
    def check(text: str) -> bool:
        try:
            return float(text) in good
        except ValueError:
            return False

    return check


_FLAGS: list[SlimeFlag] = []


def _add(kind: str, names: str, why: str, **kw) -> None:
    for name in names.split():
        _FLAGS.append(SlimeFlag(name, kind, why, **kw))


# ---- Megatron parallelism: meaningful only at size 1 ----------------------------------------
_MP = "Megatron model parallelism at size 1 (rlvr: whole model per rank)"
_KERNEL = "Megatron kernels/numerics (rlvr: transformers modules, float32 gradients)"
_SGLANG = "SGLang server tuning (rlvr: embedded engine)"
_ARCH = "model shape (rlvr: --hf-checkpoint's config.json, checked)"
_PARALLEL = ("rlvr trains the whole model in each data-parallel rank (no {what}); drop the flag or set it to 1, "
             "and scale with data-parallel ranks (--ray, docs/scaling.md)")
for _name, _what in (("tensor_model_parallel_size", "tensor parallelism"),
                     ("pipeline_model_parallel_size", "pipeline parallelism"),
                     ("context_parallel_size", "context parallelism"),
                     ("expert_model_parallel_size", "expert parallelism"),
                     ("expert_tensor_parallel_size", "expert tensor parallelism"),
                     ("virtual_pipeline_model_parallel_size", "virtual pipeline stages")):
    _add("ignored", _name, _PARALLEL.format(what=_what), neutral=_num_is(1), topic=_MP)
_add("ignored", "sequence_parallel", "a tensor-parallel memory layout; rlvr has no tensor parallelism", takes_value=False,
     topic=_MP)
# ---- Megatron kernels and numerics that rlvr already does, or that change no result ----------
_add("ignored", "attention_backend", "a Megatron kernel choice; rlvr uses the checkpoint's transformers attention",
     topic=_KERNEL)
_add("ignored", "accumulate_allreduce_grads_in_fp32",
     "rlvr keeps gradients and their all-reduce in float32 (float32 master weights)", takes_value=False, topic=_KERNEL)
_add("ignored", "attention_softmax_in_fp32", "transformers computes the attention softmax in float32", takes_value=False,
     topic=_KERNEL)
_add("ignored", "no_gradient_accumulation_fusion no_bias_swiglu_fusion no_bias_dropout_fusion no_rope_fusion "
     "no_masked_softmax_fusion use_distributed_optimizer overlap_grad_reduce overlap_param_gather",
     "a Megatron kernel fusion or communication overlap; no effect on the numbers rlvr computes", takes_value=False,
     topic=_KERNEL)
_add("ignored", "attention_dropout hidden_dropout",
     "rlvr trains with the checkpoint's config.json dropout; 0 here matches RL practice (Qwen configs: 0)",
     neutral=_num_is(0), topic="dropout 0 (rlvr: the checkpoint's config.json dropout)")
# ---- SGLang tuning the embedded engine has no use for -----------------------------------------
_add("ignored", "sglang_attention_backend sglang_chunked_prefill_size sglang_cuda_graph_max_bs "
     "sglang_cuda_graph_bs sglang_disable_cuda_graph sglang_log_level sglang_server_concurrency "
     "sglang_router_ip sglang_router_port",
     "SGLang server tuning; the embedded engine decodes with transformers and has no such setting", topic=_SGLANG)
_add("ignored", "sglang_enable_deterministic_inference",
     "SGLang's batch-invariant inference; the embedded engine's is part of --deterministic-mode (forwards of one call's "
     "rows only), and every request samples from a seed of its own either way", takes_value=False, topic=_SGLANG)
_add("ignored", "sglang_disable_radix_cache sglang_enable_metrics",
     "SGLang server tuning; the embedded engine has no such switch and caches no prefixes", takes_value=False,
     topic=_SGLANG)
_add("builtin", "use_slime_router", "rlvr always sends each request to the engine with the fewest outstanding "
     "requests (rlvr.engine.remote.balance), slime's router policy", takes_value=False)
_add("alias", "sglang_max_running_requests", "", target="rollout_max_running_requests")
# ---- values that would change the result ---------------------------------------------------
_add("refused", "custom_loss_function_path loss_type",
     "rlvr's loss is the registered policy loss (--pg-loss-type) plus KL/entropy terms; register a policy loss "
     "(rlvr.algo.policy_loss.POLICY_LOSSES, docs/algorithms.md) instead")
_add("refused", "load_format", "rlvr loads Hugging Face checkpoints only: --hf-checkpoint")
_add("refused", "micro_batch_size_per_gpu", "use --micro-batch-size (or --use-dynamic-batch-size)")
_add("refused", "fp16", "rlvr trains in float32 or --bf16 (no fp16 loss scaling)", takes_value=False)
# ---- Megatron model shape: must agree with the HF checkpoint -------------------------------
_SHAPE = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size", "ffn_hidden_size": "intermediate_size",
          "num_attention_heads": "num_attention_heads", "num_query_groups": "num_key_value_heads",
          "kv_channels": "head_dim", "norm_epsilon": "rms_norm_eps", "rotary_base": "rope_theta",
          "vocab_size": "vocab_size"}
for _name, _key in _SHAPE.items():
    _add("shape", _name, "the architecture is --hf-checkpoint's config.json", target=_key, topic=_ARCH)
_add("shape", "untie_embeddings_and_output_weights", "the architecture is --hf-checkpoint's config.json",
     takes_value=False, target="tie_word_embeddings", topic=_ARCH)
_add("ignored", "swiglu group_query_attention use_rotary_position_embeddings disable_bias_linear qk_layernorm "
     "add_qkv_bias",
     "the architecture is --hf-checkpoint's config.json (transformers builds it from there)", takes_value=False,
     topic=_ARCH)
_add("ignored", "normalization position_embedding_type",
     "the architecture is --hf-checkpoint's config.json (transformers builds it from there)", topic=_ARCH)

SLIME_FLAGS: dict[str, SlimeFlag] = {}
for _f in _FLAGS:
    if _f.name in SLIME_FLAGS:
        raise RuntimeError(f"slime flag {_f.name} listed twice")
    SLIME_FLAGS[_f.name] = _f


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def dest(name: str) -> str:
    return PREFIX + name


def add_arguments(parser: argparse.ArgumentParser, taken: set[str]) -> None:
    """The table's flags as parser arguments (a group of their own in ``--help``)."""
    group = parser.add_argument_group("slime flags", "slime/Megatron/SGLang flags rlvr accepts, ignores or "
                                                     "refuses by one policy: docs/slime_flags.md")
    for f in SLIME_FLAGS.values():
        if f.name in taken:
            raise RuntimeError(f"{flag(f.name)} is both a config field and a slime-table flag")
        help = {"alias": f"slime's name for --{(f.target or '').replace('_', '-')}", "shape": f"checked against "
                f"config.json {f.target}"}.get(f.kind, f"{f.kind}: {f.why}")
        if f.takes_value:
            group.add_argument(flag(f.name), dest=dest(f.name), default=argparse.SUPPRESS, help=help, metavar="V")
        else:
            group.add_argument(flag(f.name), dest=dest(f.name), default=argparse.SUPPRESS, help=help,
                               action="store_true")


def apply(ns: argparse.Namespace, values: dict[str, Any]) -> dict[str, Any]:
    """Check the table flags given on the command line: refuse, warn once about the ignored ones,
    and return the config values the aliases set (``values`` is what flags and YAML set so far)."""
    given = {k[len(PREFIX):]: v for k, v in vars(ns).items() if k.startswith(PREFIX)}
    ignored: dict[str, list[str]] = {}  # topic -> flags
    out: dict[str, Any] = {}
    for name, value in given.items():
        f = SLIME_FLAGS[name]
        if f.kind == "refused":
            raise ConfigError(flag(name), f"is not supported: {f.why}")
        if f.kind == "alias":
            out[f.target] = value
        elif f.kind == "builtin":
            continue
        elif f.kind == "shape":
            _check_shape(f, value, values.get("hf_checkpoint"))
            ignored.setdefault(f.topic, []).append(flag(name))
        elif f.neutral is not None and not f.neutral(value):
            raise ConfigError(flag(name), f"{value} would change the result: {f.why}")
        else:
            ignored.setdefault(f.topic, []).append(flag(name) if value is True else f"{flag(name)} {value}")
    if ignored:
        log.warning("ignored slime flags, no meaning in rlvr (docs/slime_flags.md): %s",
                    "; ".join(f"{topic}: {' '.join(flags)}" for topic, flags in ignored.items()))
    return out


def _check_shape(f: SlimeFlag, value: str, checkpoint: str | None) -> None:
    """A Megatron shape flag must agree with the checkpoint's config.json (when it names the key)."""
    path = Path(checkpoint) / "config.json" if checkpoint else None
    if path is None or not path.is_file():
        return  # --hf-checkpoint's own check reports a missing checkpoint
    config = json.loads(path.read_text())
    if not f.takes_value:  # --untie-embeddings-and-output-weights: the checkpoint must not tie them
        if config.get(f.target, False):
            raise ConfigError(flag(f.name), f"disagrees with {f.target}=true in {path}: the model is built from "
                                            "--hf-checkpoint's config.json; drop the flag")
        return
    expected = config.get(f.target, config.get("rope_parameters", {}).get(f.target))  # transformers 5: rope_parameters
    if f.target == "head_dim" and expected is None and config.get("num_attention_heads"):
        expected = config["hidden_size"] // config["num_attention_heads"]  # transformers' default head size
    if expected is None:
        return
    try:
        same = float(value) == float(expected)
    except ValueError:
        same = False
    if not same:
        raise ConfigError(flag(f.name), f"{value} disagrees with {f.target}={expected} in {path}: the model is built "
                                        "from --hf-checkpoint's config.json; fix the flag or drop it")


def table_rows() -> list[tuple[str, str, str]]:
    """(flag, rule, why) for every table entry, for docs/slime_flags.md (checked by a test)."""
    rows = []
    for f in SLIME_FLAGS.values():
        if f.kind == "alias":
            rows.append((flag(f.name), "alias", f"sets {flag(f.target or '')}"))
        elif f.kind == "builtin":
            rows.append((flag(f.name), "built in", f.why))
        elif f.kind == "shape":
            rows.append((flag(f.name), "checked", f"config.json `{f.target}` must be false" if not f.takes_value
                         else f"must equal config.json `{f.target}`"))
        else:
            rule = "ignored" + (" if neutral" if f.neutral else "") if f.kind == "ignored" else "refused"
            rows.append((flag(f.name), rule, f.why))
    return rows
