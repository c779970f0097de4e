"""The core types every role speaks: ``Sample`` and ``RolloutBatch``.

A ``Sample`` is one prompt + one response with everything the trainer needs from the rollout
side: token ids, the behaviour policy's log-probs (q), the loss mask, the reward and
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
    prompt: str = ""  # defaults: slime's data sources build Sample(prompt=..., label=...)
    prompt_ids: list[int] = field(default_factory=list)
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
    # score centering: the sampler's head per response token, top-k token ids and their log-probs under q
    rollout_topk_token_ids: list[list[int]] = field(default_factory=list)
    rollout_topk_log_probs: list[list[float]] = field(default_factory=list)
    # R3: the engine's routed experts, [len(prompt) + len(response) - 1, MoE layers, top-k] (uint8/int16)
    rollout_routed_experts: torch.Tensor | None = None
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

    def append_segment(self, token_ids: list[int], *, trainable: bool, log_probs: list[float] | None = None,
                       weight_versions: list[int] | None = None, text: str | None = None) -> Sample:
        """Append one segment of a multi-turn response and check the invariants.

        A model segment (``trainable=True``) carries the engine's ``log_probs`` (and per-token
        ``weight_versions``) and gets loss mask 1; an environment / tool segment gets loss mask 0,
        log-prob 0.0 (a placeholder no loss term reads: the mask is 0) and, for staleness, the
        version of the model token before it. ``text`` is appended to ``response`` (the decoded
        text is for logs and rewards only; training reads the token ids).

        >>> s = Sample("p", [1, 2])
        >>> _ = s.append_segment([5, 6], trainable=True, log_probs=[-0.1, -0.2], weight_versions=[3, 3])
        >>> _ = s.append_segment([9], trainable=False)
        >>> s.loss_mask, s.rollout_log_probs, s.weight_versions
        ([1, 1, 0], [-0.1, -0.2, 0.0], [3, 3, 3])
        """
        token_ids = list(token_ids)
        if trainable:
            if log_probs is None or len(log_probs) != len(token_ids):
                raise ValueError(f"sample {self.uid or self.index}: a model segment of {len(token_ids)} tokens needs "
                                 f"one engine log-prob per token, got {None if log_probs is None else len(log_probs)}")
            versions = list(weight_versions) if weight_versions is not None else []
            if versions and len(versions) != len(token_ids):
                raise ValueError(f"sample {self.uid or self.index}: {len(versions)} weight versions for a model "
                                 f"segment of {len(token_ids)} tokens")
            if versions and len(self.weight_versions) < self.response_length:  # env tokens came first
                self.weight_versions += [versions[0]] * (self.response_length - len(self.weight_versions))
            self.rollout_log_probs = self.rollout_log_probs + [float(x) for x in log_probs]
            self.loss_mask = self.loss_mask + [1] * len(token_ids)
            self.weight_versions = self.weight_versions + versions
        else:
            if log_probs is not None:
                raise ValueError(f"sample {self.uid or self.index}: an environment segment has no log-probs")
            self.rollout_log_probs = self.rollout_log_probs + [0.0] * len(token_ids)
            self.loss_mask = self.loss_mask + [0] * len(token_ids)
            if self.weight_versions:
                self.weight_versions = self.weight_versions + [self.weight_versions[-1]] * len(token_ids)
        self.response_ids = self.response_ids + token_ids
        if text is not None:
            self.response += text
        self.check()
        return self

    def check(self) -> None:
        """Raise ValueError naming the sample unless ``len(loss_mask) == len(rollout_log_probs) ==
        response length`` (weight versions: at most one per token; env tokens before any model
        token have none yet)."""
        n = self.response_length
        if len(self.loss_mask) != n or len(self.rollout_log_probs) != n:
            raise ValueError(f"sample {self.uid or self.index}: response of {n} tokens but {len(self.loss_mask)} loss-mask "
                             f"entries and {len(self.rollout_log_probs)} rollout log-probs")
        if len(self.weight_versions) > n:
            raise ValueError(f"sample {self.uid or self.index}: {len(self.weight_versions)} weight versions "
                             f"for {n} response tokens")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError(f"sample {self.uid or self.index}: loss mask entries must be 0 or 1")

    def segments(self) -> list[tuple[int, int, bool]]:
        """The response as ``(start, end, trainable)`` runs of equal loss mask.

        >>> Sample("p", [1], response_ids=[4, 5, 6, 7], loss_mask=[1, 1, 0, 1]).segments()
        [(0, 2, True), (2, 3, False), (3, 4, True)]
        """
        out: list[tuple[int, int, bool]] = []
        for i, m in enumerate(self.loss_mask):
            if out and out[-1][2] == bool(m):
                out[-1] = (out[-1][0], i + 1, bool(m))
            else:
                out.append((i, i + 1, bool(m)))
        return out

    # ---- slime's spellings, so that a plugin written against slime's Sample runs as it is ----
    @property
    def tokens(self) -> list[int]:
        """Prompt and response token ids (slime's ``Sample.tokens``)."""
        return self.prompt_ids + self.response_ids

    def get_reward_value(self, args=None) -> float:
        """slime's accessor: the scalar reward (``--reward-key`` was applied when it was graded)."""
        return self.scalar_reward()

    def scalar_reward(self, key: str = "score") -> float:
        """The reward as one float: a dict reward gives its ``score`` entry."""
        if isinstance(self.reward, dict):
            return float(self.reward[key])
        return float(self.reward) if self.reward is not None else 0.0


Sample.Status = Status  # slime spells it Sample.Status.TRUNCATED


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

    def to_dict(self) -> dict:
        """The batch as plain Python data (``from_dict`` reads it back)."""
        return {"rollout_id": self.rollout_id, "n_samples_per_prompt": self.n_samples_per_prompt,
                "metrics": dict(self.metrics), "samples": [sample_to_dict(s) for s in self.samples]}

    @classmethod
    def from_dict(cls, data: dict) -> RolloutBatch:
        samples = [sample_from_dict(s) for s in data["samples"]]
        return cls(data["rollout_id"], samples, data["n_samples_per_prompt"], dict(data["metrics"]))

    def save(self, path: str | Path) -> Path:
        """Write the batch to ``path`` (torch.save of plain Python data)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(self.to_dict(), path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> RolloutBatch:
        return cls.from_dict(torch.load(path, weights_only=True))
