"""Local ``--colocate``: the trainer and the embedded engine time-share one device.

slime's colocated mode on one GPU: while the engine samples, the trainer
holds only what it cannot drop; while the trainer steps, the engine holds nothing.

    rollout phase   engine awake (weights + KV cache); trainer: weights and float32 masters,
                    no gradients; optimizer state on the host with --offload-train
    train phase     engine asleep (weights freed; its KV cache is already gone, every row having
                    finished); optimizer state back on the device

``Colocated`` wraps the trainer with the loop's trainer methods, so the driver is unchanged
(a strategy, not a second loop): ``train`` puts the engine to sleep first;
``weights`` (called by the loop right before the engine loads them) frees the gradients, offloads
the optimizer state, wakes the engine and returns the trainer's tensors, which the engine copies
device to device (``EmbeddedEngine.update_weights``: no host round trip). Each phase's peak
memory is logged: ``perf/rollout_peak_memory_gb`` (weight load and sampling) and the trainer's
``perf/peak_memory_gb`` (its step). On CPU the same sequence runs (tests) and peaks are the
process's resident set; offloading to the host is then a no-op.

The engine sleeps between ``train`` and ``weights``, so every trained rollout must be followed by
a weight push: config validation refuses ``--update-weights-interval`` > 1 with ``--colocate``.
"""

from __future__ import annotations

import torch

from rlvr.core.device import empty_cache
from rlvr.train.memory import peak_memory_gb, reset_peak_memory


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Every tensor of ``optimizer``'s state (AdamW's moments and step) to ``device``, in place."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.to(device, non_blocking=True)


class Colocated:
    """The loop's trainer in local ``--colocate`` mode: the trainer's methods, plus the hand-offs
    of the one device between trainer and ``engine`` (an ``EmbeddedEngine``)."""

    def __init__(self, trainer, engine, offload_optimizer: bool = False):
        self.trainer, self.engine, self.offload_optimizer = trainer, engine, offload_optimizer
        self.device = trainer.device
        reset_peak_memory(self.device)  # the first rollout phase starts now

    # ---- the rest of the driver's protocol (rlvr.runtime.roles.TrainerRole): the trainer's own
    @property
    def step(self) -> int:
        return self.trainer.step

    def save(self, directory, tokenizer=None, extra: dict | None = None):
        return self.trainer.save(directory, tokenizer, extra)

    def load(self, directory) -> dict:
        return self.trainer.load(directory)

    def save_hf(self, tokenizer, directory):
        return self.trainer.save_hf(tokenizer, directory)

    def check_bad_steps(self, skipped_path) -> None:
        self.trainer.check_bad_steps(skipped_path)

    def probe_log_probs(self, sequences) -> list[list[float]]:
        return self.trainer.probe_log_probs(sequences)

    def probe_next_log_probs(self, prompts):
        return self.trainer.probe_next_log_probs(prompts)

    def train(self, rollout_id: int, samples) -> dict[str, float]:
        rollout_peak = peak_memory_gb(self.device)  # the rollout phase that produced ``samples``
        self.engine.sleep()
        empty_cache(self.device)
        if self.offload_optimizer:
            move_optimizer_state(self.trainer.optimizer.adamw, self.device)
        metrics = self.trainer.train(rollout_id, samples)  # measures its own peak (perf/peak_memory_gb)
        return metrics | {"perf/rollout_peak_memory_gb": rollout_peak}

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's tensors for the engine, once the trainer has made room for it."""
        self.trainer.model.zero_grad(set_to_none=True)
        for m in self.trainer.optimizer.master:  # --bf16: the float32 masters' gradients too
            m.grad = None
        if self.offload_optimizer:
            move_optimizer_state(self.trainer.optimizer.adamw, "cpu")
        empty_cache(self.device)
        reset_peak_memory(self.device)  # the rollout phase (weight load, sampling) starts
        self.engine.wake()
        return self.trainer.weights()
