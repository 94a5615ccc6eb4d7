"""The gemm probe's (`gpu_gemm`) second 3xTF32 linear: its weight split once, before the call.

attnlab's own 3xTF32 product (`attnlab.model.tf32x3_triton`) splits both operands in every
block: each float32 operand into a TF32 part and the TF32 rest, a b summed as hi(a) hi(b) +
hi(a) lo(b) + lo(a) hi(b) on TF32 tensor cores. This kernel takes the weight already split
(`split_weight`: as a model would keep it, beside the weight), so only x is split in the
kernel and the weight's tiles reach the tensor cores as they are stored: fewer instructions
per block, twice the weight's memory. Whether that wins is the probe's question. It adds
each step's three products to the running sum on the tensor cores, where Triton's tf32x3
sums a step from zero and adds it in float32: an H100 measured it faster than a kernel
summing as Triton does and 5-11x further from float64 than cuBLAS's float32
(docs/performance-gpu.md#trace-on-a-gpu). This module imports triton at the top: `gpu_gemm`
imports it only where triton is.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from attnlab.model.tf32x3_triton import CONFIGS

#: the tiles the weight-split-once kernel tries (fewer than attnlab's kernel's: each one is
#: another compilation)
SPLIT_CONFIGS = [CONFIGS[0], CONFIGS[2]]


@triton.jit
def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """This program's tile of out: its rows and columns, a block's inner indices, and which
    rows and columns exist."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return rows, cols, tl.arange(0, BLOCK_K), rows < M, cols < N


@triton.jit
def _store(acc, b_ptr, out_ptr, rows, cols, row_ok, col_ok, N, HAS_BIAS: tl.constexpr):
    """acc (BLOCK_M, BLOCK_N) plus the bias into out's tile."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0)[None, :]
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc,
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _tf32(a):
    """a rounded to TF32 (its top 19 bits, to nearest, ties away from zero: cvt.rna's)."""
    bits = a.to(tl.uint32, bitcast=True)
    return ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _split_linear_kernel(x_ptr, hi_ptr, lo_ptr, b_ptr, out_ptr, M, N, K,
                         HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    """out (M, N) = x (M, K) @ (hi + lo)^T + b (N,), all contiguous float32, K a multiple of
    BLOCK_K, with the weight split once, before the call: hi (N, K) its TF32 part, lo (N, K)
    the rest; only x is split here, so the weight's tiles go from memory to the tensor cores
    as they are. The small terms first, as Triton's tf32x3 adds them."""
    rows, cols, inner, row_ok, col_ok = _tile(M, N, BLOCK_M, BLOCK_N, BLOCK_K)
    x = x_ptr + rows[:, None] * K + inner[None, :]  # (BLOCK_M, BLOCK_K) pointers
    at = cols[None, :] * K + inner[:, None]  # (BLOCK_K, BLOCK_N) offsets: w^T's tile
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(x + k, mask=row_ok[:, None], other=0.0)  # (BLOCK_M, BLOCK_K)
        a_hi = _tf32(a)
        w_hi = tl.load(hi_ptr + at + k, mask=col_ok[None, :], other=0.0)  # (BLOCK_K, BLOCK_N)
        w_lo = tl.load(lo_ptr + at + k, mask=col_ok[None, :], other=0.0)
        acc = tl.dot(a - a_hi, w_hi, acc, input_precision="tf32")
        acc = tl.dot(a_hi, w_lo, acc, input_precision="tf32")
        acc = tl.dot(a_hi, w_hi, acc, input_precision="tf32")
    _store(acc, b_ptr, out_ptr, rows, cols, row_ok, col_ok, N, HAS_BIAS)


def split_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(hi, lo) contiguous float32 (N, K), as the kernel reads them, whatever the weight's
    memory (attnlab keeps most over (in, out): `GPT.lay_out_weights`): weight's TF32 part
    (rounded as `_tf32` rounds) and the rest, hi + lo == weight exactly."""
    weight = weight.contiguous()  # (N, K)
    hi = ((weight.view(torch.int32) + 0x1000) & -0x2000).view(torch.float32)  # low 13 bits 0
    return hi, weight - hi


def split_linear(x: Tensor, split: tuple[Tensor, Tensor], bias: Tensor | None,
                 config: tuple[int, int, int, int, int] = CONFIGS[0]) -> Tensor:
    """F.linear(x, hi + lo, bias) for float32 x (..., K), the weight split once
    (`split_weight`), K a multiple of config's BLOCK_K (`CONFIGS`'s form)."""
    return _launch(_split_linear_kernel, x, split, bias, config)


def _launch(kernel: Any, x: Tensor, weights: tuple[Tensor, ...], bias: Tensor | None,
            config: tuple[int, int, int, int, int]) -> Tensor:
    """kernel over x (..., K) and the (N, K) weights at config: (..., N) float32."""
    block_m, block_n, block_k, warps, stages = config
    *lead, K = x.shape
    N = weights[0].shape[0]
    if K % block_k or x.dtype != torch.float32:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype}: needs float32 with K a multiple of "
                         f"{block_k}")
    x2 = x.reshape(-1, K).contiguous()  # (M, K)
    M = x2.shape[0]
    out = x2.new_empty((M, N))  # (M, N)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    kernel[grid](x2, *weights, x2 if bias is None else bias, out, M, N, K,
                 HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                 num_warps=warps, num_stages=stages)
    return out.view(*lead, N)
