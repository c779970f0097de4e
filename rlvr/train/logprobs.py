"""Log-probs, entropy and the exact token-level KL on a laid-out micro-batch (``rlvr.train.packing``).

Log-probs and entropy are computed only where needed: the hidden states that predict response
tokens are gathered first (token t is predicted at position t - 1), and the output layer and
softmax run on those rows only, ``chunk_size`` rows at a time (``--log-probs-chunk-size``; its
default -1 is ``auto_chunk_size``: as many rows as keep one chunk's float32 logits within 64 MiB,
341 at a 49,152-token vocabulary, 64 at 262,144); under autograd each chunk is recomputed in
backward, so the full ``[tokens, vocab]`` logits never exist at once. With ``--kl-loss-type
token_level_kl`` the same chunks also yield the exact KL to the reference over the whole
vocabulary (``KLReference``: the reference's output layer and its last hidden states at the same
positions), so its ``[chunk, vocab]`` log-softmax exists one chunk at a time too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from rlvr.algo.score_centering import head_token_ids
from rlvr.core.types import Sample
from rlvr.train.attention import PACKED_FORWARD, ATTN_IMPLEMENTATION
from rlvr.train.packing import Layout, TokenBatch
from rlvr.train.routing_replay import set_replay_plan


def response_hidden(base_model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """Last hidden states ``[M, H]`` at the positions that predict the M response tokens."""
    token = PACKED_FORWARD.set("packed_groups" in batch.model_kwargs)
    try:
        hidden = base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                            position_ids=batch.position_ids, **batch.model_kwargs).last_hidden_state
    finally:
        PACKED_FORWARD.reset(token)
    return hidden.reshape(-1, hidden.shape[-1])[batch.src]


# One chunk's float32 logits under --log-probs-chunk-size -1. Each chunk holds a few [chunk, vocab]
# temporaries at once (logits, log-softmax, its exp for the entropy); benchmarks/train_memory.py
# measures the step at one chunk and at this size. Measured on SmolLM2's head (2,048 rows, vocabulary
# 49,152, 2 threads): forward+backward CPU time 9.8-11.4 s at 128-2,048 rows per chunk, 14.4 s at 64.
LOGITS_CHUNK_BYTES = 64 * 2**20


def auto_chunk_size(vocab_size: int) -> int:
    """Rows per output-layer chunk for ``--log-probs-chunk-size -1``: float32 logits of at most
    ``LOGITS_CHUNK_BYTES`` per chunk, and at least 16 rows.

    >>> auto_chunk_size(49152), auto_chunk_size(262144), auto_chunk_size(260)
    (341, 64, 64527)
    """
    return max(16, LOGITS_CHUNK_BYTES // (4 * vocab_size))


@dataclass
class KLReference:
    """What the exact token-level KL needs of the reference model: its output layer (frozen) and
    its last hidden states ``[M, H]`` at the positions that predict the micro-batch's M response
    tokens, in the batch's order (sample by sample, token by token)."""

    head: Callable[[torch.Tensor], torch.Tensor]
    hidden: torch.Tensor


def _chunk_log_probs(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor,
                     temperature: float, with_entropy: bool, ref_head=None, ref_hidden=None):
    logp = (head(hidden).float() / temperature).log_softmax(-1)
    # targets [m] (the response tokens) or [m, 1 + K] (each with score centering's head tokens)
    picked = logp.gather(-1, targets if targets.dim() == 2 else targets.unsqueeze(-1))
    picked = picked if targets.dim() == 2 else picked.squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1) if with_entropy else picked.new_zeros(0)
    if ref_head is None:
        return picked, entropy
    with torch.no_grad():
        ref_logp = (ref_head(ref_hidden).float() / temperature).log_softmax(-1)
    return picked, entropy, (logp.exp() * (logp - ref_logp)).sum(-1)  # rlvr.algo.kl.exact_kl


