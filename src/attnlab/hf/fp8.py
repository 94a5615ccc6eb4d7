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
The model is an unquantized one in its dtype, which the fit check counts, and computes in
that dtype, not with FP8 kernels (activations unquantized, as transformers' dequantized
model computes); or, where that would not fit, the matrices the files store as they are
stay FP8 in memory (`kept`: `model.fp8.Fp8Linear`), the same function at half the bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ..model.fp8 import SCALE_SUFFIX, check_fp8, dequantize_fp8
from ..model.tensorfile import WeightFiles
from .derived import DerivedFiles

FP8 = "fp8"
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


def fp8_pairs(files: WeightFiles, block: tuple[int, int]) -> dict[str, tuple[str, str]]:
    """{NAME: (NAME, NAME_scale_inv)} for each FP8 matrix of `files`, its scale grid checked
    from the headers, before any reading; ValueError naming the first that does not fit."""
    meta = files.meta()
    pairs = {name: (name, name + SCALE_SUFFIX) for name in files
             if name + SCALE_SUFFIX in files and meta[name].dtype == torch.float8_e4m3fn}
    for weight, scale in pairs.values():
        try:
            check_fp8(meta[weight], meta[scale], block)
        except ValueError as err:
            raise ValueError(f"{files.describe(weight)}: {err}") from None
    return pairs


class Fp8Files(DerivedFiles):
    """A directory's weight files (`WeightFiles`) with each FP8 pair, NAME and
    NAME_scale_inv, shown as the one float32 tensor NAME, dequantized when it is read
    (`DerivedFiles`); but the pairs of `kept` (names of the files), shown as they are
    stored, NAME's e4m3 bytes as uint8 (an `Fp8Linear`'s buffers: `model.fp8`)."""

    kind = "FP8"

    def __init__(self, files: WeightFiles, block: tuple[int, int],
                 kept: frozenset[str] = frozenset()) -> None:
        meta = files.meta()
        pairs = {name: pair for name, pair in fp8_pairs(files, block).items()
                 if name not in kept}
        super().__init__(files, pairs, {name: tuple(meta[name].shape) for name in pairs},
                         torch.float32)
        self.block, self.kept = block, kept
        for name in kept:
            self._meta[name] = torch.empty(meta[name].shape, dtype=torch.uint8, device="meta")
        #: what `attnlab info` says of them
        self.note = (f"{len(pairs) + len(kept)} matrices are stored as FP8 (e4m3, "
                     f"{block[0]} x {block[1]} blocks): a load dequantizes each as it is read, "
                     "into the dtype asked for, or keeps them FP8 in memory (the '+ FP8 "
                     "matrices' sizes) where the dequantized model would not fit")

    def decode(self, name: str) -> Tensor:
        weight, scale = self.derived[name]
        return dequantize_fp8(self.files[weight], self.files[scale], self.block)

    def __getitem__(self, name: str) -> Tensor:
        if name in self.kept:
            return self.files[name].view(torch.uint8)  # (out, in), the bytes as stored
        return super().__getitem__(name)
