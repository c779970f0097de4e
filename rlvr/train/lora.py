"""LoRA for RL, on PEFT: train low-rank adapters, keep one copy of the base weights.

``--lora-rank R`` (or ``--lora-adapter-path DIR``) wraps the policy with PEFT's LoRA layers on
``--target-modules`` (``all-linear``: every linear layer but the output layer, PEFT's meaning).
Only the adapters' parameters require gradients, so only they carry AdamW state (and float32
masters under ``--bf16``). What changes elsewhere, each in a small hook that calls in here:

* **Reference model**: the base with the adapter disabled (``reference``), no second copy of the
  weights. The trainer logs the bytes that saves.
* **Weight sync**: ``adapter_weights`` -- only the adapters' tensors. The embedded engine holds the
  same LoRA-wrapped model (a copy of the trainer's, or ``engine_model`` in a Ray engine actor) and
  applies them unmerged: its forward is base + scaled low-rank product, the trainer's own
  computation, so the two agree to float rounding of the same operations. External engines
  (``--rollout-external-engine-addrs``, supervised ``rlvr serve`` processes) receive
  ``merged_weights`` (plain HF names, W0 + scale * B @ A) through ``/update_weights_from_disk``.
* **Checkpoints**: the adapter as PEFT writes it (``adapter_config.json`` +
  ``adapter_model.safetensors``: ``PeftModel.from_pretrained`` loads it) next to the trainer state;
  ``rlvr export`` merges it into the base, or copies the adapter alone (``--adapter-only``).

Dropout: the trainer keeps the model in eval mode (p0 is the policy before the update), so
``--lora-dropout`` acts in the training forwards only (``dropout_in_training``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from rlvr.core.errors import ConfigError

log = logging.getLogger(__name__)

ADAPTER = "default"  # PEFT's adapter name; one adapter per policy
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def enabled(train) -> bool:
    """Whether the run trains LoRA adapters (``--lora-rank`` > 0 or ``--lora-adapter-path``)."""
    return bool(train.lora_rank) or train.lora_adapter_path is not None


def rank_and_alpha(train) -> tuple[int, float]:
    """The adapter's rank and alpha (scale = alpha / rank): ``--lora-adapter-path``'s own, else
    ``--lora-rank`` and ``--lora-alpha`` (default 2 x rank); (0, 0) without LoRA."""
    if train.lora_adapter_path is not None:
        saved = json.loads((Path(train.lora_adapter_path) / "adapter_config.json").read_text())
        return int(saved["r"]), float(saved["lora_alpha"])
    return train.lora_rank, float(train.lora_alpha or 2 * train.lora_rank)


def is_adapter_checkpoint(directory: str | Path) -> bool:
    return (Path(directory) / ADAPTER_FILES[0]).is_file()


# ---- wrapping the policy --------------------------------------------------------------------
def linear_layers(model: torch.nn.Module) -> dict[str, torch.nn.Linear]:
    """The model's linear layers by module name, the output layer left out (LoRA's ``all-linear``)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head}


def check_targets(model: torch.nn.Module, targets: list[str], rank: int) -> None:
    """Every ``--target-modules`` entry names linear layers of ``model`` (by last name, e.g.
    ``q_proj``, or by a dotted suffix), and ``--lora-rank`` fits every targeted layer."""
    layers = linear_layers(model)
    kinds = sorted({n.rsplit(".", 1)[-1] for n in layers})
    if targets == ["all-linear"]:
        chosen = layers
    else:
        chosen = {}
        for t in targets:
            hit = {n: m for n, m in layers.items() if n == t or n.endswith("." + t)}
            if not hit:
                raise ConfigError("--target-modules", f"{t!r} is not a linear layer of {type(model).__name__}; "
                                                      f"its linear layers are {kinds} (or use all-linear)")
            chosen |= hit
    if not chosen:
        raise ConfigError("--target-modules", f"{type(model).__name__} has no linear layer besides the output layer")
    for name, m in chosen.items():
        if rank > min(m.in_features, m.out_features):
            raise ConfigError("--lora-rank", f"{rank} is larger than layer {name} ({m.in_features} -> "
                                             f"{m.out_features}) allows; use at most "
                                             f"{min(min(x.in_features, x.out_features) for x in chosen.values())}")


def add_adapter(model: torch.nn.Module, train):
    """``model`` wrapped by PEFT (modified in place: its targeted linears become LoRA layers, its
    base parameters frozen); returns the ``PeftModel``. From ``--lora-adapter-path`` when given
    (that adapter's rank, alpha and targets), else a fresh adapter (B = 0: the policy starts equal
    to the base)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if train.lora_adapter_path is not None:
        peft_model = PeftModel.from_pretrained(model, train.lora_adapter_path, adapter_name=ADAPTER, is_trainable=True)
        return peft_model.eval()  # new modules start in training mode; dropout only where asked
    targets = list(train.target_modules)
    check_targets(model, targets, train.lora_rank)
    config = LoraConfig(r=train.lora_rank, lora_alpha=train.lora_alpha or 2 * train.lora_rank,
                        lora_dropout=train.lora_dropout,
                        target_modules="all-linear" if targets == ["all-linear"] else targets,
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config, adapter_name=ADAPTER).eval()


def base_bytes(model: torch.nn.Module) -> int:
    """Bytes of the frozen (base) parameters: what a separate reference copy would have cost."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)