def token_log_probs(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor,
                    temperature: float, with_entropy: bool, chunk_size: int, kl_ref: KLReference | None = None):
    """log softmax(head(hidden) / T)[target] ``[M]`` and, optionally, the entropy ``[M]`` of each
    row's distribution, ``chunk_size`` rows at a time (recomputed in backward under autograd).
    With ``kl_ref``, a third output: KL(p || p_ref) ``[M]`` summed over the vocabulary."""
    outs: list[list[torch.Tensor]] = [[], [], []]
    for a in range(0, hidden.shape[0], chunk_size):
        args = (head, hidden[a : a + chunk_size], targets[a : a + chunk_size], temperature, with_entropy)
        if kl_ref is not None:
            args += (kl_ref.head, kl_ref.hidden[a : a + chunk_size])
        if torch.is_grad_enabled() and hidden.requires_grad:
            got = checkpoint(_chunk_log_probs, *args, use_reentrant=False)
        else:
            got = _chunk_log_probs(*args)
        for out, value in zip(outs, got):
            out.append(value)
    cat = lambda parts: torch.cat(parts) if parts else hidden.new_zeros(0)  # noqa: E731
    picked, entropy = cat(outs[0]), (cat(outs[1]) if with_entropy else None)
    return (picked, entropy) if kl_ref is None else (picked, entropy, cat(outs[2]))


def to_rows(values: torch.Tensor, batch: TokenBatch, n_rows: int, width: int) -> torch.Tensor:
    """Flat per-response-token ``values [M, ...]`` as right-padded ``[n_rows, width, ...]`` (0 elsewhere);
    differentiable."""
    return values.new_zeros(n_rows, width, *values.shape[1:]).index_put((batch.rows, batch.cols), values)


class OutputLayer(torch.nn.Module):
    """The causal LM's logits as its own ``forward`` computes them from the last hidden state, in
    float32: ``lm_head(h)``, times ``logit_scale`` (Cohere), then ``cap * tanh(logits / cap)``
    with ``cap = final_logit_softcapping`` (Gemma 2/3) -- before any temperature, as in
    ``Gemma2ForCausalLM.forward`` followed by generation's temperature warper."""

    def __init__(self, head: torch.nn.Module, scale: float | None = None, softcap: float | None = None):
        super().__init__()
        self.head, self.scale, self.softcap = head, scale, softcap

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden).float()
        if self.scale is not None:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


# Config fields that change the logits in some causal LM's forward and that OutputLayer does not
# apply: a model with one of them set is refused rather than given wrong log-probs.
UNSUPPORTED_LOGIT_FIELDS = ("logits_scaling", "output_multiplier", "lm_head_multiplier")


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, OutputLayer]:
    """The causal LM's base model (returns hidden states) and its output layer (float32 logits)."""
    config = model.config
    for name in UNSUPPORTED_LOGIT_FIELDS:
        if getattr(config, name, None) not in (None, 1, 1.0):
            raise NotImplementedError(f"{type(model).__name__}: {name} is not supported by the trainer's log-probs")
    head = OutputLayer(model.get_output_embeddings(), getattr(config, "logit_scale", None),
                       getattr(config, "final_logit_softcapping", None))
    return getattr(model, model.base_model_prefix), head


def response_log_probs(model: torch.nn.Module, samples: list[Sample], temperature: float, width: int,
                       with_entropy: bool, chunk_size: int = 1024, packed: bool = True,
                       share_prompts: bool = True, heads: bool = False, kl_ref: KLReference | None = None):
    """Log-probs ``[b, width]`` of each sample's response tokens under ``model`` at ``temperature``
    (right-padded with 0), and the entropy of each position's distribution when asked (else None);
    with ``kl_ref`` also the exact KL to the reference ``[b, width]`` (a third output).
    ``heads``: log-probs ``[b, width, 1 + K]``, each token's log-prob followed by those of its sampler
    head (``Sample.rollout_topk_token_ids``, score centering; padding gathers token 0)."""
    if getattr(model.config, "_attn_implementation", None) != ATTN_IMPLEMENTATION:
        # Any other attention would let packed samples attend to each other: wrong numbers, silently.
        raise ValueError(f"response_log_probs needs a model loaded with attn_implementation={ATTN_IMPLEMENTATION!r} "
                         f"(rlvr.train.trainer.load_policy); this one uses {model.config._attn_implementation!r}")
    base, head = decoder_and_head(model)
    batch = Layout(packed, share_prompts).batch(samples).to(model.device)
    set_replay_plan(model, batch, samples)  # R3: the engine's experts at every position (no-op otherwise)
    targets = batch.targets
    if heads:
        ids = head_token_ids(samples, width).to(targets.device)[batch.rows, batch.cols]  # [M, K]
        targets = torch.cat([targets.unsqueeze(-1), ids], dim=-1)
    out = token_log_probs(head, response_hidden(base, batch), targets, temperature, with_entropy, chunk_size, kl_ref)
    rows = lambda v: to_rows(v, batch, len(samples), width) if v is not None else None  # noqa: E731
    return tuple(rows(v) for v in out)
