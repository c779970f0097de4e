"""Next-token sampling for a batch of rows with per-row settings (pure tensor functions).

Contract: the returned log-prob of each token is log softmax(logits / T) over the full
vocabulary — the same quantity the trainer recomputes (it divides logits by
``--rollout-temperature`` too), so train-vs-rollout log-prob differences measure real
train/inference mismatch, not a definition gap. Top-p/top-k restrict *which* tokens can be
drawn; the returned log-prob is not renormalised over the kept set (slime/SGLang convention).
Greedy rows (temperature 0) take the argmax and report the log-prob at temperature 1.

Seeds: ``request_seed`` names a request's random stream by what the request *is* (run seed,
the sample's draw number and index in its group, its turn), never by the order requests reach
the engine, so the tokens a seed draws do not depend on thread timing.
"""

from __future__ import annotations

import hashlib

import torch


def request_seed(*key: int | str) -> int:
    """A 62-bit sampling seed that is a pure function of ``key`` (e.g. run seed, draw number,
    sample index, turn): the same key gives the same seed in every process, a different key an
    unrelated one (BLAKE2b of the key tuple's repr).

    >>> request_seed(1234, 7, 0, 0) == request_seed(1234, 7, 0, 0)
    True
    >>> request_seed(1234, 7, 0, 0) == request_seed(1234, 7, 1, 0)
    False
    """
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits outside each row's top-k and nucleus (top-p). ``logits``: [B, V];
    ``top_k``: [B] (<= 0 = off); ``top_p``: [B] in (0, 1]. Returns logits with -inf where cut."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).unsqueeze(-1)
    cut = ranks >= k
    probs = sorted_logits.softmax(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass strictly
    # before it already reaches top_p (the first token is always kept).
    mass_before = probs.cumsum(dim=-1) - probs
    cut |= mass_before >= top_p.unsqueeze(-1)
    cut[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(cut, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def top_log_probs(logits: torch.Tensor, temperature: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely tokens of each row and their log-probs under log softmax(logits / T)
    over the full vocabulary (T = 1 for greedy rows), as ``sample_next`` reports the sampled token's:
    the head of q that score centering reads. ``logits`` [B, V], ``temperature`` [B] -> ([B, k], [B, k]).

    >>> ids, lp = top_log_probs(torch.log(torch.tensor([[0.2, 0.5, 0.3]])), torch.ones(1), 2)
    >>> ids.tolist(), [round(x, 3) for x in lp.exp()[0].tolist()]
    ([[1, 2]], [0.5, 0.3])
    """
    t = torch.where(temperature <= 0, torch.ones_like(temperature), temperature).unsqueeze(-1)
    values, ids = (logits / t).log_softmax(-1).topk(min(k, logits.shape[-1]), dim=-1)
    return ids, values


def sample_next(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generators: list[torch.Generator],
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row. ``logits`` [B, V] float32; ``temperature``/``top_p`` [B] float;
    ``top_k`` [B] long; ``generators``: one per row. Each row draws its uniform from its own
    generator (inverse-CDF sampling, batched), so a request's tokens do not depend on which other
    requests share the batch or on when they joined. Returns (tokens [B], log-probs [B])."""
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)
    logp = scaled.log_softmax(-1)
    if bool((top_k > 0).any() or (top_p < 1).any()):
        probs = filter_logits(scaled, top_k, top_p).softmax(-1)
    else:
        probs = logp.exp()
    cdf = probs.cumsum(-1)
    u = torch.stack([torch.rand((), generator=g, device=logits.device) for g in generators])
    # Scale to the row's total mass (cumsum rounding) and take the first index whose CDF
    # exceeds it: a zero-probability (filtered) token is never drawn.
    tokens = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    tokens = tokens.clamp(max=logits.shape[-1] - 1)
    tokens = torch.where(greedy, logits.argmax(-1), tokens)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
