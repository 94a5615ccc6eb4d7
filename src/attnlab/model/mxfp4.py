"""MXFP4, the 4-bit format gpt-oss's expert weights are stored in: exact dequantization
(`dequantize`), and `Mxfp4Linear`, a Linear layer that keeps its weight packed and
dequantizes it for each product, so a model whose experts stay packed takes about a quarter
of the memory of its bfloat16 weights (gpt-oss-20b: 13.8 GB instead of 41.8 GB). Reading the
checkpoints' layout is `hf/mxfp4.py`'s.

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

Packed in memory: `Mxfp4Linear` holds a matrix as the files do, blocks (out, G, 16) and
scales (out, G), both uint8 buffers, G * 32 = in, and dequantizes it to the input's dtype
for each product (`unpack`: the same exact values, one table lookup a byte), so its
output is the product with the dequantized matrix (`packed.PackedLinear`: what a model whose
experts were dequantized on load computes; it does not train). The blocks are checked once,
when loaded (`check_packed`), not at each product.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import Tensor, nn

from .packed import PackedLinear

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


def check_inputs(blocks: Tensor, scales: Tensor, dtype: torch.dtype) -> None:
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
    check_inputs(blocks, scales, dtype)
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



# ------------------------------------------------------------------ packed in memory

#: `unpack`'s table in each dtype and device it has used: entry 256 * s + byte holds the
#: byte's two values (low nibble first) times 2**(s - 127), for every scale byte s < 255
_TABLES: dict[tuple[torch.dtype, torch.device], Tensor] = {}
#: scale bytes at which a block may overflow float32 and bfloat16 (module docstring)
RISKY_SCALE = 253
#: a dtype whose two values fit one integer: the table is read one integer an entry
_PAIR_AS = {torch.bfloat16: torch.int32, torch.float32: torch.int64}


def _table(dtype: torch.dtype, device: torch.device) -> Tensor:
    """(255 * 256, 2) in dtype, or as `_PAIR_AS`'s integers (255 * 256,): built in float64
    on the CPU, where every product is exact, and converted once (exact too, but for the
    entries past float32's range, which `check_packed` keeps any block from reaching)."""
    if (dtype, device) not in _TABLES:
        fp4 = torch.tensor(_FP4_VALUES, dtype=torch.float64)  # (16,)
        byte = torch.arange(256)  # (256,)
        pairs = torch.stack((fp4[byte & 0x0F], fp4[byte >> 4]), dim=-1)  # (256, 2)
        powers = torch.tensor([2.0 ** (s - 127) for s in range(NAN_SCALE)],
                              dtype=torch.float64)  # (255,)
        table = (powers[:, None, None] * pairs).reshape(-1, 2).to(dtype)  # (255 * 256, 2)
        if dtype in _PAIR_AS:
            table = table.view(_PAIR_AS[dtype])[:, 0]  # (255 * 256,) one integer an entry
        _TABLES[dtype, device] = table.to(device)
    return _TABLES[dtype, device]


def unpack(blocks: Tensor, scales: Tensor, dtype: torch.dtype, *, scratch: bool = False
           ) -> Tensor:
    """blocks (out, G, 16) and scales (out, G), uint8, checked (`check_packed`) -> the
    matrix (out, G * 32) in dtype: `dequantize`'s values, made faster for a product at a
    time: each byte's two values, already times its block's power of two, read at once from
    a table of every (scale, byte) in dtype (exact in bfloat16, float32 and float64; another
    dtype gets float32's values rounded once, as a dequantized load cast to it does).

    `scratch`: on a CPU, into this thread's scratch memory for that size (`_scratch`),
    overwritten by the next such call: for a product that drops the matrix at once."""
    if dtype not in EXACT_DTYPES:
        return unpack(blocks, scales, torch.float32).to(dtype)
    out, groups, _ = blocks.shape
    table = _table(dtype, blocks.device)
    shift = (scales.int() << 8)[..., None]  # (out, G, 1) int32: 256 * s
    if scratch and blocks.device.type == "cpu":
        index, values = _scratch(table, blocks.numel())
        torch.add(shift, blocks, out=index.view(blocks.shape))  # (out, G, 16): + byte
        torch.index_select(table, 0, index, out=values)  # (out * G * 16,) or (..., 2)
    else:
        values = table.index_select(0, (shift + blocks).reshape(-1))
    return values.view(dtype).view(out, groups * BLOCK_VALUES)  # (out, in)


_SCRATCH = threading.local()


def _scratch(table: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """This thread's index (n,) int32 and values (n, ...) of `table`'s kind for n bytes,
    kept between calls. Why: a fresh 16 MB tensor is fresh pages from the kernel unless
    glibc keeps freed memory (`runtime.reuse_freed_memory`, which the CLI sets and a
    library leaves to its program), and faulting them in took 2 to 4 times the lookup
    itself (docs/performance.md#packed-mxfp4-experts). A thread holds one pair a size and
    dtype: 33 MB for gpt-oss's experts in bfloat16."""
    kept: dict[tuple[torch.dtype, int], tuple[Tensor, Tensor]] = getattr(_SCRATCH, "kept", {})
    _SCRATCH.kept = kept
    key = (table.dtype, n)
    if key not in kept:
        kept[key] = (torch.empty(n, dtype=torch.int32),
                     torch.empty((n, *table.shape[1:]), dtype=table.dtype))
    return kept[key]


def check_packed(blocks: Tensor, scales: Tensor, what: str) -> None:
    """Refuse packed weights `unpack` would turn into NaN or inf, as `dequantize` refuses
    them (a scale byte of 255, a value past float32's range), naming `what` holds them. Only
    blocks with scale bytes >= 253 can overflow: those alone are dequantized to look."""
    try:
        check_inputs(blocks, scales, torch.float32)
        risky = scales >= RISKY_SCALE  # (out, G)
        if bool(risky.any()):
            dequantize(blocks[risky], scales[risky], torch.float32)
    except (TypeError, ValueError) as err:
        raise type(err)(f"{what}: {err}") from None


class Mxfp4Linear(PackedLinear):
    """A Linear layer whose weight (out, in) stays packed as MXFP4 (module docstring):
    buffers `blocks` (out, in / 32, 16) and `scales` (out, in / 32), uint8, and a float
    `bias` (out,) or None; x (..., in) -> x @ W.T + bias (..., out), W dequantized to x's
    dtype for the product (and dropped after it: `packed.PackedLinear`)."""

    kind, holds, label = "MXFP4", "expert matrices", "MXFP4 experts"

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None
                 ) -> None:
        if in_features % BLOCK_VALUES:
            raise ValueError(f"in_features={in_features}: MXFP4 packs a row in blocks of "
                             f"{BLOCK_VALUES} weights, so it must be a multiple of "
                             f"{BLOCK_VALUES}; keep this layer's weight dequantized")
        super().__init__(in_features, out_features, bias, device, dtype)
        groups = in_features // BLOCK_VALUES
        self.blocks: Tensor
        self.scales: Tensor
        self.register_buffer("blocks", torch.zeros(
            out_features, groups, BLOCK_BYTES, dtype=torch.uint8, device=device))
        self.register_buffer("scales", torch.full(
            (out_features, groups), 127, dtype=torch.uint8, device=device))  # 2**0

    @classmethod
    def like(cls, linear: nn.Linear) -> Mxfp4Linear:
        """An empty packed layer of `linear`'s shape, on its device, its bias's dtype."""
        return cls(linear.in_features, linear.out_features, linear.bias is not None,
                   device=linear.weight.device, dtype=linear.weight.dtype)

    def weight_in(self, dtype: torch.dtype) -> Tensor:
        """The dequantized weight (out, in) in `dtype`, a new tensor."""
        return unpack(self.blocks, self.scales, dtype)

    def weight_for_product(self, dtype: torch.dtype) -> Tensor:
        """The dequantized weight in this thread's kept scratch memory (`unpack`)."""
        return unpack(self.blocks, self.scales, dtype, scratch=True)

    def packed_bytes(self) -> int:
        return self.blocks.nbytes + self.scales.nbytes

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any
                              ) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args)
        if self.blocks.device.type != "meta":
            check_packed(self.blocks, self.scales, prefix.rstrip("."))


def pack_experts(model: nn.Module) -> nn.Module:
    """`model` (a GPT, meta or not) with every expert's Linear layers of every mixture
    replaced by empty `Mxfp4Linear`s of the same shapes, in place; for a loader to fill
    with a checkpoint's packed bytes. Returns the model."""
    from .moe import MoE

    for moe in [m for m in model.modules() if isinstance(m, MoE)]:
        for expert in moe.experts:
            for name in ("fc", "gate", "proj"):
                linear = getattr(expert, name)
                if isinstance(linear, nn.Linear):
                    setattr(expert, name, Mxfp4Linear.like(linear))
    return model
