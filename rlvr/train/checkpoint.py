"""A trainer checkpoint on disk, and the plain HF export of the policy.

A checkpoint directory holds the policy as a plain HF checkpoint (with LoRA: the adapter alone, as
PEFT writes it), ``trainer_state.pt`` (``optimizer``, ``step``, ``extra``, ``guard_streak``; with
``--bf16`` the float32 ``master`` weights; ``ref_model`` when ``--ref-update-interval`` moves the
reference) and, with PPO, ``critic/`` (its optimizer state under ``critic_optimizer``). It is
written under a temporary name and renamed, so a crash mid-save never leaves a half-written
checkpoint under the final name. Data-parallel: whole tensors (a collective under FSDP2), written
by rank 0 alone; every rank reads the whole checkpoint on load (FSDP2 keeps its shards).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from rlvr.train import lora
from rlvr.train.critic import CriticTrainer
from rlvr.train.guard import BadStepGuard
from rlvr.train.optimizer import Optimizer
from rlvr.train.policy import Policy
from rlvr.train.reference import Reference

STATE_FILE = "trainer_state.pt"


def save_hf(model, tokenizer, directory: str | Path) -> Path:
    """A plain HF checkpoint of ``model`` and ``tokenizer`` (a LoRA-wrapped policy is written merged)."""
    merged = lora.merged_weights(model) if lora.has_adapter(model) else None
    model.save_pretrained(directory, state_dict=merged)
    tokenizer.save_pretrained(directory)
    return Path(directory)


class CheckpointIO:
    """Writes and reads the state of a trainer's parts: the policy, its optimizer and masters, a
    moved reference, the critic and the bad-step guard's streak."""

    def __init__(self, policy: Policy, optimizer: Optimizer, reference: Reference | None,
                 critic: CriticTrainer | None, guard: BadStepGuard):
        self.policy, self.optimizer, self.reference, self.critic, self.guard = (
            policy, optimizer, reference, critic, guard)

    def save(self, directory: str | Path, step: int, tokenizer=None, extra: dict | None = None) -> Path:
        """Write the checkpoint of optimizer step ``step`` with the caller's ``extra``."""
        directory, p = Path(directory), self.policy
        adapter = lora.adapter_weights(p.model) if p.lora is not None else None
        model_state = p.dp.full_state_dict(p.module, p.model) if p.lora is None else None
        optimizer_state = p.dp.optimizer_state(p.module, self.optimizer.adamw)
        if p.dp.rank != 0:
            return directory
        tmp = directory.with_name(directory.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        if p.lora is not None:  # LoRA: the adapter alone, as PEFT writes it
            lora.save_adapter(p.lora.peft, tmp, adapter)
        else:
            p.model.save_pretrained(tmp, state_dict=model_state)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        state = {"optimizer": optimizer_state, "step": step, "extra": extra or {},
                 "guard_streak": list(self.guard.streak)}
        # What an exact resume needs beyond the HF weights: --bf16's float32 masters, and a
        # reference model that --ref-update-interval has moved away from its starting weights.
        if (masters := self.optimizer.masters()) is not None:
            state["master"] = masters
        if self.reference is not None and (moved := self.reference.moved_state()) is not None:
            state["ref_model"] = moved
        if self.critic is not None:
            state["critic_optimizer"] = self.critic.save(tmp / "critic")
        torch.save(state, tmp / STATE_FILE)
        shutil.rmtree(directory, ignore_errors=True)
        tmp.rename(directory)
        return directory

    def load(self, directory: str | Path) -> tuple[int, dict]:
        """Restore what ``save`` wrote into the parts; returns its ``(step, extra)``."""
        directory, p = Path(directory), self.policy
        state = torch.load(directory / STATE_FILE, weights_only=True)
        if p.lora is not None:  # LoRA: the adapter and its optimizer state (the base is the checkpoint's)
            p.dp.load(p.module, p.model, self.optimizer.adamw, lora.read_adapter(p.model, directory),
                      state["optimizer"], strict=False)
        else:
            saved = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
            p.dp.load(p.module, p.model, self.optimizer.adamw, saved.state_dict(), state["optimizer"])
        self.guard.streak[:] = [tuple(x) for x in state.get("guard_streak", [])]
        if "master" in state:
            self.optimizer.load_masters(state["master"])
        if "ref_model" in state:
            self.reference.model.load_state_dict(state["ref_model"])
        if self.critic is not None:
            self.critic.load(directory / "critic", state["critic_optimizer"])
        return state["step"], state["extra"]
