"""Packed sequences: a micro-batch as one row of concatenated samples.

Packing (the trainer's layout): the samples of a micro-batch are concatenated into one row with
no padding; ``position_ids`` restart at 0 for every sample, and attention never crosses samples.
Samples with the same prompt (a GRPO group) share it: the prompt's tokens appear once, followed by
each sample's response, and every response attends to the prompt and to itself only -- the same
arithmetic as running each sample alone, because a causal model's prompt states do not depend on
the response (prefix sharing; the prompt's gradient is the sum over its responses, as it would be
with copies).
Attention on that row is ``rlvr.train.attention``'s; log-probs on it are ``rlvr.train.logprobs``'s.

Padding (``pad``) is kept as the reference layout: right-padded to the longest sample of the
micro-batch, as the first trainer did and as ``benchmarks/train_throughput.py`` compares against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlvr.core.types import Sample


@dataclass
class TokenBatch:
    """A micro-batch laid out for the model, plus where its response tokens are.

    ``src[m]`` is the flat position (in ``[rows * cols]``) whose hidden state predicts response
    token ``m``, ``targets[m]`` that token's id; ``rows[m], cols[m]`` place it in the right-padded
    ``[b, width]`` per-token tensors the loss works on.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    src: torch.Tensor
    targets: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    model_kwargs: dict = field(default_factory=dict)
    # [slots, 2] long: (sample index, position in that sample's prompt + response) of every input
    # position, (-1, -1) for padding; what routing replay (rlvr.train.routing_replay) aligns by
    origin: torch.Tensor | None = None

    def to(self, device: torch.device) -> TokenBatch:
        """The batch on ``device`` (built on the host from token lists: one copy per tensor per micro-batch)."""
        if self.input_ids.device == device:
            return self
        move = lambda t: t.to(device, non_blocking=True)  # noqa: E731
        # ``origin`` stays on the host: routing replay (R3) builds its plan from it there.
        return TokenBatch(*(move(t) for t in (self.input_ids, self.attention_mask, self.position_ids, self.src,
                                              self.targets, self.rows, self.cols)), model_kwargs=self.model_kwargs,
                          origin=self.origin)

    @property
    def slots(self) -> int:
        """Positions the model computes (real tokens + padding)."""
        return self.input_ids.numel()


def _index(rows: list[tuple[int, int, list[int], list[int]]]):
    """``(first_position, row, prompt_positions_end, response token ids)`` per sample ->
    (src, targets, rows, cols): the flat position predicting each response token (token 0 by the
    prompt's last position, token t by the response's position t - 1)."""
    src, targets, out_rows, cols = [], [], [], []
    for start, row, prompt_last, resp in rows:
        src.extend([prompt_last] + list(range(start, start + len(resp) - 1)) if resp else [])
        targets.extend(resp)
        out_rows.extend([row] * len(resp))
        cols.extend(range(len(resp)))
    return tuple(torch.tensor(x, dtype=torch.long, device="cpu") for x in (src, targets, out_rows, cols))


def pack(samples: list[Sample], share_prompts: bool = True) -> TokenBatch:
    """One row ``[1, N]``: for each prompt of the micro-batch, its tokens once, then the response
    tokens of every sample with that prompt (a GRPO group shares it); positions restart per prompt
    and continue from the prompt into each response. A response's last token is left out of the
    row: it is only ever predicted (by the position before it), and in a causal model no scored
    position depends on it -- for RL's short responses that is a large share of the positions.
    ``share_prompts=False`` repeats the prompt for every sample (plain packing). Attention: see
    ``varlen_attention``.

    >>> s = [Sample("", [1, 2], response_ids=[3]), Sample("", [1, 2], response_ids=[5, 6])]
    >>> b = pack(s)
    >>> b.input_ids.tolist(), b.position_ids.tolist(), b.model_kwargs["packed_groups"]
    ([[1, 2, 5]], [[0, 1, 2]], [(2, [0, 1])])
    >>> b.src.tolist(), b.targets.tolist()
    ([1, 1, 2], [3, 5, 6])
    >>> pack(s, share_prompts=False).input_ids.tolist()
    [[1, 2, 1, 2, 5]]
    """
    by_prompt: dict[tuple, list[int]] = {}
    for i, s in enumerate(samples):
        by_prompt.setdefault(tuple(s.prompt_ids) if share_prompts else (i,), []).append(i)
    ids: list[int] = []
    positions: list[int] = []
    groups, index, origin = [], [], []
    for members in by_prompt.values():
        prompt = samples[members[0]].prompt_ids
        ids += prompt
        positions += range(len(prompt))
        origin += [(members[0], p) for p in range(len(prompt))]
        prompt_last = len(ids) - 1
        inputs = []
        for i in members:
            resp = samples[i].response_ids
            index.append((len(ids), i, prompt_last, resp))
            # A response's last token predicts nothing that is scored: it is a target, never an input.
            ids += resp[:-1]
            positions += range(len(prompt), len(prompt) + len(resp) - 1)
            origin += [(i, p) for p in range(len(prompt), len(prompt) + len(resp) - 1)]
            inputs.append(max(len(resp) - 1, 0))
        groups.append((len(prompt), inputs))
    row = torch.tensor([ids], dtype=torch.long, device="cpu")  # built on the host; TokenBatch.to moves it
    # An all-ones 2D mask turns off transformers' packed-sequence detection (which would build an
    # N x N mask); the layout reaches the attention function as packed_groups.
    return TokenBatch(row, torch.ones_like(row), torch.tensor([positions], dtype=torch.long, device="cpu"),
                      *_index(sorted(index, key=lambda x: x[1])), model_kwargs={"packed_groups": groups},
                      origin=torch.tensor(origin, dtype=torch.long, device="cpu").reshape(-1, 2))


def pad(samples: list[Sample]) -> TokenBatch:
    """``[b, L]`` right-padded to the longest sample (L), with a 0/1 attention mask.

    >>> b = pad([Sample("", [1, 2], response_ids=[3]), Sample("", [4], response_ids=[5])])
    >>> b.input_ids.tolist(), b.src.tolist()
    ([[1, 2, 3], [4, 5, 0]], [1, 3])
    """
    width = max(s.total_length for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long, device="cpu")
    attn = torch.zeros(len(samples), width, dtype=torch.long, device="cpu")
    for i, s in enumerate(samples):
        ids[i, : s.total_length] = torch.tensor(s.prompt_ids + s.response_ids, device="cpu")
        attn[i, : s.total_length] = 1
    positions = torch.arange(width, device="cpu").expand(len(samples), width)
    rows = [(i * width + len(s.prompt_ids), i, i * width + len(s.prompt_ids) - 1, s.response_ids)
            for i, s in enumerate(samples)]
    real = attn.bool().reshape(-1)
    origin = torch.stack([torch.arange(len(samples), device="cpu").repeat_interleave(width), positions.reshape(-1)], dim=1)
    origin[~real] = -1
    return TokenBatch(ids, attn, positions, *_index(rows), origin=origin)


@dataclass(frozen=True)
class Layout:
    """How the trainer lays out a micro-batch (``Trainer(layout=...)``): packed, the default and
    what runs use (one row, no padding; with ``share_prompts`` a prompt shared by several samples
    is computed once), or right-padded (``packed=False``), the reference layout that
    ``benchmarks/train_throughput.py`` measures against. The numbers agree to float rounding
    (tests/test_packing.py, tests/test_trainer_steps.py); only time and memory differ."""

    packed: bool = True
    share_prompts: bool = True

    def batch(self, samples: list[Sample]) -> TokenBatch:
        return pack(samples, self.share_prompts) if self.packed else pad(samples)
