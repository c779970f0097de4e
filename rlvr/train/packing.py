"""Packed sequences: a micro-batch as one row of concatenated samples, and log-probs on it.

Packing (the trainer's layout): the samples of a micro-batch are concatenated into one row with
no padding; ``position_ids`` restart at 0 for every sample, and attention never crosses samples.
Samples with the same prompt (a GRPO group) share it: the prompt's tokens appear once, followed by
each sample's response, and every response attends to the prompt and to itself only -- the same
arithmetic as running each sample alone, because a causal model's prompt states do not depend on
the response (prefix sharing; the prompt's gradient is the sum over its responses, as it would be
with copies). Attention runs through ``rlvr_varlen``, an attention function registered with
transformers' ``AttentionInterface``: given ``packed_groups`` (the row's layout) it runs SDPA on
each prompt and each response's slice of q/k/v; packed and unpacked log-probs and gradients agree
to float rounding (tested). Without ``packed_groups`` it *is* SDPA, so a model copied from the
trainer (e.g. the embedded engine's) generates exactly as before. A single SDPA with a
block-diagonal mask would also be exact but materialises an N x N mask and N x N scores per head.

Per-layer attention variants follow the layer's own kwargs, as transformers' eager/SDPA paths do:
``sliding_window`` (Mistral, Qwen2/Gemma layers marked ``sliding_attention``: a key ``window`` or
more positions behind its query is hidden, by position within the sample) becomes part of each
slice's mask, and only where the sample is long enough for it to bite; ``softcap`` (Gemma 2's
``attn_logit_softcapping``) cannot be done by SDPA, so those layers compute explicit scores
(``capped_attention``, float32 softmax like the eager path) -- packed or not, so the engine's
copy samples right too. During a packed forward the mask function returns no mask at all, since
transformers would otherwise build an N x N one for every sliding-window layer. The output layer
applies ``logit_scale`` (Cohere) and ``final_logit_softcapping`` (Gemma 2/3) before the
temperature, as the models' own forward does; other logit transforms are refused
(``UNSUPPORTED_LOGIT_FIELDS``). tests/test_model_matrix.py checks every tiny family.

Padding (``pad``) is kept as the reference layout: right-padded to the longest sample of the
micro-batch, as the first trainer did and as ``benchmarks/train_throughput.py`` compares against.

Log-probs and entropy are computed only where needed: the hidden states that predict response
tokens are gathered first (token t is predicted at position t - 1), and the output layer and
softmax run on those rows only, ``chunk_size`` rows at a time (``--log-probs-chunk-size``); under
autograd each chunk is recomputed in backward, so the full ``[tokens, vocab]`` logits never exist
at once. With ``--kl-loss-type token_level_kl`` the same chunks also yield the exact KL to the
reference over the whole vocabulary (``KLReference``: the reference's output layer and its last
hidden states at the same positions), so its ``[chunk, vocab]`` log-softmax exists one chunk at a
time too.

Simplifications: decoder-only causal LMs only; soft-capped layers materialise their scores per
slice (``SMALL_GROUP`` tokens at most per group call, a prompt or response slice otherwise), as the
eager path does for the whole sequence; no attention dropout (the trainer's models run in eval mode).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rlvr.algo.score_centering import head_token_ids
from rlvr.train.routing_replay import set_replay_plan
from rlvr.core.types import Sample

ATTN_IMPLEMENTATION = "rlvr_varlen"


def _bottom_right_causal(q_len: int, k_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[q_len, k_len] bool: query i (the last q_len of k_len positions) sees keys <= k_len - q_len + i."""
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(diagonal=k_len - q_len)


SMALL_GROUP = 512  # tokens: a group this short runs as one masked SDPA call (mask <= 512 x 512)


