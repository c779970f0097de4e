"""The policy: the causal LM the trainer updates, built complete, and its log-prob forward.

``Policy`` takes a loaded model (``load_policy``: on its device, eval mode, the packed attention)
and, when LoRA is on, the ``lora.LoraState`` already in it; it prepares the decoder layers as
``--recompute-activations`` and ``--compile-layers`` ask and wraps the model with the data-parallel
strategy (``parallel.py``: under ``--ray`` DDP/FSDP2, one rank). The reference copy, if any, is
made before the layers are prepared (``reference.py``), so it is neither compiled nor recomputed.

Dropout stays off (eval mode) in training too, as in slime, so p0 is exactly the policy before the
update; ``--lora-dropout`` acts in the training forwards only (``training``).
"""

from __future__ import annotations

import contextlib
import logging
from functools import partial

import torch
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM
from transformers.modeling_layers import GradientCheckpointingLayer

from rlvr.core.types import Sample
from rlvr.train import lora
from rlvr.train.attention import ATTN_IMPLEMENTATION
from rlvr.train.logprobs import auto_chunk_size
from rlvr.train.packing import Layout
from rlvr.train.parallel import Parallel

log = logging.getLogger(__name__)


def load_policy(path: str, bf16: bool, device: torch.device | str = "cpu") -> torch.nn.Module:
    """A causal LM on ``device`` in eval mode (no dropout) whose attention understands packed micro-batches."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION)
    return model.to(device).eval()


def enable_recompute(model: torch.nn.Module) -> int:
    """Gradient checkpointing of every decoder layer (``--recompute-activations``); returns the
    number of layers. transformers only checkpoints a layer in training mode, and the trainer
    keeps the model in eval mode (no dropout), so only the layer's own flag is set, not its
    children's: dropout inside stays off."""
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for layer in layers:
        layer.gradient_checkpointing = True
        layer._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False)
        layer.training = True  # read by the checkpoint wrapper only
    if not layers:
        raise ValueError(f"{type(model).__name__} has no checkpointable layers; drop --recompute-activations")
    return len(layers)


COMPILED_PARTS = ("mlp", "input_layernorm", "post_attention_layernorm")  # a decoder layer's element-wise work


def compile_layers(model: torch.nn.Module) -> int:
    """``--compile-layers``: each decoder layer's MLP and norms compiled in place
    (``Module.compile``, dynamic shapes: packed rows of any length, one compiled graph for every
    layer); parameter names, checkpoints and weight syncs are unchanged, and the embedded engine
    sharing the module runs the compiled parts too. The packed attention stays eager. Returns the
    number of layers."""
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    parts = [getattr(layer, name) for layer in layers for name in COMPILED_PARTS if hasattr(layer, name)]
    if not parts:
        raise ValueError(f"{type(model).__name__} has no decoder layer with {COMPILED_PARTS}; drop --compile-layers")
    for part in parts:
        part.compile(dynamic=True)
    return len(layers)


def prepare_layers(model: torch.nn.Module, train) -> None:
    """The decoder layers as ``--recompute-activations`` and ``--compile-layers`` ask."""
    if train.recompute_activations:
        enable_recompute(model)
    if train.compile_layers:
        log.info("--compile-layers: %s of %d decoder layers compiled (inductor, dynamic shapes)",
                 "/".join(COMPILED_PARTS), compile_layers(model))


class Policy:
    """The trained model (``model``), the module its forwards go through (``module``: the
    strategy's wrapper, or the model), its LoRA (``lora``, None without) and how its response
    log-probs are computed (temperature, ``--log-probs-chunk-size``, the micro-batch ``layout``:
    packed, or padded as the throughput benchmark's reference)."""

    def __init__(self, model: torch.nn.Module, lora_state: lora.LoraState | None, train, parallel: Parallel,
                 temperature: float, layout: Layout):
        prepare_layers(model, train)
        self.model, self.lora, self.dp = model, lora_state, parallel
        self.module = parallel.wrap(model)  # under --ray: DDP/FSDP2-wrapped, one rank
        self.temperature, self.layout = temperature, layout
        self.chunk_size = train.log_probs_chunk_size
        self.lora_dropout = bool(train.lora_dropout)

    def chunk(self) -> int:
        """Rows per output-layer chunk: --log-probs-chunk-size, or by the vocabulary for -1."""
        if self.chunk_size > 0:
            return self.chunk_size
        return auto_chunk_size(self.model.get_output_embeddings().weight.shape[0])

    def log_probs(self, samples: list[Sample], width: int, with_entropy: bool, forward=None, **kwargs):
        """(log-probs, entropy) ``[b, width]`` of the samples' response tokens through ``forward``:
        the policy's ``module`` by default, or ``response_log_probs`` bound to another model (the
        reference's; same arguments)."""
        return (forward or self.module)(samples, self.temperature, width, with_entropy, self.chunk(),
                                        self.layout.packed, self.layout.share_prompts, **kwargs)

    def training(self):
        """Context of a training forward/backward: ``--lora-dropout``'s masks on, else nothing."""
        return lora.dropout_in_training(self.model) if self.lora_dropout else contextlib.nullcontext()

    def weights(self) -> dict[str, torch.Tensor]:
        """The parameters by HF name (data-parallel: whole tensors; FSDP2 gathers them on rank 0,
        every rank must call); with LoRA what the engines take (``LoraState.weights``)."""
        if self.lora is not None:
            return self.lora.weights(self.model)
        return self.dp.full_weights(self.module, self.model)
