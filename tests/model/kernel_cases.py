"""The mask cases, tolerance and small helpers the kernels' tests share
(test_summary_kernels.py, test_weights_kernel.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.model.masks import Mask, build_mask

TOLERANCE = dict(atol=1e-5, rtol=1e-5)  # float32; distances and received weights exceed 1


class Wants:
    """A LayerTrace of the summaries alone: records what attention hands it."""

    needs_weights = True
    heads = None
    rows = None

    def __init__(self, names: list[str]) -> None:
        self.names, self.values = names, {}

    def wants(self, name: str) -> bool:
        return name in self.names

    def record(self, name: str, value: torch.Tensor) -> torch.Tensor:
        self.values[name] = value
        return value

    def note_mask(self, mask: Mask) -> None:
        pass  # these tests read summaries, not which cells were masked

    def named(self, name: str) -> bool:
        return name in self.names


# (B, nh, nkv, T, S, hs, causal, window, pads per batch row or None, block): a row's pads
# are its first n keys (left padding) or the keys of a slice
CASES = {
    "left padding": (2, 2, 2, 19, 19, 16, True, None, [0, 6], 16),
    "cached keys and GQA": (1, 4, 2, 7, 23, 8, True, None, None, 16),
    "window, padding, ragged": (2, 2, 1, 21, 30, 16, True, 5, [3, 0], 16),
    "no causal, all-pad row": (2, 2, 2, 9, 9, 16, False, None, [0, 9], 16),
    "one query over a cache": (2, 2, 1, 1, 12, 16, True, None, [4, 0], 16),
    # no padding: whole blocks below the diagonal and inside the window take the unmasked
    # path (summary_triton._full_keys), the diagonal and the window's edge the masked one
    "causal, whole blocks": (1, 2, 1, 70, 70, 16, True, None, None, 16),
    "window, whole blocks, cached keys": (1, 2, 2, 50, 90, 16, True, 37, None, 16),
    "no causal, whole blocks": (1, 2, 1, 40, 40, 16, False, None, None, 16),
    # left padding: blocks of pads alone are skipped, blocks of real keys alone take the
    # unmasked path (summary_kernels._clean_from); other paddings keep every mask
    "left padding, whole blocks": (2, 2, 1, 70, 70, 16, True, None, [37, 0], 16),
    "window, left padding, cached keys": (2, 2, 1, 50, 90, 16, True, 37, [45, 3], 16),
    "no causal, left padding, whole blocks": (2, 2, 2, 40, 40, 16, False, None, [20, 0], 16),
    "pads inside and at the end": (2, 2, 1, 60, 60, 16, True, None,
                                   [slice(17, 40), slice(50, 60)], 16),
}


def case_tensors(case: str) -> tuple[torch.Tensor, torch.Tensor, Mask]:
    """q (B, nh, T, hs), k (B, nkv, S, hs) and the mask of CASES[case] (seeded by its name)."""
    B, nh, nkv, T, S, hs, causal, window, pads, _ = CASES[case]
    gen = torch.Generator().manual_seed(len(case))
    q = torch.randn(B, nh, T, hs, generator=gen) * 2  # (B, nh, T, hs)
    k = torch.randn(B, nkv, S, hs, generator=gen)  # (B, nkv, S, hs)
    attention_mask = None
    if pads is not None:
        attention_mask = torch.ones(B, S, dtype=torch.long)
        for b, n in enumerate(pads):
            attention_mask[b, n if isinstance(n, slice) else slice(0, n)] = 0
    return q, k, build_mask(T, S, attention_mask, causal=causal, window=window)


def row_lse(q: torch.Tensor, k: torch.Tensor, mask: Mask, scale: float) -> torch.Tensor:
    """(B, nh, T) each row's natural log-sum-exp under the mask, -inf for a row with no key
    (as an attention forward would hand it over)."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # (B, nh, S, hs)
    scores = q @ k.transpose(-1, -2) * scale  # (B, nh, T, S)
    if mask.may_attend is not None:
        scores = scores.masked_fill(~mask.may_attend, float("-inf"))
    return scores.logsumexp(-1)  # (B, nh, T)


def small_model(**overrides: Any) -> GPT:
    torch.manual_seed(0)
    config = {"n_head": 4, "n_kv_head": 2, **overrides}
    return GPT(GPTConfig.from_name("nano", **config)).eval()


def need_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
