"""What every engine does with a weight push before its own route: the tensors as name/tensor pairs,
and the one rule for a tied head.

A tied model (``tie_word_embeddings``) has one tensor for the embeddings and the head; a module's
``named_parameters`` names it once, as ``model.embed_tokens.weight``. vLLM keeps a head of its own
(its CPU backend repacks it at start-up), which a push of the embeddings alone leaves stale
(measured: mean |log-prob gap| 1.7e-3 after a 1e-3 relative perturbation, 5e-6 with the head sent),
so the vLLM routes send ``lm_head.weight`` too, in process and to servers alike. Only a tied model
gets it: an untied model's trainer sends its own head, and a push that leaves an untied head out
(adapters, a part of the model) must not overwrite it with the embeddings.

>>> import torch
>>> e = torch.ones(2, 2)
>>> list(with_tied_head({"model.embed_tokens.weight": e}, tied=True))
['model.embed_tokens.weight', 'lm_head.weight']
>>> list(with_tied_head([("model.embed_tokens.weight", e)], tied=False))
['model.embed_tokens.weight']
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

import torch

NamedTensors = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def named_items(named_tensors: NamedTensors) -> Iterable[tuple[str, torch.Tensor]]:
    """A push's tensors as ``(name, tensor)`` pairs, whether it came as a mapping or as pairs."""
    return named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors


def with_tied_head(named_tensors: NamedTensors, tied: bool = True, copy: bool = False) -> dict[str, torch.Tensor]:
    """The tensors in their order, with ``lm_head.weight`` after them where the model ``tied`` its
    head and the push left it out (the embeddings themselves, or with ``copy`` a copy of them:
    safetensors stores no shared tensors)."""
    tensors = dict(named_items(named_tensors))
    if tied and EMBED in tensors and HEAD not in tensors:
        tensors[HEAD] = tensors[EMBED].clone() if copy else tensors[EMBED]
    return tensors


def ties_head(checkpoint: str | Path) -> bool:
    """Whether the Hugging Face checkpoint ``checkpoint`` ties its head to the embeddings (the
    ``tie_word_embeddings`` of its ``config.json``, or of its text model's; transformers' default
    is true)."""
    config = json.loads((Path(checkpoint) / "config.json").read_text())
    return bool(config.get("tie_word_embeddings", config.get("text_config", {}).get("tie_word_embeddings", True)))
