"""Input log-probs: how likely a model finds each token of a given sequence (no sampling).

What SGLang's ``/generate`` returns as ``meta_info.input_token_logprobs`` when asked with
``return_logprob: true`` and ``max_new_tokens: 0``, which is how an on-policy-distillation
teacher scores a student's tokens (``rlvr.train.teacher.ServedTeacher``). Entry ``t`` is
``log softmax(logits_{t-1} / T)[token_t]``, with ``T`` the request's temperature (a temperature of
0, greedy, has no distribution: the raw logits, T = 1, are used); the first token has none.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def input_log_probs(model: torch.nn.Module, token_ids: list[int], temperature: float = 1.0) -> list[float | None]:
    """``[None, log p(t_1 | t_0), ..., log p(t_n | t_<n)]`` under ``model`` (one sequence, one forward).

    The model's own output logits are used, so whatever its forward applies to them (logit
    scaling, final soft-capping) is included, as in generation.
    """
    device = next(model.parameters()).device
    ids = torch.tensor([token_ids], dtype=torch.long, device=device)
    logits = model(input_ids=ids).logits[0, :-1].float()
    scale = temperature if temperature > 0 else 1.0
    logp = (logits / scale).log_softmax(-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return [None, *logp.tolist()]
