"""MXFP4 dequantization of OpenAI gpt-oss's expert weights as its Hugging Face files store
them (`model.layers.{i}.mlp.experts.gate_up_proj_blocks` / `_scales`, `down_proj_blocks` /
`_scales`, all uint8), into the plain float tensors transformers holds after loading.

The format (OCP Microscaling, MXFP4): each weight is a 4-bit FP4 E2M1 code (sign bit, two
exponent bits, one mantissa bit: the values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
negatives, -0.0 included), two codes a byte with the low nibble first; 32 consecutive codes
(16 bytes) form a block that shares one E8M0 scale byte s, so a weight is
`fp4 * 2**(s - 127)`.

Exactness: every output is the E2M1 value times a power of two, 2**-127 to 2**127, so
its significand has at most two bits: float32, float64 and bfloat16 (float32's exponent
range, subnormals down to 2**-133) hold each one exactly, unless it exceeds their largest
finite value (~2**128), which only scale bytes 253 (codes +-4, +-6) and 254 (+-2 and up)
can reach. The product is formed in float32 and converted once, as transformers'
`convert_moe_packed_tensors` does, so the two agree bit for bit (tests/hf/test_mxfp4.py).
Those dtypes are the only ones accepted: float16 would round or flush most of the range.

Overflow: where transformers returns +-inf, this refuses, naming the block; a released
checkpoint's scales sit far below (its weights are small), so an overflow means a damaged
or misread file.

Scale byte 255 is NaN in E8M0. transformers passes it through as 2**128 (its `ldexp`),
turning the block into +-inf, and NaN where the code is zero, which is neither the
format's NaN nor a usable weight; a released checkpoint has none, so a 255 here means a
damaged or misread file and is refused by name instead.

Layout (read from transformers 5's integrations/mxfp4.py and models/gpt_oss): the files
store an expert matrix row-major in its output features, blocks (E, out, G, 16) and
scales (E, out, G) with G * 32 = in. `convert_moe_packed_tensors` dequantizes that to
(E, out, in) and itself transposes it to (E, in, out) before returning; the loader
(`Mxfp4Dequantize`) puts that result into the parameter as is, with no further transpose.
So transformers' `GptOssExperts.gate_up_proj` is (E, hidden, 2 * intermediate) (stored
blocks (E, 2 * intermediate, hidden / 32, 16); gate and up interleaved along the last dim,
gate at even columns, up at odd) and `down_proj` is (E, intermediate, hidden) (stored
(E, hidden, intermediate / 32, 16)); its forward computes `x @ gate_up_proj[e]`.
`expert_weight` returns that (E, in, out) layout; `dequantize` the untransposed one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from torch import Tensor

from ..model.tensorfile import WeightFiles

# E2M1 code -> value: bit 3 is the sign, so codes 8..15 are 0..7 negated (8 is -0.0)
_FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

BLOCK_BYTES = 16  # bytes a block: 32 FP4 codes
BLOCK_VALUES = 2 * BLOCK_BYTES
NAN_SCALE = 255  # E8M0's only NaN; refused (module docstring)
# the dtypes that hold every finite output exactly (module docstring)
EXACT_DTYPES = (torch.bfloat16, torch.float32, torch.float64)

# Rows (blocks) dequantized at once: one chunk's scratch (uint8 and int64 codes, float32
# values, a finiteness mask) takes ~14 bytes a weight, so 2**18 rows (8.4M weights) bound
# it at ~120 MB whatever the tensor's size (a gpt-oss-20b layer's gate_up is 16.6M rows);
# tests lower it to exercise the chunking.
_ROWS_PER_CHUNK = 1 << 18


def _check(blocks: Tensor, scales: Tensor, dtype: torch.dtype) -> None:
    """Refuse what `dequantize` cannot read exactly, naming the bad value and the fix."""
    for name, t in (("blocks", blocks), ("scales", scales)):
        if t.dtype != torch.uint8:
            raise TypeError(
                f"MXFP4 {name} must be uint8 (the bytes as the checkpoint stores them), got "
                f"{t.dtype}; pass the file's *_{name} tensor as loaded, without casting it")
    if blocks.dim() < 2 or blocks.shape[-1] != BLOCK_BYTES:
        raise ValueError(
            f"MXFP4 blocks must have shape (*prefix, G, {BLOCK_BYTES}) ({BLOCK_BYTES} bytes "
            f"= {BLOCK_VALUES} FP4 values a block), got {tuple(blocks.shape)}; reshape the "
            f"packed bytes so the last dim holds one block")
    if scales.shape != blocks.shape[:-1]:
        raise ValueError(
            f"MXFP4 scales must have the blocks' shape without its last dim, "
            f"{tuple(blocks.shape[:-1])} (one scale byte a block), got "
            f"{tuple(scales.shape)}; pair each *_blocks tensor with its own *_scales")
    if scales.device != blocks.device:
        raise ValueError(f"MXFP4 blocks are on {blocks.device} but scales on {scales.device}; "
                         f"move both to one device")
    if dtype not in EXACT_DTYPES:
        raise TypeError(
            f"MXFP4 dequantizes exactly only to {', '.join(map(str, EXACT_DTYPES))}, got "
            f"{dtype}; dequantize to torch.bfloat16 and cast the result if you must")
    nan = scales == NAN_SCALE
    if bool(nan.any()):
        first = tuple(int(i) for i in nan.nonzero()[0])
        raise ValueError(
            f"MXFP4 scale byte {NAN_SCALE} (NaN in E8M0) in {int(nan.sum())} block(s), the "
            f"first at scales index {first}; a released checkpoint has none, so the file is "
            f"damaged or these are not the tensor's scales")


def _refuse_overflow(values: Tensor, scales: Tensor, r0: int) -> None:
    """Raise for the first non-finite value of a chunk: values (n, 32) float32, whose rows
    are blocks r0.. of the flattened scales."""
    bad = (~torch.isfinite(values)).any(dim=-1)  # (n,)
    if bool(bad.any()):
        row = r0 + int(bad.nonzero()[0, 0])
        where = tuple(int(i) for i in torch.unravel_index(torch.tensor(row), scales.shape))
        raise ValueError(
            f"MXFP4 block at scales index {where} (scale byte {int(scales[where])}) has a "
            f"value beyond float32's and bfloat16's range (~2**128); a released checkpoint "
            f"has none, so the file is damaged or these are not the tensor's scales")


def dequantize(blocks: Tensor, scales: Tensor, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """blocks (*prefix, G, 16) uint8 and scales (*prefix, G) uint8 -> (*prefix, G * 32) in
    dtype, on blocks' device: value j of block g is byte j // 2's low nibble (j even) or
    high nibble (j odd) read as FP4 E2M1, times 2**(scales[..., g] - 127).

    Exact, and bit for bit transformers' values (module docstring); no transpose (for
    transformers' gpt-oss layout see `expert_weight`). Works in chunks of
    `_ROWS_PER_CHUNK` blocks so the scratch stays bounded on a full expert tensor.
    Raises TypeError for non-uint8 inputs or a dtype other than bfloat16 / float32 /
    float64, ValueError for mismatched shapes, scales on another device, a scale byte of
    255 (E8M0 NaN), or a value that overflows (scale bytes 253 and 254 only).
    """
    _check(blocks, scales, dtype)
    *prefix, groups, _ = blocks.shape
    device = blocks.device
    fp4 = torch.tensor(_FP4_VALUES, dtype=torch.float32, device=device)  # (16,)
    # 2**(s - 127) for every byte s < 255: Python floats, exact, and all float32 (2**-127 a
    # subnormal); a table avoids trusting exp2/ldexp's rounding
    powers = torch.tensor([2.0 ** (s - 127) for s in range(NAN_SCALE)],
                          dtype=torch.float32, device=device)  # (255,)
    flat_blocks = blocks.reshape(-1, BLOCK_BYTES)  # (rows, 16)
    flat_scales = scales.reshape(-1)  # (rows,)
    rows = flat_blocks.shape[0]
    out = torch.empty(rows, BLOCK_VALUES, dtype=dtype, device=device)  # (rows, 32)
    for r0 in range(0, rows, _ROWS_PER_CHUNK):
        r1 = min(r0 + _ROWS_PER_CHUNK, rows)
        chunk = flat_blocks[r0:r1]  # (n, 16)
        # low nibble first: stacking (low, high) on a new last dim and flattening puts
        # byte k's low code at 2k and its high code at 2k + 1
        codes = torch.stack((chunk & 0x0F, chunk >> 4), dim=-1)  # (n, 16, 2)
        values = fp4[codes.reshape(r1 - r0, BLOCK_VALUES).long()]  # (n, 32) float32
        values *= powers[flat_scales[r0:r1].long()].unsqueeze(-1)  # (n, 32) * (n, 1)
        _refuse_overflow(values, scales, r0)
        # the float32 product is exact, and so is its one conversion to dtype
        out[r0:r1] = values
    return out.reshape(*prefix, groups * BLOCK_VALUES)  # (*prefix, G * 32)


def expert_weight(blocks: Tensor, scales: Tensor, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """the (E, in, out) tensor transformers holds as gate_up_proj / down_proj (i.e. the layout
    after transformers' own dequantization on load) from the stored (E, out, G, 16) blocks
    and (E, out, G) scales, with in = G * 32.

    That is `dequantize(blocks, scales, dtype).transpose(1, 2)`, contiguous: transformers'
    `convert_moe_packed_tensors` transposes its (E, out, in) result to (E, in, out) itself
    and loading keeps it, so gate_up_proj is (E, hidden, 2 * intermediate) and down_proj
    (E, intermediate, hidden), used as `x @ w[e]`. Filled one expert at a time, so the peak
    is the result plus one expert's (out, in), not two full copies. Raises as `dequantize`
    does, and ValueError unless blocks are 4-D.
    """
    if blocks.dim() != 4:
        raise ValueError(
            f"MXFP4 expert blocks must be 4-D (E, out, G, {BLOCK_BYTES}) as gpt-oss stores "
            f"*_proj_blocks, got shape {tuple(blocks.shape)}; use dequantize() for "
            f"other layouts")
    _check(blocks, scales, dtype)  # before allocating the result
    experts, rows, groups, _ = blocks.shape
    out = torch.empty(experts, groups * BLOCK_VALUES, rows, dtype=dtype,
                      device=blocks.device)  # (E, in, out)
    for e in range(experts):
        try:
            out[e] = dequantize(blocks[e], scales[e], dtype).T  # (out, in) -> (in, out)
        except ValueError as err:  # an overflow names its index within the expert
            raise ValueError(f"expert {e}: {err}") from err
    return out


class Mxfp4Files(Mapping[str, Tensor]):
    """A directory's weight files (`WeightFiles`) with each MXFP4 pair, NAME_blocks and
    NAME_scales, shown as the one tensor NAME transformers holds: (E, in, out), dequantized
    in bfloat16 (exact: module doc) when it is read. Every other tensor and method is the
    files' own; `largest` counts a dequantized tensor beside the blocks it comes from."""

    def __init__(self, files: WeightFiles) -> None:
        self.files = files
        self.pairs = {name[:-len("_blocks")]: (name, name[:-len("_blocks")] + "_scales")
                      for name in files if name.endswith("_blocks")
                      and name[:-len("_blocks")] + "_scales" in files}
        packed = {name for pair in self.pairs.values() for name in pair}
        self._names = [name for name in files if name not in packed] + list(self.pairs)
        meta = files.meta()
        self._meta = {name: meta[name] for name in self._names if name not in self.pairs}
        for name, (blocks, _) in self.pairs.items():
            E, out, G, _ = meta[blocks].shape  # (E, out, G, 16)
            self._meta[name] = torch.empty(E, G * BLOCK_VALUES, out, dtype=torch.bfloat16,
                                           device="meta")  # (E, in, out)
        self._packed_bytes = {name: meta[blocks].nbytes + meta[scales].nbytes
                              for name, (blocks, scales) in self.pairs.items()}

    def __getitem__(self, name: str) -> Tensor:
        if name in self.pairs:
            blocks, scales = self.pairs[name]
            return expert_weight(self.files[blocks], self.files[scales])  # (E, in, out)
        return self.files[name]

    def __contains__(self, name: object) -> bool:
        return name in self._meta

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def meta(self) -> dict[str, Tensor]:
        return dict(self._meta)

    def describe(self, name: str) -> str:
        if name in self.pairs:
            return f"{self.files.describe(self.pairs[name][0])} (MXFP4, dequantized)"
        return self.files.describe(name)

    def largest(self) -> int:
        dequantized = max((self._meta[name].nbytes + self._packed_bytes[name]
                           for name in self.pairs), default=0)
        return max(self.files.largest(), dequantized)

    def same(self, a: str, b: str) -> bool:
        return self.files.same(a, b)

    def stored(self) -> dict[torch.dtype, int]:
        return self.files.stored()

    def paths(self) -> list[Path]:
        return self.files.paths()

    def forget(self) -> None:
        self.files.forget()
