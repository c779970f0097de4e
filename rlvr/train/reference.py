"""The KL term's reference model, built only when a KL term reads it (``--use-kl-loss`` or a
``--kl-coef``), frozen, never trained.

It is its own copy -- ``--ref-load``, or the initial policy -- or, with LoRA and no ``--ref-load``,
the policy itself with its adapter disabled (no second copy of the weights). Before a rollout's
steps it scores the sampled tokens once (``log_probs``); with ``--kl-loss-type token_level_kl``
it keeps its response hidden states too, for the exact KL over the vocabulary in the policy's
steps (``token_kl.py``). ``--ref-update-interval`` copies the policy into it every that many
rollouts (``refresh``); a checkpoint then saves its weights.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from functools import partial

import torch

from rlvr.algo.kl import TOKEN_LEVEL_KL
from rlvr.core.types import Sample
from rlvr.train import lora
from rlvr.train.batching import MicroBatcher
from rlvr.train.logprobs import decoder_and_head, response_log_probs
from rlvr.train.policy import Policy, load_policy
from rlvr.train.token_kl import ReferenceStates, reference_forward

log = logging.getLogger(__name__)


class Reference:
    """The reference ``model`` (the policy's own when ``lora_state`` is given: its adapter is
    disabled around each forward), whether it keeps hidden states (``exact_kl``), and how often it
    follows the policy (``update_interval`` rollouts, 0 never). ``forwards`` counts its scorings."""

    def __init__(self, model: torch.nn.Module, lora_state: lora.LoraState | None, exact_kl: bool,
                 update_interval: int):
        self.model, self.lora, self.exact_kl, self.update_interval = model, lora_state, exact_kl, update_interval
        self.forwards = 0

    @classmethod
    def build(cls, train, algo, model: torch.nn.Module, lora_state: lora.LoraState | None,
              device: torch.device) -> "Reference | None":
        """The reference of the policy ``model`` (LoRA-wrapped when ``lora_state``), or None without a KL term."""
        if not (algo.use_kl_loss or algo.kl_coef != 0):
            return None
        exact_kl = algo.kl_loss_type == TOKEN_LEVEL_KL
        if lora_state is not None and not train.ref_load:
            log.info("LoRA: the KL reference is the base model with the adapter disabled; no reference copy "
                     "(%.1f MB saved)", lora.base_bytes(model) / 2**20)
            return cls(model, lora_state, exact_kl, train.ref_update_interval)
        ref = load_policy(train.ref_load, train.bf16, device) if train.ref_load else copy.deepcopy(model)
        return cls(ref.requires_grad_(False), None, exact_kl, train.ref_update_interval)

    def _disabled_adapter(self):
        return self.lora.reference() if self.lora is not None else contextlib.nullcontext()

    @torch.no_grad()
    def log_probs(self, policy: Policy, batches: MicroBatcher, samples: list[Sample], kept: set[int], width: int):
        """The reference's log-probs ``[B, width]`` of the kept samples' tokens (this rank's rows;
        summed over the ranks) and, for ``token_level_kl``, its ``ReferenceStates`` (else None)."""
        self.forwards += 1
        with self._disabled_adapter():
            if self.exact_kl:
                return self._with_states(policy, batches, samples, kept, width)
            # LoRA: the policy's own (wrapped: FSDP2 gathers its shards) forward with the adapter off
            forward = policy.module if self.lora is not None else partial(response_log_probs, self.model)
            return batches.forward_all(lambda mb: policy.log_probs(mb, width, False, forward)[0],
                                       samples, kept, width), None

    def _with_states(self, policy: Policy, batches: MicroBatcher, samples: list[Sample], kept: set[int], width: int):
        """token_level_kl: log-probs and the response hidden states of every kept sample (this rank's)
        from one forward."""
        states = ReferenceStates(decoder_and_head(self.model)[1])
        out = torch.zeros(len(samples), width, device=batches.device)
        for mb in batches.split(samples, sorted(kept)):
            out[mb] = reference_forward(self.model, [samples[i] for i in mb], mb, states, policy.temperature,
                                        width, policy.chunk(), policy.layout)
        return batches.dp.all_reduce_sum_(out), states

    def refresh(self, rollout_id: int, policy_model: torch.nn.Module) -> None:
        """``--ref-update-interval``: the policy's weights, after every that many rollouts."""
        if self.update_interval and (rollout_id + 1) % self.update_interval == 0:
            self.model.load_state_dict(policy_model.state_dict())

    def moved_state(self) -> dict | None:
        """What a checkpoint keeps of a reference that ``--ref-update-interval`` moves, else None."""
        return self.model.state_dict() if self.update_interval else None
