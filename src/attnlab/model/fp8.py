"""Block-quantized FP8 weights: each (out, in) matrix float8_e4m3fn beside float32 scales,
one for each bm x bn block (DeepSeek-V3 / R1's releases, Qwen3's "-FP8" ones; reading the
checkpoints is `hf/fp8.py`'s).

`dequantize_fp8` is each value times its block's scale, one float32 product (transformers'
`Fp8Dequantize`, and DeepSeek's `weight_dequant` where a side is no multiple of the block:
the last block partial); `quantize_fp8` the other way, as DeepSeek's quantizer makes such
files. `Fp8Linear` keeps a matrix so in memory, its e4m3 bytes as a uint8 buffer (a model's
`.to(dtype)` casts floating-point buffers, and would turn them into bfloat16) and its scales
float32, and dequantizes it for each product (`packed.PackedLinear`): the product with the
matrix a load would have dequantized, at half the bytes of bfloat16.
"""

from __future__ import annotations

from collections.abc import Container

import torch
from torch import Tensor, nn

from .layers import KeepsFloat32
from .packed import PackedLinear

E4M3_MAX = 448.0  # float8_e4m3fn's largest finite value
SCALE_SUFFIX = "_scale_inv"  # NAME's scales: NAME_scale_inv


def check_fp8(weight: Tensor, scale: Tensor, block: tuple[int, int]) -> None:
    """ValueError unless weight is (out, in) float8_e4m3fn and scale (ceil(out / bm),
    ceil(in / bn)) floats (meta tensors will do: the check reads no data)."""
    bm, bn = block
    grid = None if weight.dim() != 2 else (-(-weight.shape[0] // bm), -(-weight.shape[1] // bn))
    if (weight.dtype != torch.float8_e4m3fn or tuple(scale.shape) != grid
            or not scale.is_floating_point()):
        raise ValueError(f"an FP8 weight {tuple(weight.shape)} {weight.dtype} with scales "
                         f"{tuple(scale.shape)} {scale.dtype}: {bm} x {bn} blocks need a 2-d "
                         f"float8_e4m3fn weight and {grid} float scales")


def dequantize_fp8(weight: Tensor, scale: Tensor, block: tuple[int, int]) -> Tensor:
    """weight (out, in) float8_e4m3fn and scale (ceil(out / bm), ceil(in / bn)) -> (out, in)
    float32, each value times its block's scale (module doc); ValueError naming the shapes
    that do not fit."""
    check_fp8(weight, scale, block)
    rows, cols = weight.shape
    bm, bn = block
    out = weight.to(torch.float32)  # (out, in)
    per_row = scale.to(torch.float32).repeat_interleave(bm, dim=0)[:rows]  # (out, C)
    full, rest = divmod(cols, bn)
    # one product per value, the scales broadcast over each block's columns in place
    out[:, :full * bn].unflatten(1, (full, bn)).mul_(per_row[:, :full, None])
    if rest:
        out[:, full * bn:].mul_(per_row[:, full:])
    return out


def quantize_fp8(weight: Tensor, block: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """`dequantize_fp8` the other way, as DeepSeek's quantizer makes such files: weight
    (out, in) -> float8_e4m3fn (out, in) and float32 scales (ceil(out / bm), ceil(in / bn)),
    each block scaled so that its largest magnitude is e4m3's largest value, 448 (tests and
    benchmarks write FP8 directories with it)."""
    rows, cols = weight.shape
    bm, bn = block
    grid = (-(-rows // bm), -(-cols // bn))
    padded = weight.new_zeros(grid[0] * bm, grid[1] * bn, dtype=torch.float32)
    padded[:rows, :cols] = weight
    blocks = padded.view(grid[0], bm, grid[1], bn)  # (R, bm, C, bn)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / E4M3_MAX  # (R, C)
    scaled = (blocks / scale[:, None, :, None]).view(grid[0] * bm, grid[1] * bn)
    return scaled[:rows, :cols].to(torch.float8_e4m3fn), scale


class Fp8Linear(KeepsFloat32, PackedLinear):
    """A Linear layer whose weight (out, in) stays FP8 (module doc): buffers `weight` (out,
    in) uint8, the e4m3 bytes, and `weight_scale_inv` (ceil(out / bm), ceil(in / bn))
    float32, as the files name them, and a float `bias` (out,) or None."""

    kind, label = "FP8", "FP8 matrices"

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 block: tuple[int, int] = (128, 128),
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None
                 ) -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self.block = block
        grid = (-(-out_features // block[0]), -(-in_features // block[1]))
        self.weight: Tensor
        self.weight_scale_inv: Tensor
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.uint8,
                                                   device=device))
        self.register_buffer("weight_scale_inv", torch.ones(grid, device=device))

    @classmethod
    def like(cls, linear: nn.Linear, block: tuple[int, int]) -> Fp8Linear:
        """An empty FP8 layer of `linear`'s shape, on its device, its bias's dtype."""
        return cls(linear.in_features, linear.out_features, linear.bias is not None, block,
                   device=linear.weight.device, dtype=linear.weight.dtype)

    def weight_in(self, dtype: torch.dtype) -> Tensor:
        w = dequantize_fp8(self.weight.view(torch.float8_e4m3fn), self.weight_scale_inv,
                           self.block)  # (out, in) float32
        return w.to(dtype)  # rounded once, as a load that dequantizes rounds it

    def packed_bytes(self) -> int:
        return self.weight.nbytes + self.weight_scale_inv.nbytes

    def float32_names(self) -> tuple[str, ...]:
        return ("weight_scale_inv",)  # the scales stay float32 in any model (`KeepsFloat32`)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, block={self.block}"


def pack_fp8(model: nn.Module, names: Container[str], block: tuple[int, int]) -> nn.Module:
    """`model` (a GPT, meta or not) with each Linear whose weight's state-dict name is in
    `names` replaced by an empty `Fp8Linear` of its shape, in place; for a loader to fill
    with a checkpoint's FP8 bytes and scales. Returns the model."""
    for owner_name, owner in list(model.named_modules()):
        for child_name, child in list(owner.named_children()):
            full = f"{owner_name}.{child_name}" if owner_name else child_name
            if isinstance(child, nn.Linear) and f"{full}.weight" in names:
                setattr(owner, child_name, Fp8Linear.like(child, block))
    return model
