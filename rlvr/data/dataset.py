"""Prompt datasets in slime's data format, and the data source that feeds rollouts.

A dataset is a JSONL file, a Parquet file or a ``datasets`` ``save_to_disk`` directory (see
``rlvr.data.readers``) whose rows are ``{"prompt": ..., "label": ..., "metadata": {...}}`` with
the keys renamed by ``--input-key``, ``--label-key``, ``--metadata-key``. The prompt is a string
or a list of chat messages (``[{"role": "user", "content": ...}]``). A broken line, a missing key
or a prompt of the wrong type fails with the file, the line (or row) and the reason; a prompt
longer than ``--rollout-max-prompt-len`` tokens is dropped and counted.
``metadata["source_name"]`` names the sub-dataset a prompt comes from, for per-source metrics.
"""

from __future__ import annotations

import logging
import random
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from rlvr.data.readers import open_rows, row_error
from rlvr.core.errors import DataError

log = logging.getLogger(__name__)


@dataclass
class PromptRecord:
    index: int  # position in the file (0-based), stable across epochs and resumes
    prompt: str | list[dict]
    label: Any
    metadata: dict = field(default_factory=dict)


class PromptDataset:
    """A prompt dataset on disk (JSONL, Parquet or a ``save_to_disk`` directory), validated once
    and then read row by row: ``len()`` and ``ds[k] -> PromptRecord`` (see ``rlvr.data.readers``).

    Opening it makes one streaming pass that checks every row (``DataError`` naming ``file:line``
    or ``file: row N`` at the first bad one) and, given a ``tokenizer``, measures each rendered
    prompt in tokens (``longest_prompt``): prompts over ``max_prompt_len`` are dropped, counted in
    ``dropped_long`` and logged, never truncated. Only the kept row numbers stay in memory (8 bytes each).
    """

    def __init__(self, path: str | Path, input_key: str = "prompt", label_key: str | None = "label",
                 metadata_key: str = "metadata", tokenizer=None, apply_chat_template: bool = False,
                 chat_template_kwargs: dict | None = None, max_prompt_len: int | None = None):
        if not Path(path).exists():
            raise DataError(str(path), None, "file not found")
        self.rows = open_rows(path)
        self.keys = (input_key, label_key, metadata_key)
        self.dropped_long = 0
        self.longest_prompt = 0  # tokens of the longest kept prompt, rendered (with a tokenizer)
        self._kept = array("q")
        for i, row in self.rows.iter_rows():
            record = self._record(i, row)
            if tokenizer is not None:
                try:
                    text = render_prompt(record.prompt, tokenizer, apply_chat_template, chat_template_kwargs)
                except ValueError as e:
                    raise row_error(self.rows, i, str(e)) from None
                n_tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
                if max_prompt_len is not None and n_tokens > max_prompt_len:
                    self.dropped_long += 1
                    continue
                self.longest_prompt = max(self.longest_prompt, n_tokens)
            self._kept.append(i)
        if self.dropped_long:
            log.warning("%s: dropped %d of %d prompts longer than --rollout-max-prompt-len %d tokens",
                        path, self.dropped_long, len(self.rows), max_prompt_len)
        if not self._kept:
            raise DataError(str(path), None, "no prompts in file" if not len(self.rows)
                            else "every prompt is longer than --rollout-max-prompt-len")

    def _record(self, i: int, row: dict) -> PromptRecord:
        input_key, label_key, metadata_key = self.keys
        if input_key not in row:
            raise row_error(self.rows, i, f"missing prompt field {input_key!r} (--input-key); fields: {sorted(row)}")
        prompt = row[input_key]
        if not (isinstance(prompt, str) or _is_messages(prompt)):
            raise row_error(self.rows, i, f"field {input_key!r} must be a string or a list of chat messages "
                                          f"({{role, content}}), got {type(prompt).__name__}")
        if label_key is not None and label_key not in row:
            raise row_error(self.rows, i, f"missing label field {label_key!r} (--label-key); fields: {sorted(row)}")
        metadata = row.get(metadata_key) or {}
        if not isinstance(metadata, dict):
            raise row_error(self.rows, i, f"field {metadata_key!r} (--metadata-key) must be an object")
        return PromptRecord(i, prompt, row[label_key] if label_key is not None else None, metadata)

    def __len__(self) -> int:
        return len(self._kept)

    def __getitem__(self, k: int) -> PromptRecord:
        i = self._kept[k]
        return self._record(i, self.rows.row(i))

    def __iter__(self):
        return (self[k] for k in range(len(self)))