def group_mask(prompt: int, responses: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """[L, L] bool attention pattern of one packed group (prompt, then its responses): causal,
    and a response sees only the prompt and itself.

    >>> group_mask(1, [1, 2]).int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]
    """
    seg = torch.repeat_interleave(torch.arange(len(responses) + 1, device=device),
                                  torch.tensor([prompt, *responses], device=device))
    pos = torch.arange(seg.numel(), device=device)
    return (pos[None, :] <= pos[:, None]) & ((seg[None, :] == seg[:, None]) | (seg[None, :] == 0))


def group_positions(prompt: int, responses: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """[L] position ids of one packed group: the prompt from 0, each response continuing from it.

    >>> group_positions(2, [1, 2]).tolist()
    [0, 1, 2, 2, 3]
    """
    return torch.cat([torch.arange(prompt, device=device),
                      *(torch.arange(prompt, prompt + r, device=device) for r in responses)])


def within_window(mask: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """``mask`` [q, k] with every key ``window`` or more positions behind its query hidden: the
    sliding window of transformers' ``sliding_window_overlay`` (key seen iff q - k < window).

    >>> within_window(torch.ones(1, 4, dtype=torch.bool), torch.tensor([3]), torch.arange(4), 2).int().tolist()
    [[0, 0, 1, 1]]
    """
    if window is None:
        return mask
    return mask & ((q_pos[:, None] - k_pos[None, :]) < window)


def capped_attention(query, key, value, mask: torch.Tensor, scale: float | None, softcap: float | None):
    """Attention with explicit scores, for what SDPA cannot do: ``softcap * tanh(s / softcap)`` on
    the scaled scores s before the mask and softmax (Gemma 2's attention soft-capping), softmax in
    float32, as transformers' eager attention computes it. q: [B, H, q, D], k/v: [B, Hkv, k, D],
    ``mask`` broadcastable to [B, H, q, k], bool (True = attend); returns [B, H, q, D]."""
    n_rep = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(n_rep, dim=1), value.repeat_interleave(n_rep, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * (scale if scale is not None else query.shape[-1] ** -0.5)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    # The dtype's minimum, not -inf, as transformers' masks: a row with every key hidden (a left-pad
    # query in the engine) gets a harmless uniform softmax instead of NaNs that would reach real rows.
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.matmul(scores.softmax(-1, dtype=torch.float32).to(query.dtype), value)


def _unpacked_capped(query, key, value, attention_mask, scaling, softcap):
    """An ordinary (unpacked) call with soft-capping, e.g. the engine's: the mask is the one
    ``sdpa_mask`` built (sliding window and padding included); None means SDPA's own causal rule."""
    q_len, k_len = query.shape[2], key.shape[2]
    if attention_mask is None:  # transformers' SDPA path: no causal mask for one query, else top-left aligned
        attention_mask = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device)
        if q_len > 1:
            attention_mask = attention_mask.tril()
    elif attention_mask.dtype != torch.bool:
        raise TypeError(f"rlvr_varlen: expected a boolean attention mask, got {attention_mask.dtype}")
    out = capped_attention(query, key, value, attention_mask, scaling, softcap)
    return out.transpose(1, 2).contiguous(), None


def varlen_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Causal attention within each packed sample. q: [1, H, N, D], k/v: [1, Hkv, N, D];
    returns ([1, N, H, D], None) like transformers' attention functions.

    ``packed_groups`` lists ``(prompt_len, [response_len, ...])`` in row order: a prompt attends
    causally to itself; each response attends to its group's prompt and causally to itself, never
    to another response. The layer's ``sliding_window`` (a key ``window`` or more positions back is
    hidden) and ``softcap`` (attention-score soft-capping) apply as in the model's own attention."""
    groups = kwargs.get("packed_groups")
    window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap")
    if groups is None:
        if softcap is not None:
            return _unpacked_capped(query, key, value, attention_mask, scaling, softcap)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    gqa = getattr(module, "num_key_value_groups", 1) > 1  # SDPA repeats k/v heads itself, no copy

    dev = query.device  # every mask is built where the attention runs: no host-to-device copies

    def attend(q, k, v, mask=None):  # mask None: plain causal over a square block
        if softcap is not None:
            mask = _bottom_right_causal(q.shape[2], k.shape[2], dev) if mask is None else mask
            return capped_attention(q, k, v, mask, scaling, softcap)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scaling,
                                              enable_gqa=gqa)

    # torch.split, not slicing: the backward of a split is one concatenation, while each slice's
    # backward would write a full-size zero gradient (O(samples x tokens) memory traffic).
    whole = [prompt + sum(responses) <= SMALL_GROUP for prompt, responses in groups]
    sizes = [n for (prompt, responses), w in zip(groups, whole)
             for n in ([prompt + sum(responses)] if w else [prompt, *responses])]
    pieces = iter(zip(*(t.split(sizes, dim=2) for t in (query, key, value))))
    out = []
    for (prompt, responses), w in zip(groups, whole):
        # The window bites only if some query is `window` or more positions past a key it sees.
        win = window if window is not None and prompt + max(responses, default=0) > window else None
        if w:  # one call for the group, its attention pattern as a mask (causal for a lone sample)
            q, k, v = next(pieces)
            if len(responses) == 1 and win is None:
                out.append(attend(q, k, v))
                continue
            pos = group_positions(prompt, responses, dev)
            out.append(attend(q, k, v, within_window(group_mask(prompt, responses, dev), pos, pos, win)))
            continue
        pq, pk, pv = next(pieces)
        p_pos = torch.arange(prompt, device=dev)
        out.append(attend(pq, pk, pv, None if win is None else within_window(
            _bottom_right_causal(prompt, prompt, dev), p_pos, p_pos, win)))
        for r in responses:
            q, k, v = next(pieces)
            if r:
                mask = within_window(_bottom_right_causal(r, prompt + r, dev), torch.arange(prompt, prompt + r, device=dev),
                                     torch.arange(prompt + r, device=dev), win)
                out.append(attend(q, torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2), mask))
    return torch.cat(out, dim=2).transpose(1, 2).contiguous(), None


