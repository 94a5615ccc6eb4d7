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
#: Whether a linear layer keeps its weight split (`split`, twice the weight's memory, made
#: at its first product and again after the weight changes) instead of splitting it in
#: every block of every product.
SPLIT_ONCE = True
#: Whether a trace's scores and context run as 3xTF32 too (else only the linear layers).
ATTENTION = True
#: Products of fewer rows (M) stay with torch.
MIN_ROWS = 64
#: Device types the kernel runs on (the tests add "cpu" under Triton's interpreter).
DEVICES = {"cuda"}


def wanted(a: Tensor, b: Tensor, rows: int, attention: bool = False) -> bool:
    """Whether a (.., M, K) @ b, with M = rows, runs as 3xTF32 (the module's docstring);
    attention: a trace's scores or context (`ATTENTION`)."""
    return (ENABLED and rows >= MIN_ROWS and (ATTENTION or not attention)
            and a.dtype == b.dtype == torch.float32 and a.device.type in DEVICES
            and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled(a.device.type)
            and torch.get_float32_matmul_precision() == "highest"
            and not torch.jit.is_tracing() and not torch.compiler.is_compiling()
            # a kernel's first launch compiles it: not inside a CUDA graph's capture
            and not (a.is_cuda and torch.cuda.is_current_stream_capturing())
            and runtime.triton_importable())


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, config: Config | None = None,
           parts: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """F.linear(x, weight, bias): x (..., K), weight (N, K), bias (N,) or None -> (..., N);
    config: the kernel's tiles (`tf32x3_triton.CONFIGS`' form), None for its rule's; parts:
    the weight split once (`split(weight)`), read as it is instead of split in each block."""
    from . import tf32x3_triton as kernels  # triton: imported only here

    *lead, K = x.shape
    x2 = x.reshape(1, -1, K)  # (1, M, K)
    if parts is None:
        out = kernels.matmul(x2, weight.t().unsqueeze(0), 1.0, bias, config)  # (1, M, N)
    else:
        hi, lo = (part.t().unsqueeze(0) for part in parts)  # (1, K, N) each
        out = kernels.matmul(x2, hi, 1.0, bias, config, rest=lo)  # (1, M, N)
    return out.view(*lead, weight.shape[0])


def kept_parts(module: torch.nn.Module, weight: Tensor) -> tuple[Tensor, Tensor] | None:
    """weight's `split`, kept on module (outside its state dict) while the weight's memory
    and version stay the same (an edit in place, `load_state_dict` or `.to` makes it
    again); None where `SPLIT_ONCE` is off. An inference tensor has no version to check:
    its split is made for each call."""
    if not SPLIT_ONCE:
        return None
    weight = weight.detach()
    if weight.is_inference():
        return split(weight)
    key = (weight.data_ptr(), weight._version)
    kept = module.__dict__.get("_tf32x3_parts")
    if kept is None or kept[0] != key:
        kept = module.__dict__["_tf32x3_parts"] = (key, split(weight))
    return kept[1]


def split(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight's TF32 part and its TF32 rest (weight - part, rounded to TF32), each at
    weight's strides: what `linear` reads to skip splitting the weight in every block. Their
    sum is the weight within about 2^-22 of each entry."""
    hi = _tf32(weight)
    return hi, _tf32(weight - hi)


def _tf32(x: Tensor) -> Tensor:
    """x rounded to TF32 (its top 19 bits, to nearest, ties away from zero), x's strides."""
    return ((x.view(torch.int32) + 0x1000) & -0x2000).view(torch.float32)


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
    return out.view(*lead, M, N)
