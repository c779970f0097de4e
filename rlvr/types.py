"""The core types every role speaks: ``Sample`` and ``RolloutBatch`` (STYLE point 8).

A ``Sample`` is one prompt + one response with everything the trainer needs from the rollout
side: token ids, the behaviour policy's log-probs (q, seed 002), the loss mask, the reward and
the status. A ``RolloutBatch`` is the flat list of one rollout's samples, grouped by prompt
(``n_samples_per_prompt`` consecutive samples share a prompt), and can be saved and loaded.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch


class Status(str, enum.Enum):
    COMPLETED = "completed"  # stopped on a stop token
    TRUNCATED = "truncated"  # hit the response length limit
    ABORTED = "aborted"  # interrupted (abort / weight update)
    FAILED = "failed"  # the engine or the reward failed for this sample


@dataclass
class Sample:
    prompt: str
    prompt_ids: list[int]
    label: Any = None
    metadata: dict = field(default_factory=dict)
    group_index: int = 0  # which prompt group of the rollout
    index: int = 0  # position in the rollout
    prompt_index: int = -1  # position of the prompt in its dataset
    response: str = ""
    response_ids: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)  # q, one per response token
    loss_mask: list[int] = field(default_factory=list)  # 1 = train on this response token
    reward: float | dict | None = None
    status: Status = Status.COMPLETED
    weight_versions: list[int] = field(default_factory=list)  # version that produced each token
    train_metadata: dict = field(default_factory=dict)  # per-sample values that reach the loss
    uid: str = ""  # "<draw>/<j>": the j-th response to the prompt drawn <draw>-th from the data source (ledger)

    @property
    def group_uid(self) -> str:
        return self.uid.partition("/")[0]

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    @property
    def total_length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def scalar_reward(self, key: str = "score") -> float:
        """The reward as one float: a dict reward gives its ``score`` entry."""
        if isinstance(self.reward, dict):
            return float(self.reward[key])
        return float(self.reward) if self.reward is not None else 0.0


def sample_to_dict(s: Sample) -> dict:
    """A ``Sample`` as plain Python data (what ``torch.load(weights_only=True)`` reads back)."""
    return {**asdict(s), "status": s.status.value}


def sample_from_dict(d: dict) -> Sample:
    return Sample(**{**d, "status": Status(d["status"])})


@dataclass
class RolloutBatch:
    rollout_id: int
    samples: list[Sample]
    n_samples_per_prompt: int
    metrics: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.samples)

    def rewards(self) -> torch.Tensor:
        return torch.tensor([s.scalar_reward() for s in self.samples], dtype=torch.float32)

    def save(self, path: str | Path) -> Path:
        """Write the batch to ``path`` (torch.save of plain Python data)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "rollout_id": self.rollout_id,
            "n_samples_per_prompt": self.n_samples_per_prompt,
            "metrics": self.metrics,
            "samples": [sample_to_dict(s) for s in self.samples],
        }
        torch.save(data, path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> RolloutBatch:
        data = torch.load(path, weights_only=True)
        samples = [sample_from_dict(s) for s in data["samples"]]
        return cls(data["rollout_id"], samples, data["n_samples_per_prompt"], data["metrics"])