def reference(peft_model):
    """Context in which the policy's forward is the base model's (the KL reference)."""
    return peft_model.disable_adapter()


@contextlib.contextmanager
def dropout_in_training(model: torch.nn.Module):
    """LoRA dropout on for one training forward/backward (the rest of the model stays in eval mode)."""
    dropouts = [m for n, m in model.named_modules() if n.endswith("lora_dropout." + ADAPTER)]
    for m in dropouts:
        m.train()
    try:
        yield
    finally:
        for m in dropouts:
            m.eval()


@dataclass
class LoraState:
    """The policy's LoRA, built with it (``add``): the PEFT model wrapping the policy in place (its
    adapters the only trainable parameters) and what the engines receive (``sync_merged``:
    merged weights for engines without LoRA layers, else the adapters)."""

    peft: object  # peft.PeftModel
    sync_merged: bool = False

    @classmethod
    def add(cls, model: torch.nn.Module, train, sync_merged: bool = False) -> "LoraState | None":
        """The adapter added to ``model`` when ``train`` asks for LoRA, else None."""
        return cls(add_adapter(model, train), sync_merged) if enabled(train) else None

    def weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return merged_weights(model) if self.sync_merged else adapter_weights(model)

    def reference(self):
        """Context in which the policy's forward is the base model's (the KL reference)."""
        return reference(self.peft)


# ---- what the engines receive ----------------------------------------------------------------
def whole(t: torch.Tensor) -> torch.Tensor:
    """``t`` whole: an FSDP2 shard (a DTensor) is gathered, a collective every rank must join."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def adapter_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors by parameter name (the names the engine's LoRA-wrapped copy has),
    whole on every rank under FSDP2 (every rank must call)."""
    return {n: whole(p.detach()) for n, p in model.named_parameters() if p.requires_grad}


def _lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def merged_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter under its plain HF name, LoRA layers merged (W0 + scale * B @ A): what an
    engine without LoRA layers loads."""
    lora = _lora_layers(model)
    out = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                continue
            owner = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
            plain = name.replace(".base_layer.", ".")
            if owner in lora and name.endswith(".base_layer.weight"):
                out[plain] = (p + lora[owner].get_delta_weight(ADAPTER).to(p.dtype)).detach()
            else:
                out[plain] = p.detach()
    return out


def engine_model(train):
    """A Ray engine actor's model: the base from ``--hf-checkpoint`` with the same LoRA layers as
    the trainer's (their values arrive with the first weight sync)."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(train.hf_checkpoint, dtype=torch.float32)
    add_adapter(base, train)
    return base


# ---- checkpoints -------------------------------------------------------------------------------
PEFT_PREFIX = "base_model.model."  # a PeftModel's names of the wrapped model's parameters


def save_adapter(peft_model, directory: Path, adapter: dict[str, torch.Tensor]) -> None:
    """PEFT's adapter files from ``adapter`` (``adapter_weights``: whole tensors, also under FSDP2)."""
    peft_model.save_pretrained(directory, state_dict={PEFT_PREFIX + n: t for n, t in adapter.items()})


def read_adapter(model: torch.nn.Module, directory: Path) -> dict[str, torch.Tensor]:
    """The adapter saved in ``directory`` under ``model``'s parameter names (whole tensors, for
    ``load_state_dict`` or FSDP2's ``set_model_state_dict``); every adapter parameter of ``model``
    must be there and nothing else."""
    from peft.utils import load_peft_weights

    saved = load_peft_weights(str(directory))
    out, missing = {}, []
    for name, p in model.named_parameters():
        if p.requires_grad:
            key = PEFT_PREFIX + name.replace(f".{ADAPTER}.", ".")  # PEFT's files drop the adapter name
            if key in saved:
                out[name] = saved.pop(key)
            else:
                missing.append(key)
    if missing or saved:
        raise ValueError(f"{directory}: the adapter does not match the run's LoRA layers "
                         f"(missing {missing[:3]}, unexpected {list(saved)[:3]})")
    return out


def export_lora(checkpoint: Path, out_dir: Path, adapter_only: bool) -> Path:
    """``rlvr export`` of a LoRA checkpoint: the adapter alone (PEFT's files, loadable with
    ``PeftModel.from_pretrained``), or the base with the adapter merged in (a plain HF checkpoint)."""
    import json

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    if adapter_only:
        for f in ADAPTER_FILES:
            shutil.copy2(Path(checkpoint) / f, out_dir / f)
    else:
        base_path = json.loads((Path(checkpoint) / ADAPTER_FILES[0]).read_text())["base_model_name_or_path"]
        if not (Path(base_path) / "config.json").is_file():
            raise ConfigError("checkpoint", f"{checkpoint}: its adapter's base model {base_path} is not there "
                                            "(run from the training directory, or use --adapter-only)")
        base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
        merged = PeftModel.from_pretrained(base, str(checkpoint)).merge_and_unload()
        merged.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def has_adapter(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds PEFT LoRA layers (by their parameter names: no PEFT import needed)."""
    return any(".lora_A." in n for n, _ in model.named_parameters())
