"""The tensors a `DecodeStep` computes with, as plain tuples rather than modules: an affine
map cut into one block per torch thread (`Affine`), its float16 copy packed for fbgemm's
kernel (`Packed16`), and a norm (`StepNorm`). `decode.py` reads a `GPT`'s weights into
them once and wires them as `Block` does.
"""

from __future__ import annotations

from typing import NamedTuple, cast

import torch
from torch import Tensor, nn

from .layers import (
    GemmaRMSNorm,
    HeadsLayerNorm,
    RMSNorm,
    UnitLayerNorm,
    gemma_rms_norm,
    heads_layer_norm,
    rms_norm,
    unit_layer_norm,
)
from .packed import PackedLinear


class Affine(NamedTuple):
    """x (B, in) -> x @ weight + bias (B, out), for the one-token decode step."""

    weight: Tensor  # (in, out), over (in, out) or (out, in) memory: GPT.lay_out_weights
    bias: Tensor | None  # (out,)

    @classmethod
    def stack(cls, *linears: nn.Linear, into: Affine | None = None) -> Affine:
        """Linear layers fed the same input as one: their (in, out) weights side by side and
        biases end to end. One layer's own tensors when there is one (in either memory order:
        BLAS reads both), else a copy: into the tensors of `into`, a stack of the same
        layers, when given."""
        weights = [lin.weight.detach().t() for lin in linears]  # (in, out) each
        biases = [lin.bias.detach() for lin in linears if lin.bias is not None]
        if len(weights) == 1:
            weight = weights[0]
            if not (weight.is_contiguous() or weight.t().is_contiguous()):
                weight = weight.contiguous()
            return cls(weight, biases[0] if biases else None)
        weight = torch.cat(weights, dim=1, out=None if into is None else into.weight)
        bias = None if not biases else torch.cat(
            biases, out=None if into is None else into.bias)
        return cls(weight, bias)

    def __call__(self, x: Tensor) -> Tensor:
        w, b = self.weight, self.bias  # (in, out), (out,)
        (n_in, n_out), rows = w.shape, w.is_contiguous()  # rows: over (in, out) memory
        parts = thread_parts(n_in if rows else n_out, w)
        if parts == 1:
            return torch.mm(x, w) if b is None else torch.addmm(b, x, w)  # (B, out)
        # one block of the matrix per thread, a contiguous run of memory each: torch.bmm
        # runs the blocks on parallel threads, where one mm streams on one
        B = x.shape[0]
        if rows:  # blocks of input rows; their partial sums are added
            xs = x.reshape(B, parts, n_in // parts).transpose(0, 1)  # (parts, B, in/parts)
            blocks = w.view(parts, n_in // parts, n_out)  # (in, out) -> (parts, in/parts, out)
            # (parts, B, in/parts) @ (parts, in/parts, out) -> (parts, B, out), summed: (B, out)
            y = torch.bmm(xs, blocks).sum(0)
            return y if b is None else y.add_(b)
        # (out, in) memory: blocks of outputs, each from the whole input
        blocks = w.t().view(parts, n_out // parts, n_in).transpose(1, 2)  # (parts, in, out/parts)
        xs = x.expand(parts, B, n_in)  # (parts, B, in), no copy
        # (parts, B, in) @ (parts, in, out/parts) -> (parts, B, out/parts)
        if b is None:
            y = torch.bmm(xs, blocks)
        else:
            bias = b.view(parts, 1, n_out // parts)  # (out,) -> (parts, 1, out/parts)
            y = torch.baddbmm(bias, xs, blocks)
        return y.transpose(0, 1).reshape(B, n_out)  # (parts, B, out/parts) -> (B, out)


# the fewest weights a thread's block holds: below it, handing out blocks costs more than
# it saves (docs/performance.md#decode-blocks)
SPLIT_MIN = 1 << 17


def thread_parts(side: int, w: Tensor) -> int:
    """Into how many equal blocks along `side` to cut the matrix `w` for the product: one per
    torch thread, each of at least SPLIT_MIN weights; 1: keep it whole. float32 on the CPU
    only (the case measured: docs/performance.md#decode-blocks; bfloat16 products have other
    kernels, GPUs their own threads), and not under torch.compile (`compiled_decode`), whose
    Inductor chooses its own kernels."""
    if w.device.type != "cpu" or w.dtype != torch.float32 or torch.compiler.is_compiling():
        return 1
    parts = min(torch.get_num_threads(), w.numel() // SPLIT_MIN)
    while parts > 1 and side % parts:
        parts -= 1
    return max(parts, 1)


FLOAT16_MAX = 65504.0  # float16's largest finite value


def in_memory_order(w: Tensor) -> Tensor:
    """w, or w.t() where that is contiguous (GPT lays the wide Linear weights out as (in,
    out) memory): whole-tensor ops run several times faster over contiguous memory than
    over the strided view (docs/performance.md#contiguous-memory)."""
    return w.t() if w.dim() == 2 and not w.is_contiguous() and w.t().is_contiguous() else w


def largest_magnitude(w: Tensor) -> float:
    low, high = torch.aminmax(in_memory_order(w))
    return max(-low.item(), high.item())


class Packed16(NamedTuple):
    """x (B, in) -> x @ W + b with W held as float16 in fbgemm's packed layout and the
    products summed in float32: `Affine` over W rounded to float16, reading half the bytes.
    The bias stays float32."""

    packed: torch.ScriptObject  # quantized.linear_prepack_fp16 of W (out, in) and b

    @classmethod
    def of(cls, affine: Affine) -> Packed16:
        w = affine.weight.t()  # (out, in)
        largest = largest_magnitude(w)
        if largest > FLOAT16_MAX:  # fbgemm would clamp it with a warning
            raise ValueError(
                f"a {tuple(w.shape)} matrix holds |w| = {largest:.6g}, beyond float16's "
                f"largest value {FLOAT16_MAX:g}; keep float32 weights for this model"
            )
        return cls(torch.ops.quantized.linear_prepack_fp16(w.contiguous(), affine.bias))

    def __call__(self, x: Tensor) -> Tensor:
        return cast(Tensor, torch.ops.quantized.linear_dynamic_fp16(x, self.packed))  # (B, out)


#: a packed layer (`PackedLinear`) is a matrix as it is: it dequantizes for each product
Matrix = Affine | Packed16 | PackedLinear


def pack(matrix: Matrix | None) -> Matrix | None:
    """`matrix` as `Packed16`; a packed layer stays as it is (already a quarter the size)."""
    if matrix is None or isinstance(matrix, PackedLinear):
        return matrix
    return Packed16.of(cast(Affine, matrix))


class StepNorm(NamedTuple):
    weight: Tensor | None
    bias: Tensor | None
    eps: float
    rms: bool
    gemma: bool = False  # Gemma's RMSNorm: scaled by 1 + weight
    wide: bool = False  # OLMo 2's: scaled before the cast back; OLMo 1's: all in float32
    heads: str | None = None  # a weight row per head, rounded as it says (`HeadsLayerNorm`)

    def __call__(self, x: Tensor) -> Tensor:
        if self.heads is not None:
            return heads_layer_norm(x, cast(Tensor, self.weight), self.eps, self.heads)
        if self.weight is not None and self.weight.shape[-1] != x.shape[-1]:
            # QK-norm over each row's whole q or k (OLMo 2): (B, heads, 1, hs) as (B, heads * hs)
            return self(x.reshape(x.shape[0], -1)).view(x.shape)
        if self.gemma:
            return gemma_rms_norm(x, cast(Tensor, self.weight), self.eps)
        if self.rms:
            return rms_norm(x, self.weight, self.eps, self.wide)
        if self.wide:  # unit_layernorm: no scale, no bias, in float32
            return unit_layer_norm(x, self.eps)
        # torch.layer_norm: F.layer_norm's Python checks cost more than a (B, C) norm here
        return torch.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


def step_norm(module: nn.Module | None) -> StepNorm | None:
    if isinstance(module, HeadsLayerNorm):
        return StepNorm(module.weight.detach(), None, module.eps, False, heads=module.steps)
    if isinstance(module, RMSNorm | GemmaRMSNorm):
        weight = None if module.weight is None else module.weight.detach()  # unit_rmsnorm's
        return StepNorm(weight, None, module.eps, True,
                     isinstance(module, GemmaRMSNorm), getattr(module, "wide_scale", False))
    if isinstance(module, UnitLayerNorm):
        return StepNorm(None, None, module.eps, False, wide=True)
    if not isinstance(module, nn.LayerNorm):
        return None  # nn.Identity (norm="none")
    bias = None if module.bias is None else module.bias.detach()
    return StepNorm(module.weight.detach(), bias, module.eps, False)