_PACKED_FORWARD = ContextVar("rlvr_packed_forward", default=False)


def varlen_mask(*args, **kwargs):
    """SDPA's masks for ordinary calls (the engine's, padding and sliding window included); none
    inside a packed forward, where ``varlen_attention`` builds each sample's pattern itself and a
    sliding-window layer's N x N mask over the whole row would only cost memory."""
    return None if _PACKED_FORWARD.get() else sdpa_mask(*args, **kwargs)


AttentionInterface.register(ATTN_IMPLEMENTATION, varlen_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, varlen_mask)


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


def response_hidden(base_model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """Last hidden states ``[M, H]`` at the positions that predict the M response tokens."""
    token = _PACKED_FORWARD.set("packed_groups" in batch.model_kwargs)
    try:
        hidden = base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                            position_ids=batch.position_ids, **batch.model_kwargs).last_hidden_state
    finally:
        _PACKED_FORWARD.reset(token)
    return hidden.reshape(-1, hidden.shape[-1])[batch.src]


@dataclass
class KLReference:
    """What the exact token-level KL needs of the reference model: its output layer (frozen) and
    its last hidden states ``[M, H]`` at the positions that predict the micro-batch's M response
    tokens, in the batch's order (sample by sample, token by token)."""

    head: Callable[[torch.Tensor], torch.Tensor]
    hidden: torch.Tensor


def _chunk_log_probs(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor,
                     temperature: float, with_entropy: bool, ref_head=None, ref_hidden=None):
    logp = (head(hidden).float() / temperature).log_softmax(-1)
    # targets [m] (the response tokens) or [m, 1 + K] (each with score centering's head tokens)
    picked = logp.gather(-1, targets if targets.dim() == 2 else targets.unsqueeze(-1))
    picked = picked if targets.dim() == 2 else picked.squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1) if with_entropy else picked.new_zeros(0)
    if ref_head is None:
        return picked, entropy
    with torch.no_grad():
        ref_logp = (ref_head(ref_hidden).float() / temperature).log_softmax(-1)
    return picked, entropy, (logp.exp() * (logp - ref_logp)).sum(-1)  # rlvr.algo.kl.exact_kl


def token_log_probs(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, targets: torch.Tensor,
                    temperature: float, with_entropy: bool, chunk_size: int, kl_ref: KLReference | None = None):
    """log softmax(head(hidden) / T)[target] ``[M]`` and, optionally, the entropy ``[M]`` of each
    row's distribution, ``chunk_size`` rows at a time (recomputed in backward under autograd).
    With ``kl_ref``, a third output: KL(p || p_ref) ``[M]`` summed over the vocabulary."""
    outs: list[list[torch.Tensor]] = [[], [], []]
    for a in range(0, hidden.shape[0], chunk_size):
        args = (head, hidden[a : a + chunk_size], targets[a : a + chunk_size], temperature, with_entropy)
        if kl_ref is not None:
            args += (kl_ref.head, kl_ref.hidden[a : a + chunk_size])
        if torch.is_grad_enabled() and hidden.requires_grad:
            got = checkpoint(_chunk_log_probs, *args, use_reentrant=False)
        else:
            got = _chunk_log_probs(*args)
        for out, value in zip(outs, got):
            out.append(value)
    cat = lambda parts: torch.cat(parts) if parts else hidden.new_zeros(0)  # noqa: E731
    picked, entropy = cat(outs[0]), (cat(outs[1]) if with_entropy else None)
    return (picked, entropy) if kl_ref is None else (picked, entropy, cat(outs[2]))


