"""Exact token-level KL to the reference (``--kl-loss-type token_level_kl``).

KL(p_theta || p_ref) at a position is ``sum_v p_theta(v) (log p_theta(v) - log p_ref(v))`` over the
whole vocabulary, not an estimate from the sampled token. Both full distributions are needed
while the policy's has a gradient, and ``[response tokens, vocab]`` of them would not fit for a
real vocabulary, so:

1. Before the steps, the reference model runs once (no grad) and keeps, per sample, its last
   hidden states at the response-predicting positions (``[len, H]``: hidden size, not vocabulary)
   along with the sampled tokens' log-probs (``ReferenceStates``).
2. In each training forward the policy's output layer runs chunk by chunk
   (``--log-probs-chunk-size``); each chunk also applies the reference's output layer to the same
   rows and sums ``p (log p - log p_ref)`` (``logprobs.KLReference``); the chunk is recomputed in
   backward. So at most one chunk's ``[chunk, vocab]`` distributions exist at a time, for the
   policy and the reference alike.

Extra memory against a sampled-token estimator (``low_var_kl``): the reference's hidden states of
the rollout (tokens x H floats) and a second ``[chunk, vocab]`` log-softmax per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlvr.train.logprobs import KLReference, decoder_and_head, response_hidden, to_rows, token_log_probs

from rlvr.train.packing import Layout
from rlvr.core.types import Sample


@dataclass
class ReferenceStates:
    """The reference model's output layer and, per sample index, its response hidden states."""

    head: torch.nn.Module
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)

    def for_micro_batch(self, mb: list[int]) -> KLReference:
        """The reference for micro-batch ``mb`` (sample indices, in the order the batch lays them out)."""
        return KLReference(self.head, torch.cat([self.hidden[i] for i in mb]))


@torch.no_grad()
def reference_forward(ref_model: torch.nn.Module, samples: list[Sample], indices: list[int], states: ReferenceStates,
                      temperature: float, width: int, chunk_size: int, layout: Layout) -> torch.Tensor:
    """The reference's log-probs ``[b, width]`` of the sampled tokens of ``samples`` (sample indices
    ``indices``); stores each sample's response hidden states in ``states``."""
    base, head = decoder_and_head(ref_model)
    batch = layout.batch(samples)
    hidden = response_hidden(base, batch)
    lp, _ = token_log_probs(head, hidden, batch.targets, temperature, False, chunk_size)
    for i, part in zip(indices, hidden.split([s.response_length for s in samples])):
        states.hidden[i] = part.clone()
    return to_rows(lp, batch, len(samples), width)
