"""A float32 linear as one Triton kernel whose products run on TF32 tensor cores three times
(3xTF32), for the gemm probe (`gpu_gemm`): a probe's kernel, not attnlab's.

Each float32 operand is split into a TF32 part and the TF32 rest of what that part drops,
and a x b is summed as hi(a) hi(b) + hi(a) lo(b) + lo(a) hi(b) (Triton's
`input_precision="tf32x3"`): the term it leaves out, lo(a) lo(b), is about 2^-22 of the
product, near float32's own rounding, where one TF32 product (`torch`'s "high" float32
precision) keeps about 2^-11. On an H100 the tensor cores' TF32 rate is several times its
float32 rate, so three TF32 products may beat cuBLAS's float32 one on the block's small
shapes; whether they do, and with what error against float64, is the probe's question.
This module imports triton at the top: `gpu_gemm` imports it only where triton is.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

#: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) the probe tries on each shape
CONFIGS: list[tuple[int, int, int, int, int]] = [
    (128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 32, 4, 4),
]


@triton.jit
def _linear_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, HAS_BIAS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   PRECISION: tl.constexpr):
    """out (M, N) = x (M, K) @ w (N, K)^T + b (N,), all contiguous float32, K a multiple of
    BLOCK_K: one (BLOCK_M, BLOCK_N) tile of out per program."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    row_ok, col_ok = rows < M, cols < N
    x = x_ptr + rows[:, None] * K + inner[None, :]  # (BLOCK_M, BLOCK_K) pointers
    w = w_ptr + cols[None, :] * K + inner[:, None]  # (BLOCK_K, BLOCK_N): w^T's tile
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for _ in range(0, K, BLOCK_K):
        a = tl.load(x, mask=row_ok[:, None], other=0.0)  # (BLOCK_M, BLOCK_K)
        b = tl.load(w, mask=col_ok[None, :], other=0.0)  # (BLOCK_K, BLOCK_N)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        x += BLOCK_K
        w += BLOCK_K
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0)[None, :]
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc,
             mask=row_ok[:, None] & col_ok[None, :])


def linear(x: Tensor, weight: Tensor, bias: Tensor | None,
           config: tuple[int, int, int, int, int] = CONFIGS[0],
           precision: str = "tf32x3") -> Tensor:
    """F.linear(x, weight, bias) for float32 x (..., K) and weight (N, K), K a multiple of
    config's BLOCK_K, by `_linear_kernel` at config (`CONFIGS`'s form)."""
    block_m, block_n, block_k, warps, stages = config
    *lead, K = x.shape
    N = weight.shape[0]
    if K % block_k or x.dtype != torch.float32:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype}: needs float32 with K a multiple of "
                         f"{block_k}")
    x2 = x.reshape(-1, K).contiguous()  # (M, K)
    M = x2.shape[0]
    out = x2.new_empty((M, N))  # (M, N)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _linear_kernel[grid](x2, weight.contiguous(), x2 if bias is None else bias, out, M, N, K,
                         HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n,
                         BLOCK_K=block_k, PRECISION=precision, num_warps=warps,
                         num_stages=stages)
    return out.view(*lead, N)
