"""`attend`'s fused path: `F.scaled_dot_product_attention` with attnlab's masks, the path every
forward takes when nothing reads scores, weights or summaries (training included, dropout on
the weights). Grouped-query key/value heads go to SDPA uncopied where it takes them.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from .masks import Mask

#: Whether `F.scaled_dot_product_attention` takes grouped-query key/value heads as they are
#: (`enable_gqa`, torch 2.5 on); before it, `fused_attend` copies them out to every query head.
SDPA_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)
#: Devices whose SDPA is handed grouped-query heads uncopied: the CPU and CUDA, where it was
#: measured no slower in every case, masked ones too (docs/performance.md#grouped-query-decode,
#: `benchmarks/gpu_gqa.py`).
GQA_DEVICES = {"cpu", "cuda"}


def expand_kv(k: Tensor, n_head: int) -> Tensor:
    """(B, nkv, S, hs) -> (B, nh, S, hs), a copy: each key/value head serves nh // nkv query
    heads. For the paths that need one key head per query head (the traced path's weights)."""
    B, nkv, S, hs = k.shape
    if nkv == n_head:
        return k
    k = k[:, :, None].expand(B, nkv, n_head // nkv, S, hs)  # (B, nkv, nh/nkv, S, hs)
    return k.reshape(B, n_head, S, hs)  # (B, nh, S, hs)


def fused_attend(q: Tensor, k: Tensor, v: Tensor, mask: Mask, may_attend: Tensor | None,
                 scale: float, dropout_p: float) -> Tensor:
    """`attend`'s fused path: q (B, nh, T, hs), k/v (B, nkv, S, hs) -> (B, nh, T, hs);
    may_attend: the mask with empty rows let through (their output is zeroed here).
    Grouped-query k/v go to SDPA uncopied where it takes them (`SDPA_GQA`, `GQA_DEVICES`)."""
    gqa = k.shape[1] != q.shape[1]
    if gqa and not (SDPA_GQA and q.device.type in GQA_DEVICES):
        k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])  # (B, nh, S, hs)
        gqa = False
    # a keyword torch 2.4 does not know: passed only for grouped heads
    sdpa = partial(F.scaled_dot_product_attention, enable_gqa=True) if gqa else (
        F.scaled_dot_product_attention)
    if mask.square_causal:
        context = sdpa(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale)  # (B, nh, T, hs)
    else:
        context = sdpa(q, k, v, attn_mask=may_attend, dropout_p=dropout_p,
                       scale=scale)  # (B, nh, T, hs)
    empty = mask.empty_rows
    return context if empty is None else context.masked_fill(empty, 0.0)
