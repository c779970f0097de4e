"""The PPO critic: a value head on the same architecture as the policy.

The backbone is loaded from ``--critic-load`` (default ``--hf-checkpoint``) with ``AutoModel``, and
a linear head maps the last hidden state to a scalar. Like log-probs, the value of response token t
is read at position t - 1: it is V(s_t), the value of the state the token was chosen in.

The critic is trained with PPO's clipped value loss (``compute_value_loss``, halved) on the GAE
returns, with the same micro-batches, normaliser, LR schedule and clipping as the actor, by its own
AdamW (``--critic-lr``): ``CriticTrainer.step``, one optimizer step per global batch, right after
the policy's. Its gradients are never synchronised across ranks (``SingleProcess``): config
validation keeps PPO out of ``--ray``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModel

from rlvr.algo import aggregate_loss, compute_value_loss
from rlvr.train.attention import ATTN_IMPLEMENTATION
from rlvr.train.logprobs import response_hidden, to_rows
from rlvr.train.packing import pack
from rlvr.train.parallel import SingleProcess
from rlvr.train.step import Learner, accumulate, optimizer_step
from rlvr.core.types import Sample


class Critic(torch.nn.Module):
    def __init__(self, checkpoint: str, head_path: str | Path | None = None):
        super().__init__()
        self.backbone = AutoModel.from_pretrained(checkpoint, dtype=torch.float32,
                                                  attn_implementation=ATTN_IMPLEMENTATION).eval()
        hidden = self.backbone.config.hidden_size
        self.head = torch.nn.Linear(hidden, 1)
        torch.nn.init.zeros_(self.head.weight)  # start at V = 0: no spurious baseline at step 0
        torch.nn.init.zeros_(self.head.bias)
        if head_path is not None and Path(head_path).is_file():
            self.head.load_state_dict(torch.load(head_path, weights_only=True))

    def forward(self, samples: list[Sample], width: int) -> torch.Tensor:
        """Values ``[b, width]`` of each sample's response tokens, right-padded with 0 (packed forward)."""
        batch = pack(samples).to(self.head.weight.device)
        values = self.head(response_hidden(self.backbone, batch).float()).squeeze(-1)
        return to_rows(values, batch, len(samples), width)

    def save(self, directory: Path) -> None:
        self.backbone.save_pretrained(directory)
        torch.save(self.head.state_dict(), directory / "value_head.pt")


class CriticTrainer:
    """The critic, its optimizer and its own step; the trainer calls ``values`` for V_old and
    ``step`` after each policy step, on the same micro-batches."""

    def __init__(self, checkpoint: str, make_optimizer: Callable[[list], torch.optim.Optimizer], value_clip: float,
                 clip_grad: float, device: torch.device | str = "cpu"):
        self.model = Critic(checkpoint).to(device)
        params = list(self.model.parameters())
        self.optimizer = make_optimizer(params)
        self.learner = Learner(self.model, self.optimizer, params, params, SingleProcess(), self.model)
        self.value_clip, self.clip_grad = value_clip, clip_grad

    def values(self, samples: list[Sample], width: int) -> torch.Tensor:
        """V(s_t) ``[b, width]`` of a micro-batch's response tokens."""
        return self.model(samples, width)

    def step(self, samples: list[Sample], mbs: list[list[int]], mask: torch.Tensor, per_token: bool,
             denominator: float, old_values: torch.Tensor, returns: torch.Tensor, lr_scale: float) -> dict[str, float]:
        """One optimizer step of ``0.5 * compute_value_loss`` over micro-batches ``mbs`` (indices into
        ``samples`` and the [B, T] tensors). Returns ``value_loss``, ``value_clipfrac``, ``critic_grad_norm``."""
        width = mask.shape[1]

        def loss_fn(mb: list[int]):
            values = self.values([samples[i] for i in mb], width).float()
            loss, clipfrac = compute_value_loss(values, old_values[mb], returns[mb], self.value_clip)
            return aggregate_loss(0.5 * loss, mask[mb], per_token, denominator), {"value_loss": 0.5 * loss,
                                                                                  "value_clipfrac": clipfrac}

        totals = accumulate(self.learner, mbs, loss_fn, mask, per_token, denominator)
        optimizer_step(self.learner, totals, lr_scale, self.clip_grad)
        return {"value_loss": totals["value_loss"], "value_clipfrac": totals["value_clipfrac"],
                "critic_grad_norm": totals["grad_norm"]}

    def save(self, directory: Path) -> dict:
        """Write the critic under ``directory``; returns its optimizer state (for trainer_state.pt)."""
        self.model.save(directory)
        return self.optimizer.state_dict()

    def load(self, directory: Path, optimizer_state: dict) -> None:
        saved = Critic(directory, head_path=directory / "value_head.pt")
        self.model.load_state_dict(saved.state_dict())
        self.optimizer.load_state_dict(optimizer_state)
