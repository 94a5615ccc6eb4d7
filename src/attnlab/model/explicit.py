"""`attend`'s explicit path without a trace: scale, cap, mask, softmax, dropout and the
product with the values, step by step, as the seeds write them (`_whole`), or for a
soft-capped model's forward without autograd a tile of queries and heads at a time
(`traced_attention.tiled_attend`). `attention.attend` picks the path; the traced path is
`traced_attention.py`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from .layers import sink_softmax, soft_cap
from .sdpa import expand_kv
from .summaries import tile_elements
from .traced_attention import tiled_attend

if TYPE_CHECKING:
    from .masks import Mask

#: devices where a capped forward without autograd runs in tiles: the CPU, where they were
#: measured faster than the whole path (docs/models.md#soft-capping); on a GPU not yet
#: measured (`benchmarks/gpu_capped.py` times both)
TILE_DEVICES = {"cpu"}


def explicit_attend(q: Tensor, k: Tensor, v: Tensor, mask: Mask, may_attend: Tensor | None,
                    scale: float, dropout_p: float, softcap: float | None,
                    sinks: Tensor | None = None) -> Tensor:
    """`attend`'s path without a trace where SDPA does not serve (a soft cap, sinks, or
    fused=False): a capped model's (or one with sinks) in tiles (`tiled_attend`) on a CPU
    where nothing needs its gradient or dropout, its scores outgrow one tile and it runs
    uncompiled, as fast as SDPA with no (B, nh, T, S) tensor (docs/models.md#soft-capping);
    else the steps whole (`_whole`)."""
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                              or v.requires_grad)
    # scores that fit one tile are faster whole (the tiles' set-up is most of a small
    # call's time); the tiles' spans are data-dependent, which a compiled step cannot trace
    B, nh, T, _ = q.shape
    whole = B * nh * T * k.shape[2] <= tile_elements(q.device) or (
        torch.compiler.is_compiling())
    if (softcap is None and sinks is None) or dropout_p > 0.0 or needs_grad or whole or (
            q.device.type not in TILE_DEVICES) or q.dtype != v.dtype:
        return _whole(q, k, v, mask, may_attend, scale, dropout_p, softcap, sinks)
    return tiled_attend(q, expand_kv(k, nh), expand_kv(v, nh), mask, may_attend, scale, softcap,
                        sinks)


def _whole(q: Tensor, k: Tensor, v: Tensor, mask: Mask, may_attend: Tensor | None,
           scale: float, dropout_p: float, softcap: float | None = None,
           sinks: Tensor | None = None) -> Tensor:
    """`attend`'s reference path without a trace, step by step (scale, cap, mask, softmax
    (with sinks: `sink_softmax`), dropout, weights @ v). Grouped-query k and v are copied out
    to every query head, as the traced path's are, so that an edit or a trace of the scores
    gives this path's output bit for bit (the same products, the same shapes)."""
    k = expand_kv(k, q.shape[1])  # (B, nh, S, hs)
    v = expand_kv(v, q.shape[1])  # (B, nh, S, hs)
    if q.dtype in (torch.float16, torch.bfloat16):
        # contiguous, as transformers' cache hands them to its eager attention: a CPU's
        # 16-bit product may sum in another order for another layout (see
        # docs/models.md#in-16-bits-bit-for-bit); float32 sums are compared within a
        # tolerance, where a copy of the cache each decode step would only cost time
        k, v = k.contiguous(), v.contiguous()  # (B, nh, S, hs) each
    attn_scores = q @ k.transpose(-2, -1)  # (B, nh, T, hs) @ (B, nh, hs, S) -> (B, nh, T, S)
    # Nothing else reads the raw scores, so scale them in place: every (B, nh, T, S) tensor
    # not allocated is one fewer in fresh pages (docs/performance.md#freed-memory).
    scaled_scores = soft_cap(attn_scores.mul_(scale), softcap, inplace=True)  # (B, nh, T, S)
    if may_attend is not None:
        # + 0 or + -inf gives exactly masked_fill(-inf) then * scale, and unlike a
        # masked_fill it costs backward nothing.
        additive_mask = torch.zeros(may_attend.shape, dtype=attn_scores.dtype, device=q.device)
        additive_mask.masked_fill_(~may_attend, float("-inf"))  # (B or 1, 1, T, S)
        scaled_scores.add_(additive_mask)  # (B, nh, T, S)
    attn_weights = sink_softmax(scaled_scores, sinks)  # (B, nh, T, S)
    if mask.empty_rows is not None:
        attn_weights = attn_weights.masked_fill(mask.empty_rows, 0.0)  # (B, nh, T, S)
    if dropout_p > 0.0:
        attn_weights = F.dropout(attn_weights, p=dropout_p, training=True)  # (B, nh, T, S)
    # float32 weights of 16-bit q and k (GPT-J's, GPT-Neo's: `attend`'s wide) go back to v's
    # dtype first, as transformers' eager attention casts them
    return attn_weights.to(v.dtype) @ v  # (B, nh, T, S) @ (B, nh, S, hs) -> (B, nh, T, hs)
