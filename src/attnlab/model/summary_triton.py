"""The Triton kernels behind `summary_kernels.py`: attention summaries from q and k, with no
score or weight tile ever written to memory.

This module imports triton at the top, so only `summary_kernels.py` imports it, lazily, on a
GPU (or under Triton's interpreter in the tests). It owns the two passes; what a summary
means is `summaries.py`'s, when to run them `summary_kernels.py`'s. Scores are kept in base 2
(s2 = q . k * scale * log2(e)) so each exponential is one exp2.

    rows pass      grid (query blocks, B * nh): online max m, l = sum 2^(s2 - m),
                   t = sum 2^(s2 - m) (s2 - m), d = sum 2^(s2 - m) (i - j) over the row's
                   keys; then lse2 = m + log2 l, max = 1 / l, entropy = ln 2 (log2 l - t / l),
                   distance = d / l, sink = 2^(s2_sink - lse2)
    received pass  grid (key blocks, B * nh): sum over the real query rows of
                   2^(s2 - lse2_i), from the rows pass's lse2
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _keys_ok(rows, cols, row_ok, key_index, S, pad_ptr, pad_row, window,
             CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, HAS_PAD: tl.constexpr):
    """(BLOCK_M, BLOCK_N) True where query row `rows` may attend key `cols`: the key exists,
    the row exists, causal with cached keys (key_index: each row's own key), the window and
    the key padding (pad_row: this batch row's (S,) 0/1 over keys)."""
    col_ok = cols < S
    ok = row_ok[:, None] & col_ok[None, :]
    if CAUSAL:
        ok = ok & (cols[None, :] <= key_index[:, None])
    if WINDOWED:
        ok = ok & (cols[None, :] > key_index[:, None] - window)
    if HAS_PAD:
        real = tl.load(pad_row + cols, mask=col_ok, other=0)
        ok = ok & (real != 0)[None, :]
    return ok


@triton.jit
def _sink(q, k_head, first, sks, dims, dim_ok, key_index, has, lse2, scale2, window,
          CAUSAL: tl.constexpr, WINDOWED: tl.constexpr):
    """(BLOCK_M,) the weight each row of q gives key `first` (the batch row's first real
    one): 0 where the mask hides it or the row has no weights (`has` False)."""
    k_first = tl.load(k_head + first * sks + dims, mask=dim_ok, other=0.0)  # (BLOCK_D,)
    s_first = tl.sum(q.to(tl.float32) * k_first.to(tl.float32)[None, :], 1) * scale2
    seen = has
    if CAUSAL:
        seen = seen & (first <= key_index)
    if WINDOWED:
        seen = seen & (first > key_index - window)
    return tl.where(seen, tl.exp2(s_first - lse2), 0.0)


@triton.jit
def rows_kernel(q_ptr, k_ptr, pad_ptr, first_ptr, lse_ptr,
                entropy_ptr, sink_ptr, distance_ptr, max_ptr,
                sqb, sqh, sqt, skb, skh, sks,
                nh, group, T, S, offset, window, scale2,
                HS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
                HAS_PAD: tl.constexpr, WANT_ENTROPY: tl.constexpr, WANT_SINK: tl.constexpr,
                WANT_DISTANCE: tl.constexpr, WANT_MAX: tl.constexpr, IEEE: tl.constexpr):
    """One block of query rows of one (batch, head): their row summaries and lse2 (float32,
    contiguous (B, nh, T)); a pad row or a row with no key gets 0s and lse2 = +inf."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // nh, bh % nh
    kvh = h // group  # grouped-query attention: the key head serving query head h
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < T
    key_index = offset + rows  # each query's own key index (cached keys come first)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HS
    q = tl.load(q_ptr + b * sqb + h * sqh + rows[:, None] * sqt + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
    k_head = k_ptr + b * skb + kvh * skh
    pad_row = pad_ptr + b * S
    lo, hi = 0, S
    if CAUSAL:  # keys after the block's last query are hidden from all its rows
        hi = tl.minimum(S, offset + (pid_m + 1) * BLOCK_M)
    if WINDOWED:  # keys before the first query's window too
        lo = tl.maximum(0, offset + pid_m * BLOCK_M - window + 1)
        lo = (lo // BLOCK_N) * BLOCK_N
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_M,), tl.float32)
    t_sum = tl.zeros((BLOCK_M,), tl.float32)
    d_sum = tl.zeros((BLOCK_M,), tl.float32)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k_t = tl.load(k_head + cols[None, :] * sks + dims[:, None],
                      mask=dim_ok[:, None] & (cols < S)[None, :], other=0.0)  # (BLOCK_D, BLOCK_N)
        # float32 inputs exactly (no TF32), as the torch path's float32 matmul
        if IEEE:  # noqa: SIM108 (a constexpr branch, resolved as the kernel compiles)
            s2 = tl.dot(q, k_t, input_precision="ieee")
        else:
            s2 = tl.dot(q, k_t)
        s2 = s2 * scale2  # (BLOCK_M, BLOCK_N) float32
        ok = _keys_ok(rows, cols, row_ok, key_index, S, pad_ptr, pad_row, window,
                      CAUSAL, WINDOWED, HAS_PAD)
        s2 = tl.where(ok, s2, float("-inf"))
        m_new = tl.maximum(m, tl.max(s2, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet
        alpha = tl.exp2(m - m_safe)  # 0 while m is -inf
        x = tl.where(ok, s2 - m_safe[:, None], 0.0)
        p = tl.where(ok, tl.exp2(x), 0.0)  # (BLOCK_M, BLOCK_N)
        if WANT_ENTROPY:  # t relative to the new max: (s2 - m') = (s2 - m) + (m - m')
            shift = (tl.where(l_sum > 0, m, m_safe) - m_safe) * l_sum  # no -inf * 0
            t_sum = alpha * (t_sum + shift) + tl.sum(p * x, 1)
        if WANT_DISTANCE:
            gap = (key_index[:, None] - cols[None, :]).to(tl.float32)
            d_sum = alpha * d_sum + tl.sum(p * gap, 1)
        l_sum = alpha * l_sum + tl.sum(p, 1)
        m = m_new
    has = row_ok & (l_sum > 0)
    if HAS_PAD:  # a pad's own query is a row of 0s
        own = tl.load(pad_row + key_index, mask=row_ok, other=0)
        has = has & (own != 0)
    l_safe = tl.where(has, l_sum, 1.0)
    log_l = tl.log2(l_safe)
    lse2 = tl.where(m == float("-inf"), 0.0, m) + log_l
    out = bh * T + rows
    tl.store(lse_ptr + out, tl.where(has, lse2, float("inf")), mask=row_ok)
    if WANT_ENTROPY:
        entropy = 0.6931471805599453 * (log_l - t_sum / l_safe)  # ln 2: bits to nats
        tl.store(entropy_ptr + out, tl.where(has, entropy, 0.0), mask=row_ok)
    if WANT_DISTANCE:
        tl.store(distance_ptr + out, tl.where(has, d_sum / l_safe, 0.0), mask=row_ok)
    if WANT_MAX:
        tl.store(max_ptr + out, tl.where(has, 1.0 / l_safe, 0.0), mask=row_ok)
    if WANT_SINK:
        sink = _sink(q, k_head, tl.load(first_ptr + b), sks, dims, dim_ok, key_index, has,
                     lse2, scale2, window, CAUSAL, WINDOWED)
        tl.store(sink_ptr + out, sink, mask=row_ok)


@triton.jit
def received_kernel(q_ptr, k_ptr, pad_ptr, lse_ptr, received_ptr,
                    sqb, sqh, sqt, skb, skh, sks,
                    nh, group, T, S, offset, window, scale2,
                    HS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
                    HAS_PAD: tl.constexpr, IEEE: tl.constexpr):
    """One block of keys of one (batch, head): the weight each receives, summed over the
    query rows (a pad row's lse2 is +inf: it adds 0), into received (B, nh, S) float32."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // nh
    h = bh % nh
    kvh = h // group
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < S
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HS
    k_t = tl.load(k_ptr + b * skb + kvh * skh + cols[None, :] * sks + dims[:, None],
                  mask=dim_ok[:, None] & col_ok[None, :], other=0.0)  # (BLOCK_D, BLOCK_N)
    q_head = q_ptr + b * sqb + h * sqh
    pad_row = pad_ptr + b * S
    lo = 0
    hi = T
    if CAUSAL:  # rows before the block's first key attend none of its keys
        lo = tl.maximum(0, pid_n * BLOCK_N - offset)
        lo = (lo // BLOCK_M) * BLOCK_M
    if WINDOWED:  # rows whose window has passed the block's last key neither
        hi = tl.minimum(T, (pid_n + 1) * BLOCK_N - 1 + window - offset)
    received = tl.zeros((BLOCK_N,), tl.float32)
    for start in range(lo, hi, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < T
        q = tl.load(q_head + rows[:, None] * sqt + dims[None, :],
                    mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
        lse2 = tl.load(lse_ptr + bh * T + rows, mask=row_ok, other=float("inf"))
        # float32 inputs exactly (no TF32), as the torch path's float32 matmul
        if IEEE:  # noqa: SIM108 (a constexpr branch, resolved as the kernel compiles)
            s2 = tl.dot(q, k_t, input_precision="ieee")
        else:
            s2 = tl.dot(q, k_t)
        s2 = s2 * scale2  # (BLOCK_M, BLOCK_N) float32
        ok = _keys_ok(rows, cols, row_ok, offset + rows, S, pad_ptr, pad_row, window,
                      CAUSAL, WINDOWED, HAS_PAD)
        p = tl.where(ok, tl.exp2(s2 - lse2[:, None]), 0.0)
        received += tl.sum(p, 0)
    tl.store(received_ptr + bh * S + cols, received, mask=col_ok)
