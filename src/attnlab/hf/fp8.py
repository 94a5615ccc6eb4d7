"""Block-quantized FP8 checkpoints read as float weights: `quantization_config` {"quant_method":
"fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}, the
format of DeepSeek-V3 / R1's releases and of Qwen3's "-FP8" ones.

Such files store a matrix NAME as float8_e4m3fn beside NAME_scale_inv, float32 (ceil(out /
bm), ceil(in / bn)): one scale for each bm x bn block. `Fp8Files` shows each pair as the one
float32 tensor NAME, dequantized when it is read (`dequantize_fp8`: each value times its
block's scale, one float32 product), which the model's fill then rounds once to the dtype
asked for: transformers' `Fp8Dequantize` (`FineGrainedFP8Config(dequantize=True)`), the same
product and the same rounding. Where a dimension is no multiple of the block the last block
is partial, as DeepSeek's own `weight_dequant` has it (transformers refuses such a shape).
Nothing stays FP8 in memory: the model is an unquantized one in its dtype, which the fit
check counts, and it computes in that dtype, not with FP8 kernels (activations unquantized,
as transformers' dequantized model computes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ..model.tensorfile import WeightFiles
from .derived import DerivedFiles

FP8 = "fp8"
SCALE_SUFFIX = "_scale_inv"
E4M3_MAX = 448.0  # float8_e4m3fn's largest finite value
_KEYS = {"quant_method", "fmt", "weight_block_size", "activation_scheme",
         "modules_to_not_convert", "dequantize"}


def fp8_block(config: Any) -> tuple[int, int]:
    """The (rows, columns) block of an FP8 `quantization_config`; ValueError naming the part
    attnlab cannot honour and why."""
    if not isinstance(config, Mapping) or config.get("quant_method") != FP8:
        raise ValueError(f"quantization_config={config!r} is not an FP8 one (quant_method "
                         f"{FP8!r})")
    unknown = sorted(set(config) - _KEYS)
    if unknown:
        raise ValueError(f"quantization_config.{unknown[0]}={config[unknown[0]]!r}: attnlab "
                         "does not know this FP8 field, so it cannot vouch for the weights")
    if config.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"quantization_config.fmt={config['fmt']!r}: attnlab reads FP8 "
                         "weights stored as e4m3 (float8_e4m3fn)")
    if config.get("activation_scheme", "dynamic") != "dynamic":
        raise ValueError(f"quantization_config.activation_scheme="
                         f"{config['activation_scheme']!r}: attnlab reads weights quantized "
                         "with dynamic activations (no stored activation scales)")
    block = config.get("weight_block_size")
    if (not isinstance(block, list | tuple) or len(block) != 2 or any(
            isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in block)):
        raise ValueError(f"quantization_config.weight_block_size={block!r}: attnlab reads "
                         "per-block scales, two positive integers (DeepSeek-V3's [128, 128])")
    return block[0], block[1]


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


class Fp8Files(DerivedFiles):
    """A directory's weight files (`WeightFiles`) with each FP8 pair, NAME and
    NAME_scale_inv, shown as the one float32 tensor NAME, dequantized when it is read
    (`DerivedFiles`)."""

    kind = "FP8"

    def __init__(self, files: WeightFiles, block: tuple[int, int]) -> None:
        meta = files.meta()
        pairs = {name: (name, name + SCALE_SUFFIX) for name in files
                 if name + SCALE_SUFFIX in files and meta[name].dtype == torch.float8_e4m3fn}
        for weight, scale in pairs.values():  # from the headers, before any reading
            try:
                check_fp8(meta[weight], meta[scale], block)
            except ValueError as err:
                raise ValueError(f"{files.describe(weight)}: {err}") from None
        super().__init__(files, pairs, {name: tuple(meta[name].shape) for name in pairs},
                         torch.float32)
        self.block = block
        #: what `attnlab info` says of them
        self.note = (f"{len(pairs)} matrices are stored as FP8 (e4m3, {block[0]} x {block[1]} "
                     "blocks): a load dequantizes each as it is read, into the dtype asked "
                     "for, and computes in that dtype")

    def decode(self, name: str) -> Tensor:
        weight, scale = self.derived[name]
        return dequantize_fp8(self.files[weight], self.files[scale], self.block)