def read_prompts(
    path: str | Path, input_key: str = "prompt", label_key: str | None = "label", metadata_key: str = "metadata"
) -> list[PromptRecord]:
    """All records of a (small) prompt dataset in memory, validating every row."""
    return list(PromptDataset(path, input_key, label_key, metadata_key))


def _is_messages(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in x)


def render_prompt(prompt: str | list[dict], tokenizer, apply_chat_template: bool,
                  chat_template_kwargs: dict | None = None) -> str:
    """The text the engine sees: raw text, or the chat template applied with a generation prompt
    (and ``--apply-chat-template-kwargs``)."""
    if apply_chat_template:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **(chat_template_kwargs or {}))
    if isinstance(prompt, list):
        raise ValueError("a chat-message prompt needs --apply-chat-template")
    return prompt


class DataSource:
    """Hands out prompts in epochs (shuffled per epoch by ``seed``), resumably.

    ``records`` is any sequence of ``PromptRecord`` (a list, or a ``PromptDataset`` read from disk
    on demand). The shuffle is a permutation of row positions (Python's seeded shuffle, kept as a tensor: 8 bytes a
    prompt), recomputed from ``seed + epoch``, so the order of any epoch is known without storing
    it. ``state_dict()`` / ``load_state_dict()`` carry (epoch, offset) so a resumed run sees the
    same order; the state is a plain dict, so more keys (e.g. a ``buffer`` of partial samples to
    continue) can be added next to them.

    The buffer (slime's ``RolloutDataSourceWithBuffer``) holds groups of
    partially generated samples that a rollout aborted with ``--partial-rollout``; the next
    rollout takes them first (``take_partial``) and continues them. The buffer is part of
    ``state_dict``, so a resumed run continues the same partial samples.
    """

    def __init__(self, records: Sequence[PromptRecord], shuffle: bool = True, seed: int = 42):
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

    def _epoch_order(self, epoch: int) -> torch.Tensor:
        n = len(self.records)
        if not self.shuffle:
            return torch.arange(n)
        # Python's shuffle (the order rlvr has always used, so seeded runs keep their data order),
        # kept as a tensor: 8 bytes a prompt between epochs.
        order = list(range(n))
        random.Random(self.seed + epoch).shuffle(order)
        return torch.tensor(order, dtype=torch.long)

    @property
    def position(self) -> int:
        """Prompts handed out so far (over all epochs): the draw number of the next prompt."""
        return self.epoch * len(self.records) + self.offset

    def next_prompts(self, n: int) -> list[PromptRecord]:
        out: list[PromptRecord] = []
        while len(out) < n:
            if self.offset >= len(self._order):
                self.epoch, self.offset = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
            take = self._order[self.offset : self.offset + n - len(out)]
            out.extend(self.records[int(i)] for i in take)
            self.offset += len(take)
        return out

    def observe(self, samples: list) -> dict[str, float]:
        """What the source learns from a rollout's graded samples (a curriculum's accuracy, in
        ``rlvr.data.reasoning_gym.TaskStream``); returns metrics logged under ``rollout/``. A plain
        file learns nothing."""
        return {}

    def state_dict(self) -> dict:
        from rlvr.core.types import sample_to_dict

        buffer = [[sample_to_dict(s) for s in group] for group in self.buffer]
        return {"epoch": self.epoch, "offset": self.offset, "buffer": buffer}

    def load_state_dict(self, state: dict) -> None:
        from rlvr.core.types import sample_from_dict

        self.epoch, self.offset = state["epoch"], state["offset"]
        self.buffer = [[sample_from_dict(s) for s in group] for group in state.get("buffer", [])]
        self._order = self._epoch_order(self.epoch)
