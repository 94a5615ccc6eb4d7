"""Seed 004: three ways to average each token with the tokens before it.

Causal attention with all scores equal is exactly a running mean over the past. Seed 004
builds that mean three ways, each a step closer to attention:

1. `average_loops`: two Python loops, x_avg[b, t] = mean(x[b, :t+1]).
2. `average_tril_matmul`: one matmul with a row-normalised lower-triangular matrix.
3. `average_softmax`: softmax of a zero matrix masked with -inf above the diagonal, which
   is what `attend()` computes when every score is equal, so learned scores (q @ k^T)
   turn the uniform average into a data-dependent one.

All take x (B, T, C) and return (B, T, C); `tests/demos/test_averaging.py` proves they agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model.masks import causal_mask


def average_loops(x: Tensor) -> Tensor:
    B, T, _ = x.shape
    x_avg = torch.zeros_like(x)  # (B, T, C)
    for b in range(B):
        for t in range(T):
            x_avg[b, t] = x[b, : t + 1].mean(dim=0)  # (t+1, C) -> (C,)
    return x_avg


def average_tril_matmul(x: Tensor) -> Tensor:
    T = x.shape[1]
    weights = torch.tril(torch.ones(T, T, dtype=x.dtype, device=x.device))  # (T, T)
    weights = weights / weights.sum(dim=1, keepdim=True)  # each row sums to 1
    return weights @ x  # (T, T) @ (B, T, C) -> (B, T, C)


def average_softmax(x: Tensor) -> Tensor:
    T = x.shape[1]
    scores = torch.zeros(T, T, dtype=x.dtype, device=x.device)  # (T, T) all scores equal
    scores = scores.masked_fill(~causal_mask(T, T, x.device), float("-inf"))  # (T, T)
    weights = F.softmax(scores, dim=-1)  # (T, T) uniform over the past
    return weights @ x  # (T, T) @ (B, T, C) -> (B, T, C)


AVERAGING_FORMS = {
    "loops": average_loops,
    "tril_matmul": average_tril_matmul,
    "softmax": average_softmax,
}