def to_rows(values: torch.Tensor, batch: TokenBatch, n_rows: int, width: int) -> torch.Tensor:
    """Flat per-response-token ``values [M, ...]`` as right-padded ``[n_rows, width, ...]`` (0 elsewhere);
    differentiable."""
    return values.new_zeros(n_rows, width, *values.shape[1:]).index_put((batch.rows, batch.cols), values)


class OutputLayer(torch.nn.Module):
    """The causal LM's logits as its own ``forward`` computes them from the last hidden state, in
    float32: ``lm_head(h)``, times ``logit_scale`` (Cohere), then ``cap * tanh(logits / cap)``
    with ``cap = final_logit_softcapping`` (Gemma 2/3) -- before any temperature, as in
    ``Gemma2ForCausalLM.forward`` followed by generation's temperature warper."""

    def __init__(self, head: torch.nn.Module, scale: float | None = None, softcap: float | None = None):
        super().__init__()
        self.head, self.scale, self.softcap = head, scale, softcap

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden).float()
        if self.scale is not None:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


# Config fields that change the logits in some causal LM's forward and that OutputLayer does not
# apply: a model with one of them set is refused rather than given wrong log-probs.
UNSUPPORTED_LOGIT_FIELDS = ("logits_scaling", "output_multiplier", "lm_head_multiplier")


def decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, OutputLayer]:
    """The causal LM's base model (returns hidden states) and its output layer (float32 logits)."""
    config = model.config
    for name in UNSUPPORTED_LOGIT_FIELDS:
        if getattr(config, name, None) not in (None, 1, 1.0):
            raise NotImplementedError(f"{type(model).__name__}: {name} is not supported by the trainer's log-probs")
    head = OutputLayer(model.get_output_embeddings(), getattr(config, "logit_scale", None),
                       getattr(config, "final_logit_softcapping", None))
    return getattr(model, model.base_model_prefix), head


def response_log_probs(model: torch.nn.Module, samples: list[Sample], temperature: float, width: int,
                       with_entropy: bool, chunk_size: int = 1024, packed: bool = True,
                       share_prompts: bool = True, heads: bool = False, kl_ref: KLReference | None = None):
    """Log-probs ``[b, width]`` of each sample's response tokens under ``model`` at ``temperature``
    (right-padded with 0), and the entropy of each position's distribution when asked (else None);
    with ``kl_ref`` also the exact KL to the reference ``[b, width]`` (a third output).
    ``heads``: log-probs ``[b, width, 1 + K]``, each token's log-prob followed by those of its sampler
    head (``Sample.rollout_topk_token_ids``, score centering; padding gathers token 0)."""
    if getattr(model.config, "_attn_implementation", None) != ATTN_IMPLEMENTATION:
        # Any other attention would let packed samples attend to each other: wrong numbers, silently.
        raise ValueError(f"response_log_probs needs a model loaded with attn_implementation={ATTN_IMPLEMENTATION!r} "
                         f"(rlvr.train.trainer.load_policy); this one uses {model.config._attn_implementation!r}")
    base, head = decoder_and_head(model)
    batch = Layout(packed, share_prompts).batch(samples).to(model.device)
    set_replay_plan(model, batch, samples)  # R3: the engine's experts at every position (no-op otherwise)
    targets = batch.targets
    if heads:
        ids = head_token_ids(samples, width).to(targets.device)[batch.rows, batch.cols]  # [M, K]
        targets = torch.cat([targets.unsqueeze(-1), ids], dim=-1)
    out = token_log_probs(head, response_hidden(base, batch), targets, temperature, with_entropy, chunk_size, kl_ref)
    rows = lambda v: to_rows(v, batch, len(samples), width) if v is not None else None  # noqa: E731
    return tuple(rows(v) for v in out)
