"""`PackedLinear`: a Linear layer whose weight stays in memory as a checkpoint stores it
(gpt-oss's MXFP4 experts, `mxfp4.Mxfp4Linear`; block-quantized FP8 matrices,
`fp8.Fp8Linear`) and is dequantized for each product, so a model takes the bytes of its
files rather than of its float weights, at the cost of a dequantization per product.

Its output is the product with the dequantized matrix: what the model whose weights were
dequantized on load computes (`_laid_out` says where the sums' order may differ). Its
weight is a buffer, not a parameter: it does not train; gradients pass through it to its
input and bias (`_PackedProduct`), the weight dequantized again in the backward rather than
kept. Models that hold packed layers cannot be saved or fine-tuned (`refuse_packed`).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

from .layers import product


def _laid_out(w: Tensor) -> Tensor:
    """w (out, in) in float32 or float64 in the memory `GPT.lay_out_weights` gives a Linear's
    weight, so that the product sums in the dequantized model's order (a CPU's float32
    matrix-vector product sums in another order over the other memory); a 16-bit w as it
    is: the copy would be a third of a decode step's time, and the 16-bit products measured
    sum alike over either memory (docs/models.md#gpt-oss)."""
    if w.dtype.itemsize <= 2 or w.shape[0] < w.shape[1]:
        return w
    return w.t().contiguous().t()


class PackedLinear(nn.Module):
    """x (..., in) -> x @ W.T + bias (..., out), W (out, in) dequantized from the layer's
    packed buffers to x's dtype for the product (and dropped after it). Subclasses hold the
    bytes and say how to read them: `weight_in(dtype)`, `packed_bytes()`, `kind`."""

    kind = ""  # the format's name: "MXFP4", "FP8"
    holds = "matrices"  # what a model's packed layers are, in a word or two ("expert matrices")
    #: what `attnlab info` calls them in a size's name ("bfloat16 + FP8 matrices")
    label = "matrices"

    def __init__(self, in_features: int, out_features: int, bias: bool,
                 device: torch.device | str | None, dtype: torch.dtype | None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bias = (nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype))
                     if bias else None)

    def weight_in(self, dtype: torch.dtype) -> Tensor:
        """The dequantized weight (out, in) in `dtype`, a new tensor."""
        raise NotImplementedError

    def weight_for_product(self, dtype: torch.dtype) -> Tensor:
        """`weight_in`, where a subclass may reuse memory it keeps (the product is done with
        it before the next call)."""
        return self.weight_in(dtype)

    def packed_bytes(self) -> int:
        """The bytes the packed weight takes (meta tensors count too)."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        bias = self.bias
        if torch.is_grad_enabled() and (x.requires_grad or (bias is not None
                                                            and bias.requires_grad)):
            # autograd would keep each product's dequantized weight until the backward: the
            # whole model's matrices again, unpacked; this dequantizes it again there instead
            return cast(Tensor, _PackedProduct.apply(x, self, bias))
        return _packed_product(x, self, bias)  # (..., out)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, weight={self.kind}")


def _packed_product(x: Tensor, layer: PackedLinear, bias: Tensor | None) -> Tensor:
    """x (..., in) @ W.T + bias (..., out), W dequantized for it."""
    return product(x, _laid_out(layer.weight_for_product(x.dtype)), bias)  # (..., out)


class _PackedProduct(torch.autograd.Function):
    """x @ W.T + bias with W packed: the backward dequantizes W again rather than keeping
    it (W itself, bytes, gets no gradient)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, layer: PackedLinear, bias: Tensor | None) -> Tensor:
        ctx.layer = layer
        return _packed_product(x, layer, bias)  # (..., out)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, Tensor | None]:
        grad_x = grad @ ctx.layer.weight_for_product(grad.dtype) \
            if ctx.needs_input_grad[0] else None  # (..., in)
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0) if ctx.needs_input_grad[2] \
            else None  # (out,)
        return grad_x, None, grad_bias


def weight_of(linear: nn.Module, dtype: torch.dtype) -> Tensor:
    """A Linear layer's weight (out, in): a packed layer's dequantized in `dtype`, another's
    own (for code that reads a matrix rather than multiplying by it)."""
    return linear.weight_in(dtype) if isinstance(linear, PackedLinear) else cast(
        Tensor, linear.weight)


def packed_layers(model: nn.Module) -> list[PackedLinear]:
    return [m for m in model.modules() if isinstance(m, PackedLinear)]


def packed_size(model: nn.Module) -> tuple[int, int]:
    """(weights, bytes) of `model`'s packed layers: the weights they stand for, and the bytes
    they take (meta tensors count too)."""
    packed = packed_layers(model)
    return (sum(m.in_features * m.out_features for m in packed),
            sum(m.packed_bytes() for m in packed))


def refuse_packed(model: nn.Module | None, what: str) -> None:
    """ValueError where `model` holds packed layers, which `what` ("save_hf", "training")
    cannot take: they hold bytes, not float weights. None passes."""
    packed = [] if model is None else packed_layers(model)
    if packed:
        raise ValueError(
            f"{what}: this model holds {len(packed)} matrices packed as {packed[0].kind} "
            "(loaded with packed=True, or packed because the dequantized model did not fit in "
            "memory), which it cannot take; load it with packed=False where its float "
            "weights fit")
