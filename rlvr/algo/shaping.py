"""Reward shaping applied on the rollout side before advantages are computed."""

from __future__ import annotations

import torch  # noqa: F401 (doctest)
from torch import Tensor


def overlong_penalty(lengths: Tensor, max_len: int, buffer_len: int, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the reward.

    With ``L_max = max_len`` and ``L_cache = buffer_len``: 0 while ``|y| <= L_max - L_cache``, then
    a linear ramp ``((L_max - L_cache) - |y|) / L_cache`` down to -1 at ``|y| = L_max``, and -1
    beyond; the whole term is scaled by ``factor``. DAPO used L_max = 20480, L_cache = 4096.

    Args: lengths [B] response lengths in tokens. Returns [B] penalties (<= 0).

    >>> overlong_penalty(torch.tensor([4, 6, 7, 8, 9]), max_len=8, buffer_len=4).tolist()
    [0.0, -0.5, -0.75, -1.0, -1.0]
    """
    if buffer_len <= 0 or buffer_len > max_len:
        raise ValueError(f"overlong buffer {buffer_len} must be in [1, max_len={max_len}]")
    expected = max_len - buffer_len
    ramp = (expected - lengths.float()) / buffer_len
    return factor * ramp.clamp(min=-1.0, max=0.0)
