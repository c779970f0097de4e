"""Prompt datasets in slime's data format, and the data source that feeds rollouts.

A dataset is a JSONL file, one JSON object per line: ``{"prompt": ..., "label": ...,
"metadata": {...}}`` with the keys renamed by ``--input-key``, ``--label-key``,
``--metadata-key``. The prompt is a string or a list of chat messages
(``[{"role": "user", "content": ...}]``). Every malformed line fails with the file name, the
1-based line number and the reason.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.errors import DataError
from rlvr.jsonl import iter_objects


@dataclass
class PromptRecord:
    index: int  # position in the file (0-based), stable across epochs and resumes
    prompt: str | list[dict]
    label: Any
    metadata: dict = field(default_factory=dict)


def read_prompts(
    path: str | Path, input_key: str = "prompt", label_key: str | None = "label", metadata_key: str = "metadata"
) -> list[PromptRecord]:
    """Read a JSONL prompt file, validating every line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(str(path), None, "file not found")
    records: list[PromptRecord] = []
    for lineno, row in iter_objects(path):
        if input_key not in row:
            raise DataError(
                str(path), lineno, f"missing prompt field {input_key!r} (--input-key); fields: {sorted(row)}"
            )
        prompt = row[input_key]
        if not (isinstance(prompt, str) or _is_messages(prompt)):
            raise DataError(
                str(path), lineno, f"field {input_key!r} must be a string or a list of chat messages"
            )
        if label_key is not None and label_key not in row:
            raise DataError(
                str(path), lineno, f"missing label field {label_key!r} (--label-key); fields: {sorted(row)}"
            )
        metadata = row.get(metadata_key) or {}
        if not isinstance(metadata, dict):
            raise DataError(str(path), lineno, f"field {metadata_key!r} (--metadata-key) must be an object")
        label = row[label_key] if label_key is not None else None
        records.append(PromptRecord(len(records), prompt, label, metadata))
    if not records:
        raise DataError(str(path), None, "no prompts in file")
    return records


def _is_messages(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in x)


def render_prompt(prompt: str | list[dict], tokenizer, apply_chat_template: bool) -> str:
    """The text the engine sees: raw text, or the chat template applied with a generation prompt."""
    if apply_chat_template:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if isinstance(prompt, list):
        raise ValueError("a chat-message prompt needs --apply-chat-template")
    return prompt


class DataSource:
    """Hands out prompts in epochs (shuffled per epoch by ``seed``), resumably.

    ``state_dict()`` / ``load_state_dict()`` capture (epoch, offset) so a resumed run sees the
    same order.

    The buffer (slime's ``RolloutDataSourceWithBuffer``, seed 000 §2.3.2) holds groups of
    partially generated samples that a rollout aborted with ``--partial-rollout``; the next
    rollout takes them first (``take_partial``) and continues them. The buffer is not part of
    ``state_dict``: a run resumed from a checkpoint starts with it empty.
    """

    def __init__(self, records: list[PromptRecord], shuffle: bool = True, seed: int = 42):
        self.records, self.shuffle, self.seed = records, shuffle, seed
        self.epoch, self.offset = 0, 0
        self._order = self._epoch_order(0)
        self.buffer: list[list] = []  # groups of Sample, oldest first

    def add_partial(self, groups: list[list]) -> None:
        """Keep aborted groups (lists of ``Sample``) to be continued by a later rollout."""
        self.buffer.extend(groups)

    def take_partial(self, n: int) -> list[list]:
        """Up to ``n`` buffered groups, oldest first."""
        taken, self.buffer = self.buffer[:n], self.buffer[n:]
        return taken

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.records)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def next_prompts(self, n: int) -> list[PromptRecord]:
        out: list[PromptRecord] = []
        while len(out) < n:
            if self.offset >= len(self._order):
                self.epoch, self.offset = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
            take = self._order[self.offset : self.offset + n - len(out)]
            out.extend(self.records[i] for i in take)
            self.offset += len(take)
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.offset = state["epoch"], state["offset"]
        self._order = self._epoch_order(self.epoch)
