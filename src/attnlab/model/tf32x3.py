"""Float32 matrix products on a GPU as three TF32 tensor-core products (3xTF32).

An NVIDIA GPU's tensor cores multiply TF32 (float32's exponent, 10 bits of mantissa) several
times faster than its float32 units multiply float32. Splitting each float32 operand into
its TF32 part and the TF32 rest, three TF32 products (hi hi, hi lo, lo hi) leave out only
lo lo, about 2^-22 of the product, near float32's own rounding; one TF32 product (torch's
"high" float32 precision) keeps about 2^-11, too coarse for weights equal to 1e-5.

Where it runs, when `ENABLED`: attnlab's linear layers (`layers.Linear`) and a trace's
scores and context (`traced_attention`), for float32 CUDA tensors under torch.no_grad or
torch.inference_mode (its output has no gradient) and without autocast, with torch's float32
precision at its default "highest" (a user who chose "high" gets cuBLAS's one TF32 product,
the faster), outside torch.compile, torch.jit tracing and CUDA-graph capture, and with at
least `MIN_ROWS` rows (fewer make a product bound by reading its weight, which three
products do not speed up). Everything else runs torch's own product. The kernel
(`tf32x3_triton.py`) needs triton, imported here lazily.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from . import runtime

if TYPE_CHECKING:
    from .tf32x3_triton import Config

#: Whether the products above run as 3xTF32: off until a GPU run measures them faster than
#: cuBLAS's float32 (`benchmarks/gpu_trace.py`, `benchmarks/gpu_gemm.py`); ATTNLAB_TF32X3=1
#: turns it on for a process.
ENABLED = os.environ.get("ATTNLAB_TF32X3", "0") == "1"
#: Products of fewer rows (M) stay with torch.
MIN_ROWS = 64
#: Device types the kernel runs on (the tests add "cpu" under Triton's interpreter).
DEVICES = {"cuda"}


def wanted(a: Tensor, b: Tensor, rows: int) -> bool:
    """Whether a (.., M, K) @ b, with M = rows, runs as 3xTF32 (the module's docstring)."""
    return (ENABLED and rows >= MIN_ROWS
            and a.dtype == b.dtype == torch.float32 and a.device.type in DEVICES
            and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled(a.device.type)
            and torch.get_float32_matmul_precision() == "highest"
            and not torch.jit.is_tracing() and not torch.compiler.is_compiling()
            # a kernel's first launch compiles it: not inside a CUDA graph's capture
            and not (a.is_cuda and torch.cuda.is_current_stream_capturing())
            and runtime.triton_importable())


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, config: Config | None = None
           ) -> Tensor:
    """F.linear(x, weight, bias): x (..., K), weight (N, K), bias (N,) or None -> (..., N);
    config: the kernel's tiles (`tf32x3_triton.CONFIGS`' form), None for its rule's."""
    from . import tf32x3_triton as kernels  # triton: imported only here

    *lead, K = x.shape
    x2 = x.reshape(1, -1, K)  # (1, M, K)
    out = kernels.matmul(x2, weight.t().unsqueeze(0), 1.0, bias, config)  # (1, M, N)
    return out.view(*lead, weight.shape[0])  # (..., N)


def matmul(a: Tensor, b: Tensor, alpha: float = 1.0, diagonal: int | None = None,
           past: str = "-inf") -> Tensor:
    """alpha * (a @ b): a (..., M, K) and b (..., K, N) with the same leading dims ->
    contiguous (..., M, N). diagonal, with past "-inf": -inf where column c > row r +
    diagonal (causal scores; the tiles wholly there are not computed); with past "zero": a
    is 0 there (causal weights; not read)."""
    *lead, M, K = a.shape
    N = b.shape[-1]
    if tuple(b.shape[:-2]) != tuple(lead):
        raise ValueError(f"a {tuple(a.shape)} @ b {tuple(b.shape)}: the leading dims differ")
    from . import tf32x3_triton as kernels  # triton: imported only here

    out = kernels.matmul(a.reshape(-1, M, K), b.reshape(-1, K, N), alpha,
                         diagonal=diagonal, past=past)  # (batch, M, N)
    return out.view(*lead, M, N)  # (..., M, N)
