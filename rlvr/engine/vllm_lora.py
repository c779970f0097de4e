"""LoRA adapters into vLLM through its own LoRA route, for the in-process engine and the servers.

With ``--lora-rank`` the trainer sends only its adapters (``rlvr.train.lora.adapter_weights``:
``...q_proj.lora_A.<adapter>.weight`` and ``lora_B``). vLLM serves a LoRA adapter from a PEFT folder
(``adapter_config.json`` + ``adapter_model.safetensors``), so each push writes one under
``/dev/shm`` (shared memory, no disk write) and loads it under one fixed name and id with
``load_inplace`` (``LLMEngine.add_lora``, or a server's ``/v1/load_lora_adapter``): the adapter
is replaced in place, and every request carries that one LoRA request, so the weights a request
samples with are always the newest pushed. The base model in vLLM stays the checkpoint's.

The adapter's targets and rank are read from the tensors themselves (the layers the trainer
wrapped, ``lora_A``'s rows); its scale comes from ``--lora-alpha`` (``alpha / rank``, PEFT's).
vLLM caps the rank at ``max_lora_rank``, one of ``VLLM_LORA_RANKS``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Mapping

import torch
from safetensors.torch import save_file

LORA_NAME, LORA_ID = "rlvr-policy", 1
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's accepted max_lora_rank values
_ADAPTER_TENSOR = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$")


def is_adapter(names) -> bool:
    """Whether the tensors named are LoRA adapters only (what the trainer sends with ``--lora-rank``).

    >>> is_adapter(["model.layers.0.self_attn.q_proj.lora_A.default.weight"]), is_adapter(["lm_head.weight"])
    (True, False)
    """
    names = list(names)
    return bool(names) and all(_ADAPTER_TENSOR.match(n) for n in names)


def peft_key(name: str) -> str:
    """A wrapped model's adapter parameter name -> its key in PEFT's adapter file.

    >>> peft_key("model.layers.0.self_attn.q_proj.lora_A.default.weight")
    'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight'
    """
    m = _ADAPTER_TENSOR.match(name)
    if m is None:
        raise ValueError(f"{name!r} is not a LoRA adapter tensor (…lora_A/lora_B[.adapter].weight)")
    return f"base_model.model.{m['module']}.lora_{m['ab']}.weight"


def max_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``.

    >>> max_lora_rank(4), max_lora_rank(8), max_lora_rank(9)
    (8, 8, 16)
    """
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"--lora-rank {rank}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}")


def write_adapter(folder: Path, tensors: Mapping[str, torch.Tensor], alpha: float) -> Path:
    """The adapter ``tensors`` as a PEFT folder vLLM loads; returns ``folder``."""
    state = {peft_key(n): t.detach().to("cpu").contiguous() for n, t in tensors.items()}
    ranks = {t.shape[0] for k, t in state.items() if ".lora_A." in k}
    if len(ranks) != 1:
        raise ValueError(f"LoRA adapter tensors with ranks {sorted(ranks)}: vLLM needs one rank for all layers")
    targets = sorted({k.rsplit(".lora_", 1)[0].rsplit(".", 1)[-1] for k in state})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": ranks.pop(), "lora_alpha": alpha,
              "target_modules": targets, "bias": "none", "use_rslora": False, "use_dora": False,
              "modules_to_save": None, "fan_in_fan_out": False, "lora_dropout": 0.0}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return folder
