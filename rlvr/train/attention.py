"""Attention on a packed row: every sample attends to its own prompt and itself only.

The trainer's layout (``rlvr.train.packing``) concatenates a micro-batch's samples into one row; samples with the same
prompt share it. Attention runs through ``rlvr_varlen``, an attention function registered with
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

Simplifications: decoder-only causal LMs only; soft-capped layers materialise their scores per
slice (``SMALL_GROUP`` tokens at most per group call, a prompt or response slice otherwise), as the
eager path does for the whole sequence; no attention dropout (the trainer's models run in eval mode).
"""

from __future__ import annotations

from contextvars import ContextVar

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask


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
    return _packed_attention(query, key, value, groups, window, softcap, scaling, gqa), None


def _packed_attention(query, key, value, groups, window, softcap, scaling, gqa: bool):
    """``varlen_attention`` over ``packed_groups``: each group's attention, [1, N, H, D]."""
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
    return torch.cat(out, dim=2).transpose(1, 2).contiguous()


PACKED_FORWARD = ContextVar("rlvr_packed_forward", default=False)


def varlen_mask(*args, **kwargs):
    """SDPA's masks for ordinary calls (the engine's, padding and sliding window included); none
    inside a packed forward, where ``varlen_attention`` builds each sample's pattern itself and a
    sliding-window layer's N x N mask over the whole row would only cost memory."""
    return None if PACKED_FORWARD.get() else sdpa_mask(*args, **kwargs)


AttentionInterface.register(ATTN_IMPLEMENTATION, varlen_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, varlen_mask)
