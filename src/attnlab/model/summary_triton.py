"""The Triton kernels behind `summary_kernels.py`: attention summaries from q and k, with no
score or weight tile ever written to memory.

This module imports triton at the top, so only `summary_kernels.py` imports it, lazily, on a
GPU (or under Triton's interpreter in the tests). It owns the passes; what a summary
means is `summaries.py`'s, when to run them `summary_kernels.py`'s. Scores are kept in base 2
(s2 = q . k * scale * log2(e)) so each exponential is one exp2.

    rows pass      grid (query blocks, B * nh): online max m, l = sum 2^(s2 - m),
                   t = sum 2^(s2 - m) (s2 - m), d = sum 2^(s2 - m) (i - j) over the row's
                   keys; then lse2 = m + log2 l, max = 1 / l, entropy = ln 2 (log2 l - t / l),
                   distance = d / l, sink = 2^(s2_sink - lse2)
    received pass  grid (key blocks, B * nh): sum over the real query rows of
                   2^(s2 - lse2_i), from the rows pass's lse2

or, where the attention forward hands over each row's lse (SDPA's kernels make it):

    given lse      grid (query blocks, B * nh): p = 2^(s2 - lse2) is each weight as it is
                   made, so tiles of p x, p (i - j) and s2 add up element by element and
                   are summed over each row once, at the end; then the received pass

With CONTEXT the rows pass is also the flash attention forward: it keeps acc = sum
2^(s2 - m) v_j with the same running max and writes context = acc / l, so the exponentials
it makes for the summaries make the context too, and no separate forward runs.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def keys_ok(cols, row_ok, key_index, S, pad_row, window,
            CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, HAS_PAD: tl.constexpr):
    """(BLOCK_M, BLOCK_N) True where each query row may attend key `cols`: the key exists,
    the row exists (row_ok), causal with cached keys (key_index: each row's own key), the window and
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
def _dot(q, k_t, IEEE: tl.constexpr):
    """q (BLOCK_M, BLOCK_D) @ k_t (BLOCK_D, BLOCK_N) in float32; IEEE: float32 inputs exactly
    (no TF32), as the torch path's float32 matmul."""
    if IEEE:
        return tl.dot(q, k_t, input_precision="ieee")
    return tl.dot(q, k_t)


@triton.jit
def products(q, k_head, start, dims, dim_ok, sks, S,
             BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    """(BLOCK_M, BLOCK_N) float32 q . k of q's rows against keys start..+BLOCK_N, unscaled
    (keys past S read as zeros)."""
    cols = start + tl.arange(0, BLOCK_N)
    k_t = tl.load(k_head + cols[None, :] * sks + dims[:, None],
                  mask=dim_ok[:, None] & (cols < S)[None, :], other=0.0)  # (BLOCK_D, BLOCK_N)
    return _dot(q, k_t, IEEE)


@triton.jit
def key_blocks(pid_m, offset, window, S, first, clean, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
               HAS_PAD: tl.constexpr):
    """lo <= full_lo <= full_hi <= hi: query block pid_m attends keys in [lo, hi) only (in
    whole blocks from lo), and every one of its rows attends [full_lo, full_hi) whole. With
    a padding, keys before `first` are pads and keys from `clean` on are all real."""
    lo, hi = 0, S
    if HAS_PAD:  # blocks of pads alone (a left padding's) are attended by no row
        lo = (first // BLOCK_N) * BLOCK_N
    if CAUSAL:  # keys after the block's last query are hidden from all its rows
        hi = tl.minimum(S, offset + (pid_m + 1) * BLOCK_M)
    if WINDOWED:  # keys before the first query's window too
        lo = tl.maximum(lo, offset + pid_m * BLOCK_M - window + 1)
        lo = (lo // BLOCK_N) * BLOCK_N
    full_lo, full_hi = _full_keys(pid_m, lo, hi, offset, window, S, clean, BLOCK_M, BLOCK_N,
                                  CAUSAL, WINDOWED, HAS_PAD)
    return lo, full_lo, full_hi, hi


@triton.jit
def _full_keys(pid_m, lo, hi, offset, window, S, clean, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
               HAS_PAD: tl.constexpr):
    """[full_lo, full_hi): the key blocks within [lo, hi) that every row of query block
    pid_m attends whole (no mask to apply): with a padding, only keys from `clean` on (S:
    none). Rows past T need no mask: their results are never stored."""
    first_key = offset + pid_m * BLOCK_M  # the block's first row's own key
    full_hi = (S // BLOCK_N) * BLOCK_N  # keys past S in the last block
    if CAUSAL:  # keys up to the first row's own are seen by every row
        full_hi = tl.minimum(full_hi, ((first_key + 1) // BLOCK_N) * BLOCK_N)
    full_lo = lo
    if WINDOWED:  # keys inside the last row's window are inside every row's
        last_from = first_key + BLOCK_M - window  # the last row's first key
        full_lo = tl.maximum(lo, ((last_from + BLOCK_N - 1) // BLOCK_N) * BLOCK_N)
    if HAS_PAD:
        full_lo = tl.maximum(full_lo, tl.cdiv(clean, BLOCK_N) * BLOCK_N)
    full_lo = tl.minimum(full_lo, hi)
    full_hi = tl.minimum(full_hi, hi)
    full_hi = tl.maximum(full_hi, full_lo)
    return full_lo, full_hi


@triton.jit
def query_block(q_head, pid_m, sqt, T, offset, HS: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_M: tl.constexpr):
    """Query block pid_m of one (batch, head) at q_head: its rows, which exist, each row's
    own key index (cached keys come first), the head dims, which exist, and q (BLOCK_M,
    BLOCK_D), zeros past T and HS."""
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < T
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < HS
    q = tl.load(q_head + rows[:, None] * sqt + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
    return rows, row_ok, offset + rows, dims, dim_ok, q


@triton.jit
def _rows_block(q, k_head, v_head, start, rows, row_ok, key_index, dims, dim_ok, sks, svs, S,
                pad_row, window, scale2, m, l_sum, t_sum, d_sum, acc, HS: tl.constexpr,
                BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
                HAS_PAD: tl.constexpr, WANT_ENTROPY: tl.constexpr,
                WANT_DISTANCE: tl.constexpr, IEEE: tl.constexpr, MASKED: tl.constexpr,
                CONTEXT: tl.constexpr):
    """The rows pass's running (m, l, t, d, acc) after keys start..+BLOCK_N; MASKED: some
    pairs are hidden (else every row attends every key of the block, and no mask is
    computed); CONTEXT: acc (BLOCK_M, BLOCK_D) gathers the values, else it passes through."""
    qk = products(q, k_head, start, dims, dim_ok, sks, S, BLOCK_N, IEEE)
    cols = start + tl.arange(0, BLOCK_N)
    if MASKED:
        ok = keys_ok(cols, row_ok, key_index, S, pad_row, window,
                     CAUSAL, WINDOWED, HAS_PAD)
        qk = tl.where(ok, qk, float("-inf"))
    # the scale (> 0) commutes with the max, and s2 - m is then one fused multiply-add per
    # pair, as in flash attention: this pass is bound by the instructions it issues, not by
    # its exponentials (docs/performance-gpu.md#summaries-on-a-gpu)
    m_new = tl.maximum(m, tl.max(qk, 1) * scale2)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet
    alpha = tl.exp2(m - m_safe)  # 0 while m is -inf
    x = qk * scale2 - m_safe[:, None]  # (BLOCK_M, BLOCK_N) s2 - m
    if MASKED:
        x = tl.where(ok, x, 0.0)
        p = tl.where(ok, tl.exp2(x), 0.0)  # (BLOCK_M, BLOCK_N)
    else:
        p = tl.exp2(x)  # (BLOCK_M, BLOCK_N)
    l_block = tl.sum(p, 1)
    if WANT_ENTROPY:  # t relative to the new max: (s2 - m') = (s2 - m) + (m - m')
        shift = (tl.where(l_sum > 0, m, m_safe) - m_safe) * l_sum  # no -inf * 0
        t_sum = alpha * (t_sum + shift) + tl.sum(p * x, 1)
    if WANT_DISTANCE:  # sum p (i - j) = (i - start) sum p - sum p (j - start): one product
        offsets = tl.arange(0, BLOCK_N).to(tl.float32)  # j - start
        d_sum = alpha * d_sum + (key_index - start).to(tl.float32) * l_block \
            - tl.sum(p * offsets[None, :], 1)
    if CONTEXT:
        v = tl.load(v_head + cols[:, None] * svs + dims[None, :],
                    mask=(cols < S)[:, None] & dim_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
        # (BLOCK_M, BLOCK_N) @ (BLOCK_N, BLOCK_D) -> (BLOCK_M, BLOCK_D), as flash attention
        acc = alpha[:, None] * acc + _dot(p.to(v.dtype), v, IEEE)
    return m_new, alpha * l_sum + l_block, t_sum, d_sum, acc


@triton.jit
def rows_kernel(q_ptr, k_ptr, v_ptr, context_ptr, pad_ptr, first_ptr, clean_ptr, lse_ptr,
                entropy_ptr, sink_ptr, distance_ptr, max_ptr,
                sqb, sqh, sqt, skb, skh, sks, svb, svh, svs, scb, sch, sct,
                nh, group, T, S, offset, window, scale2,
                HS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
                HAS_PAD: tl.constexpr, WANT_ENTROPY: tl.constexpr, WANT_SINK: tl.constexpr,
                WANT_DISTANCE: tl.constexpr, WANT_MAX: tl.constexpr, IEEE: tl.constexpr,
                CONTEXT: tl.constexpr, PAD_ROWS: tl.constexpr):
    """One block of query rows of one (batch, head): their row summaries and lse2 (float32,
    contiguous (B, nh, T)); a row with no key gets 0s and lse2 = +inf, and so does a pad's
    own row with PAD_ROWS (the summaries' rule; the weights pass wants its lse). With
    CONTEXT, also their context (v's dtype): sum_j w_ij v_j, 0s for a row with no key."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // nh, bh % nh
    rows, row_ok, key_index, dims, dim_ok, q = query_block(
        q_ptr + b * sqb + h * sqh, pid_m, sqt, T, offset, HS, BLOCK_D, BLOCK_M)
    kvh = h // group  # grouped-query attention: the key head serving query head h
    pad_row = pad_ptr + b * S
    first = tl.load(first_ptr + b)
    lo, full_lo, full_hi, hi = key_blocks(pid_m, offset, window, S, first,
                                          tl.load(clean_ptr + b), BLOCK_M, BLOCK_N,
                                          CAUSAL, WINDOWED, HAS_PAD)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_M,), tl.float32)
    t_sum = tl.zeros((BLOCK_M,), tl.float32)
    d_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)  # unused (and dropped) without CONTEXT
    k_head = k_ptr + b * skb + kvh * skh
    v_head = v_ptr + b * svb + kvh * svh
    for start in range(lo, full_lo, BLOCK_N):  # before the window's full blocks: masked
        m, l_sum, t_sum, d_sum, acc = _rows_block(
            q, k_head, v_head, start, rows, row_ok, key_index, dims, dim_ok, sks, svs, S,
            pad_row, window, scale2, m, l_sum, t_sum, d_sum, acc, HS, BLOCK_N, CAUSAL,
            WINDOWED, HAS_PAD, WANT_ENTROPY, WANT_DISTANCE, IEEE, True, CONTEXT)
    for start in range(full_lo, full_hi, BLOCK_N):
        m, l_sum, t_sum, d_sum, acc = _rows_block(
            q, k_head, v_head, start, rows, row_ok, key_index, dims, dim_ok, sks, svs, S,
            pad_row, window, scale2, m, l_sum, t_sum, d_sum, acc, HS, BLOCK_N, CAUSAL,
            WINDOWED, HAS_PAD, WANT_ENTROPY, WANT_DISTANCE, IEEE, False, CONTEXT)
    for start in range(tl.maximum(full_hi, lo), hi, BLOCK_N):  # the diagonal, the last keys
        m, l_sum, t_sum, d_sum, acc = _rows_block(
            q, k_head, v_head, start, rows, row_ok, key_index, dims, dim_ok, sks, svs, S,
            pad_row, window, scale2, m, l_sum, t_sum, d_sum, acc, HS, BLOCK_N, CAUSAL,
            WINDOWED, HAS_PAD, WANT_ENTROPY, WANT_DISTANCE, IEEE, True, CONTEXT)
    has = row_ok & (l_sum > 0)
    if HAS_PAD and PAD_ROWS:  # a pad's own query is a row of 0s
        own = tl.load(pad_row + key_index, mask=row_ok, other=0)
        has = has & (own != 0)
    l_safe = tl.where(has, l_sum, 1.0)
    log_l = tl.log2(l_safe)
    lse2 = tl.where(m == float("-inf"), 0.0, m) + log_l
    out = bh * T + rows
    tl.store(lse_ptr + out, tl.where(has, lse2, float("inf")), mask=row_ok)
    if CONTEXT:  # a row with no key: 0s, as the fused path's (a pad's own row keeps its keys')
        context = acc / tl.where(l_sum > 0, l_sum, 1.0)[:, None]  # (BLOCK_M, BLOCK_D)
        tl.store(context_ptr + b * scb + h * sch + rows[:, None] * sct + dims[None, :],
                 context.to(context_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & dim_ok[None, :])
    if WANT_ENTROPY:
        entropy = 0.6931471805599453 * (log_l - t_sum / l_safe)  # ln 2: bits to nats
        tl.store(entropy_ptr + out, tl.where(has, entropy, 0.0), mask=row_ok)
    if WANT_DISTANCE:
        tl.store(distance_ptr + out, tl.where(has, d_sum / l_safe, 0.0), mask=row_ok)
    if WANT_MAX:
        tl.store(max_ptr + out, tl.where(has, 1.0 / l_safe, 0.0), mask=row_ok)
    if WANT_SINK:
        sink = _sink(q, k_head, first, sks, dims, dim_ok, key_index, has,
                     lse2, scale2, window, CAUSAL, WINDOWED)
        tl.store(sink_ptr + out, sink, mask=row_ok)


@triton.jit
def _given_block(q, k_head, start, rows, row_ok, key_index, lse2, base, dims, dim_ok, sks, S,
                 pad_row, window, scale2, t_acc, d_acc, s_max, HS: tl.constexpr,
                 BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
                 HAS_PAD: tl.constexpr, WANT_ENTROPY: tl.constexpr,
                 WANT_DISTANCE: tl.constexpr, WANT_MAX: tl.constexpr, IEEE: tl.constexpr,
                 MASKED: tl.constexpr):
    """The given-lse rows pass's (BLOCK_M, BLOCK_N) running tiles after keys start..+BLOCK_N,
    added to element by element: with each row's lse known nothing is rescaled, so nothing
    is summed over a row until the end (base: i - j + start per pair, exact in float32)."""
    qk = products(q, k_head, start, dims, dim_ok, sks, S, BLOCK_N, IEEE)
    x = qk * scale2 - lse2[:, None]  # (BLOCK_M, BLOCK_N) log2 of the weights
    if MASKED:  # where, not a product: a hidden pair's exp2 may overflow
        ok = keys_ok(start + tl.arange(0, BLOCK_N), row_ok, key_index, S, pad_row,
                     window, CAUSAL, WINDOWED, HAS_PAD)
        x = tl.where(ok, x, 0.0)
        p = tl.where(ok, tl.exp2(x), 0.0)  # (BLOCK_M, BLOCK_N)
        if WANT_MAX:
            qk = tl.where(ok, qk, float("-inf"))
    else:
        p = tl.exp2(x)  # (BLOCK_M, BLOCK_N)
    if WANT_ENTROPY:
        t_acc += p * x
    if WANT_DISTANCE:
        d_acc += p * (base - start)  # i - j
    if WANT_MAX:  # the scale (> 0) commutes with the max
        s_max = tl.maximum(s_max, qk)
    return t_acc, d_acc, s_max


@triton.jit
def given_rows_kernel(q_ptr, k_ptr, pad_ptr, first_ptr, clean_ptr, lse_ptr,
                      entropy_ptr, sink_ptr, distance_ptr, max_ptr,
                      sqb, sqh, sqt, skb, skh, sks,
                      nh, group, T, S, offset, window, scale2,
                      HS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
                      HAS_PAD: tl.constexpr, WANT_ENTROPY: tl.constexpr,
                      WANT_SINK: tl.constexpr, WANT_DISTANCE: tl.constexpr,
                      WANT_MAX: tl.constexpr, IEEE: tl.constexpr):
    """`rows_kernel`'s row summaries of one block of query rows of one (batch, head), given
    each row's lse2 (float32, contiguous (B, nh, T), +inf for a row with no weights, as
    `rows_kernel` writes it): p = 2^(s2 - lse2) is each weight as it is made, so no running
    max, no rescaling and no sum per block; entropy = -ln 2 sum p log2 p, distance =
    sum p (i - j), max = 2^(max s2 - lse2)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // nh, bh % nh
    rows, row_ok, key_index, dims, dim_ok, q = query_block(
        q_ptr + b * sqb + h * sqh, pid_m, sqt, T, offset, HS, BLOCK_D, BLOCK_M)
    pad_row = pad_ptr + b * S
    lse2 = tl.load(lse_ptr + bh * T + rows, mask=row_ok, other=float("inf"))
    has = row_ok & (lse2 < float("inf"))
    # a row without weights: a finite lse2 so large that its weights are 0 and p x is -0
    lse2_safe = tl.where(has, lse2, 1e30)
    first = tl.load(first_ptr + b)
    lo, full_lo, full_hi, hi = key_blocks(pid_m, offset, window, S, first,
                                          tl.load(clean_ptr + b), BLOCK_M, BLOCK_N,
                                          CAUSAL, WINDOWED, HAS_PAD)
    base = (key_index[:, None] - tl.arange(0, BLOCK_N)[None, :]).to(tl.float32)
    t_acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    d_acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    s_max = tl.full((BLOCK_M, BLOCK_N), float("-inf"), tl.float32)
    k_head = k_ptr + b * skb + (h // group) * skh
    for start in range(lo, full_lo, BLOCK_N):  # before the window's full blocks: masked
        t_acc, d_acc, s_max = _given_block(
            q, k_head, start, rows, row_ok, key_index, lse2_safe, base, dims, dim_ok, sks, S,
            pad_row, window, scale2, t_acc, d_acc, s_max, HS, BLOCK_N, CAUSAL, WINDOWED,
            HAS_PAD, WANT_ENTROPY, WANT_DISTANCE, WANT_MAX, IEEE, True)
    for start in range(full_lo, full_hi, BLOCK_N):
        t_acc, d_acc, s_max = _given_block(
            q, k_head, start, rows, row_ok, key_index, lse2_safe, base, dims, dim_ok, sks, S,
            pad_row, window, scale2, t_acc, d_acc, s_max, HS, BLOCK_N, CAUSAL, WINDOWED,
            HAS_PAD, WANT_ENTROPY, WANT_DISTANCE, WANT_MAX, IEEE, False)
    for start in range(tl.maximum(full_hi, lo), hi, BLOCK_N):  # the diagonal, the last keys
        t_acc, d_acc, s_max = _given_block(
            q, k_head, start, rows, row_ok, key_index, lse2_safe, base, dims, dim_ok, sks, S,
            pad_row, window, scale2, t_acc, d_acc, s_max, HS, BLOCK_N, CAUSAL, WINDOWED,
            HAS_PAD, WANT_ENTROPY, WANT_DISTANCE, WANT_MAX, IEEE, True)
    out = bh * T + rows
    if WANT_ENTROPY:  # -sum p ln p = -ln 2 sum p log2 p
        tl.store(entropy_ptr + out, tl.where(has, -0.6931471805599453 * tl.sum(t_acc, 1), 0.0),
                 mask=row_ok)
    if WANT_DISTANCE:
        tl.store(distance_ptr + out, tl.where(has, tl.sum(d_acc, 1), 0.0), mask=row_ok)
    if WANT_MAX:
        p_max = tl.exp2(tl.max(s_max, 1) * scale2 - lse2_safe)
        tl.store(max_ptr + out, tl.where(has, p_max, 0.0), mask=row_ok)
    if WANT_SINK:
        sink = _sink(q, k_head, first, sks, dims, dim_ok, key_index, has, lse2_safe, scale2,
                     window, CAUSAL, WINDOWED)
        tl.store(sink_ptr + out, sink, mask=row_ok)


@triton.jit
def _received_block(q_head, k_t, lse_row, start, cols, dims, dim_ok, sqt, T, S, pad_row,
                    offset, window, scale2, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr,
                    WINDOWED: tl.constexpr, HAS_PAD: tl.constexpr, IEEE: tl.constexpr,
                    MASKED: tl.constexpr):
    """(BLOCK_M, BLOCK_N) the weights query rows start..+BLOCK_M give the block's keys;
    MASKED: some pairs are hidden (rows past T and pad rows need no mask: their lse2 is
    +inf, so their weights are 0)."""
    rows = start + tl.arange(0, BLOCK_M)
    row_ok = rows < T
    q = tl.load(q_head + rows[:, None] * sqt + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
    lse2 = tl.load(lse_row + rows, mask=row_ok, other=float("inf"))
    p = tl.exp2(_dot(q, k_t, IEEE) * scale2 - lse2[:, None])  # (BLOCK_M, BLOCK_N)
    if MASKED:
        ok = keys_ok(cols, row_ok, offset + rows, S, pad_row, window,
                     CAUSAL, WINDOWED, HAS_PAD)
        p = tl.where(ok, p, 0.0)
    return p


@triton.jit
def received_kernel(q_ptr, k_ptr, pad_ptr, first_ptr, clean_ptr, lse_ptr, received_ptr,
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
    if HAS_PAD:  # a block of pads alone (before the first real key): no row attends it
        hi = tl.where((pid_n + 1) * BLOCK_N <= tl.load(first_ptr + b), lo, hi)
    # [full_lo, full_hi): whole blocks of rows that attend every key of this block
    full_lo, full_hi = lo, hi
    if CAUSAL:  # rows whose own key is at or past the block's last
        full_lo = tl.maximum(lo, tl.cdiv((pid_n + 1) * BLOCK_N - 1 - offset, BLOCK_M) * BLOCK_M)
    if WINDOWED:  # rows whose window still holds the block's first key
        full_hi = tl.minimum(hi, ((pid_n * BLOCK_N + window - offset) // BLOCK_M) * BLOCK_M)
    if HAS_PAD:  # only a block of real keys alone (from `clean` on) goes unmasked
        full_lo = tl.where(pid_n * BLOCK_N >= tl.load(clean_ptr + b), full_lo, hi)
    full_lo = tl.minimum(full_lo, hi)
    full_hi = tl.maximum(full_hi, full_lo)
    # summed over rows once, at the end: a block's rows lie across warps, so each sum over
    # them is a trip through shared memory and a barrier, where adding tiles is one add
    received = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for start in range(lo, full_lo, BLOCK_M):
        received += _received_block(q_head, k_t, lse_ptr + bh * T, start, cols, dims, dim_ok,
                                    sqt, T, S, pad_row, offset, window, scale2, BLOCK_M,
                                    CAUSAL, WINDOWED, HAS_PAD, IEEE, True)
    for start in range(full_lo, full_hi, BLOCK_M):
        received += _received_block(q_head, k_t, lse_ptr + bh * T, start, cols, dims, dim_ok,
                                    sqt, T, S, pad_row, offset, window, scale2, BLOCK_M,
                                    CAUSAL, WINDOWED, HAS_PAD, IEEE, False)
    for start in range(full_hi, hi, BLOCK_M):
        received += _received_block(q_head, k_t, lse_ptr + bh * T, start, cols, dims, dim_ok,
                                    sqt, T, S, pad_row, offset, window, scale2, BLOCK_M,
                                    CAUSAL, WINDOWED, HAS_PAD, IEEE, True)
    tl.store(received_ptr + bh * S + cols, tl.sum(received, 0), mask=col_ok)
