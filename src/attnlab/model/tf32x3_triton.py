"""The 3xTF32 matrix product as one Triton kernel: `tf32x3.py` decides when it runs.

Each float32 operand is split into its TF32 part and the TF32 rest, and a b is summed as
hi(a) hi(b) + hi(a) lo(b) + lo(a) hi(b) on TF32 tensor cores (Triton's
`input_precision="tf32x3"`), accumulating in float32. This module imports triton at the top:
import it only where triton is (`tf32x3` does so lazily, on a CUDA tensor or under Triton's
interpreter).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

#: (BLOCK_M, BLOCK_N, BLOCK_K, warps, pipeline stages)
Config = tuple[int, int, int, int, int]
#: largest tile first: `tiles` takes the first that gives every streaming multiprocessor a tile
CONFIGS: list[Config] = [
    (128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4),
]


@triton.jit
def matmul_kernel(a_ptr, b_ptr, bias_ptr, out_ptr, M, N, K,
                  stride_ab, stride_am, stride_ak, stride_bb, stride_bk, stride_bn, alpha,
                  diagonal, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
                  MASK_PAST: tl.constexpr, ZERO_PAST: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[i] (M, N) = alpha * a[i] (M, K) @ b[i] (K, N) + bias (N,), i = program_id(2), for
    float32 a and b of any strides and a contiguous out: one (BLOCK_M, BLOCK_N) tile per
    program. EVEN_K: K is a multiple of BLOCK_K (no mask along K). MASK_PAST: out[r, c] is
    -inf where c > r + diagonal (a causal mask on scores), and a tile wholly there makes no
    product. ZERO_PAST: a[r, c] is 0 where c > r + diagonal (causal weights), so a tile's
    sum stops at the step that holds its last row's diagonal."""
    batch = tl.program_id(2).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < M, cols < N
    # 64-bit offsets: a batch of long-context scores passes 2^31 elements
    a = (a_ptr + batch * stride_ab + rows[:, None].to(tl.int64) * stride_am
         + inner[None, :] * stride_ak)  # (BLOCK_M, BLOCK_K) pointers
    b = (b_ptr + batch * stride_bb + inner[:, None] * stride_bk
         + cols[None, :].to(tl.int64) * stride_bn)  # (BLOCK_K, BLOCK_N) pointers
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    k_end = K
    # the diagonal of the tile's last row that exists
    last = tl.minimum(tl.program_id(0) * BLOCK_M + BLOCK_M, M) - 1 + diagonal
    if MASK_PAST:  # the tile's first column past its last row's diagonal: nothing to sum
        k_end = tl.where(tl.program_id(1) * BLOCK_N > last, 0, K)
    if ZERO_PAST:  # zeros past it add nothing (exactly): not read
        k_end = tl.minimum(K, last + 1)
    for k in range(0, k_end, BLOCK_K):
        if EVEN_K:
            a_tile = tl.load(a, mask=row_ok[:, None], other=0.0)  # (BLOCK_M, BLOCK_K)
            b_tile = tl.load(b, mask=col_ok[None, :], other=0.0)  # (BLOCK_K, BLOCK_N)
        else:
            a_tile = tl.load(a, mask=row_ok[:, None] & (inner[None, :] < K - k), other=0.0)
            b_tile = tl.load(b, mask=(inner[:, None] < K - k) & col_ok[None, :], other=0.0)
        acc = tl.dot(a_tile, b_tile, acc, input_precision="tf32x3")  # (BLOCK_M, BLOCK_N)
        a += BLOCK_K * stride_ak
        b += BLOCK_K * stride_bk
    acc = acc * alpha
    if MASK_PAST:
        acc = tl.where(cols[None, :] > rows[:, None] + diagonal, float("-inf"), acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0)[None, :]
    out = out_ptr + batch * M * N + rows[:, None].to(tl.int64) * N + cols[None, :]
    tl.store(out, acc, mask=row_ok[:, None] & col_ok[None, :])


def tiles(batch: int, M: int, N: int, sms: int) -> Config:
    """The first of `CONFIGS` no larger than the product (each side at least 64) that gives
    each of `sms` streaming multiprocessors a tile, else the smallest that fits: few tiles
    leave multiprocessors idle, small tiles read each operand more often."""
    fits = [c for c in CONFIGS if c[0] <= max(M, 64) and c[1] <= max(N, 64)]
    for config in fits:
        if batch * triton.cdiv(M, config[0]) * triton.cdiv(N, config[1]) >= sms:
            return config
    return fits[-1]


def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (1 elsewhere: the interpreter's CPU)."""
    if device.type != "cuda":
        return 1
    return _sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def matmul(a: Tensor, b: Tensor, alpha: float = 1.0, bias: Tensor | None = None,
           config: Config | None = None, diagonal: int | None = None,
           past: str = "-inf") -> Tensor:
    """alpha * a @ b + bias, contiguous float32 (batch, M, N), for float32 a (batch, M, K)
    and b (batch, K, N) of any strides, bias (N,) or None; config: tiles (`CONFIGS`'s form),
    None for `tiles`' choice. A batch stride 0 (b.expand) reads one b for every a.
    diagonal, with past "-inf": out[:, r, c] is -inf where c > r + diagonal, computed or
    not (causal scores); with past "zero": a's entries there are 0 and not read (causal
    weights)."""
    batch, M, K = a.shape
    N = b.shape[2]
    if past not in ("-inf", "zero"):
        raise ValueError(f"past={past!r}: '-inf' (causal scores) or 'zero' (causal weights)")
    if b.shape[:2] != (batch, K) or a.dtype != torch.float32 or b.dtype != torch.float32:
        raise ValueError(f"a {tuple(a.shape)} {a.dtype} @ b {tuple(b.shape)} {b.dtype}: "
                         "needs float32 (batch, M, K) @ (batch, K, N)")
    block_m, block_n, block_k, warps, stages = config or tiles(
        batch, M, N, multiprocessors(a.device))
    out = a.new_empty((batch, M, N))  # (batch, M, N)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n), batch)
    matmul_kernel[grid](a, b, out if bias is None else bias, out, M, N, K,
                        a.stride(0), a.stride(1), a.stride(2),
                        b.stride(0), b.stride(1), b.stride(2), alpha, diagonal or 0,
                        HAS_BIAS=bias is not None, EVEN_K=K % block_k == 0,
                        MASK_PAST=diagonal is not None and past == "-inf",
                        ZERO_PAST=diagonal is not None and past == "zero",
                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                        num_warps=warps, num_stages=stages)
    return out
