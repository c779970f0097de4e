"""The PPO critic: a value head on the same architecture as the policy (seed 000 §2.5, 003 §4.1).

The backbone is loaded from ``--critic-load`` (default ``--hf-checkpoint``) with ``AutoModel``, and
a linear head maps the last hidden state to a scalar. Like log-probs, the value of response token t
is read at position t - 1: it is V(s_t), the value of the state the token was chosen in.

The critic is trained with PPO's clipped value loss (``compute_value_loss``) on the GAE returns,
with the same micro-batches and normaliser as the actor, by its own AdamW (``--critic-lr``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModel

from rlvr.train.packing import ATTN_IMPLEMENTATION, pack, response_hidden, to_rows
from rlvr.types import Sample


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
        batch = pack(samples)
        values = self.head(response_hidden(self.backbone, batch).float()).squeeze(-1)
        return to_rows(values, batch, len(samples), width)

    def save(self, directory: Path) -> None:
        self.backbone.save_pretrained(directory)
        torch.save(self.head.state_dict(), directory / "value_head.pt")
