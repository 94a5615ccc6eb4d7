"""The Triton kernel that writes a layer's whole attention weights from q, k and each row's lse.

With each row's base-2 log-sum-exp known (the summaries' rows pass makes it, or SDPA's kernel
hands it over: `summary_kernels.attention_weights`), each weight is one exponential of its
score, w = 2^(s2 - lse2): no row max, no sum and no second read of a scores tensor. Each
program computes one block of query rows against the keys its mask lets them see, writes
those weights once, and writes 0s over the key blocks the mask hides wholly, so the
(B, nh, T, S) tensor goes through memory once, where scores, mask, softmax and its output
went through it four times. The mask is rebuilt from indices as the summaries' passes
rebuild it (`summary_triton.keys_ok`: causal with cached keys, a window, key padding). This
module imports triton at the top; `summary_kernels` imports it lazily.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .summary_triton import key_blocks, keys_ok, products, query_block


@triton.jit
def _weights_block(q, k_head, w_rows, start, row_ok, key_index, lse2, dims, dim_ok,
                   sks, S, pad_row, window, scale2, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, HAS_PAD: tl.constexpr,
                   IEEE: tl.constexpr, MASKED: tl.constexpr):
    """Store the weights of the block's rows over keys start..+BLOCK_N: 2^(s2 - lse2), 0
    where the mask hides a pair (MASKED: some pair may be hidden)."""
    qk = products(q, k_head, start, dims, dim_ok, sks, S, BLOCK_N, IEEE)
    cols = start + tl.arange(0, BLOCK_N)
    p = tl.exp2(qk * scale2 - lse2[:, None])  # (BLOCK_M, BLOCK_N)
    if MASKED:  # where, not a product: a hidden pair's exp2 may overflow
        ok = keys_ok(cols, row_ok, key_index, S, pad_row, window,
                     CAUSAL, WINDOWED, HAS_PAD)
        p = tl.where(ok, p, 0.0)
    tl.store(w_rows + cols[None, :], p.to(w_rows.dtype.element_ty),
             mask=row_ok[:, None] & (cols < S)[None, :])


@triton.jit
def weights_kernel(q_ptr, k_ptr, pad_ptr, first_ptr, clean_ptr, lse_ptr, w_ptr,
                   sqb, sqh, sqt, skb, skh, sks,
                   nh, group, T, S, offset, window, scale2,
                   HS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
                   HAS_PAD: tl.constexpr, IEEE: tl.constexpr):
    """One block of query rows of one (batch, head): their weights over every key into w
    (contiguous (B, nh, T, S), any float dtype), given each row's lse2 (float32, contiguous
    (B, nh, T), +inf for a row with no weights, whose weights are then all 0)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // nh, bh % nh
    rows, row_ok, key_index, dims, dim_ok, q = query_block(
        q_ptr + b * sqb + h * sqh, pid_m, sqt, T, offset, HS, BLOCK_D, BLOCK_M)
    pad_row = pad_ptr + b * S
    lse2 = tl.load(lse_ptr + bh * T + rows, mask=row_ok, other=float("inf"))
    # a row without weights: a finite lse2 so large that every weight is 0
    lse2 = tl.where(lse2 < float("inf"), lse2, 1e30)
    first = tl.load(first_ptr + b)
    lo, full_lo, full_hi, hi = key_blocks(pid_m, offset, window, S, first,
                                          tl.load(clean_ptr + b), BLOCK_M, BLOCK_N,
                                          CAUSAL, WINDOWED, HAS_PAD)
    # 64-bit offsets: a long context's weights pass 2^31 elements
    w_rows = w_ptr + bh.to(tl.int64) * T * S + rows[:, None].to(tl.int64) * S  # (BLOCK_M, 1)
    k_head = k_ptr + b * skb + (h // group) * skh
    zeros = tl.zeros((BLOCK_M, BLOCK_N), tl.float32).to(w_ptr.dtype.element_ty)
    for start in range(0, lo, BLOCK_N):  # hidden from every row: pads, or past the window
        cols = start + tl.arange(0, BLOCK_N)
        tl.store(w_rows + cols[None, :], zeros, mask=row_ok[:, None] & (cols < S)[None, :])
    for start in range(lo, full_lo, BLOCK_N):  # before the window's full blocks: masked
        _weights_block(q, k_head, w_rows, start, row_ok, key_index, lse2, dims, dim_ok,
                       sks, S, pad_row, window, scale2, BLOCK_N, CAUSAL, WINDOWED,
                       HAS_PAD, IEEE, True)
    for start in range(full_lo, full_hi, BLOCK_N):
        _weights_block(q, k_head, w_rows, start, row_ok, key_index, lse2, dims, dim_ok,
                       sks, S, pad_row, window, scale2, BLOCK_N, CAUSAL, WINDOWED,
                       HAS_PAD, IEEE, False)
    for start in range(tl.maximum(full_hi, lo), hi, BLOCK_N):  # the diagonal, the last keys
        _weights_block(q, k_head, w_rows, start, row_ok, key_index, lse2, dims, dim_ok,
                       sks, S, pad_row, window, scale2, BLOCK_N, CAUSAL, WINDOWED,
                       HAS_PAD, IEEE, True)
    # past the last block computed (lo is a whole block; hi need not be): after the diagonal
    for start in range(tl.maximum(lo, tl.cdiv(hi, BLOCK_N) * BLOCK_N), S, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        tl.store(w_rows + cols[None, :], zeros, mask=row_ok[:, None] & (cols < S)[None, :])
