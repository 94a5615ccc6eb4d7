"""`attnlab.hf.mxfp4`: gpt-oss's MXFP4 expert bytes dequantized exactly. A hand-computed
case; bit-for-bit equality with transformers' `convert_moe_packed_tensors` (and its
(E, in, out) layout); a round trip through a tiny packer written here from the format;
the refusals, each naming the bad value."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.hf.mxfp4 import dequantize, expert_weight
from attnlab.model import mxfp4

# E2M1 magnitudes by code 0..7; codes 8..15 are their negatives (8 is -0.0)
MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
BITS = {torch.bfloat16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}


def _bytes(*values: int) -> list[int]:
    """One 16-byte block: the given bytes, then zeros."""
    return [*values] + [0] * (16 - len(values))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    """a and b equal bit for bit (so -0.0 differs from 0.0, and NaN would be caught)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]))


def _pack(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The test's own MXFP4 packer: values (*prefix, G * 32) float64, each an E2M1 value
    times its block's 2**(scale - 127), and scales (*prefix, G) uint8 -> blocks
    (*prefix, G, 16) uint8, low nibble first. Asserts every value is representable."""
    *prefix, n = values.shape
    blocks = values.reshape(*prefix, n // 32, 32)  # (*prefix, G, 32)
    power = torch.pow(2.0, scales.double() - 127).unsqueeze(-1)  # (*prefix, G, 1), exact
    fp4 = blocks / power  # (*prefix, G, 32): dividing by a power of two is exact
    table = torch.tensor(MAGNITUDES, dtype=torch.float64)
    magnitude = torch.searchsorted(table, fp4.abs())  # (*prefix, G, 32) code 0..7
    assert torch.equal(table[magnitude.clamp(max=7)], fp4.abs()), "not E2M1-representable"
    codes = magnitude + 8 * torch.signbit(fp4).long()  # (*prefix, G, 32), sign in bit 3
    return (codes[..., 0::2] | codes[..., 1::2] << 4).to(torch.uint8)  # (*prefix, G, 16)


def test_hand_computed_bytes() -> None:
    blocks = torch.tensor([
        _bytes(0x72, 0x08, 0xF9, 0x1A),  # 1, 6 | -0, +0 | -0.5, -6 | -1, 0.5
        _bytes(0x7F, 0x53),  # -6, 6 | 1.5, 3, all times 4
        _bytes(0x3B),  # -1.5, 1.5 times 2**-127 (a bfloat16 subnormal)
        _bytes(0x21),  # 0.5, 1 times 2**127: the largest power, no overflow
    ], dtype=torch.uint8)  # (4, 16)
    scales = torch.tensor([127, 129, 0, 254], dtype=torch.uint8)  # (4,)
    tiny, huge = 2.0 ** -127, 2.0 ** 127
    want = torch.tensor([
        [1.0, 6.0, -0.0, 0.0, -0.5, -6.0, -1.0, 0.5] + [0.0] * 24,
        [-24.0, 24.0, 6.0, 12.0] + [0.0] * 28,
        [-1.5 * tiny, 1.5 * tiny] + [0.0] * 30,
        [0.5 * huge, huge] + [0.0] * 30,
    ], dtype=torch.float64).reshape(-1)  # (4 * 32,): no prefix, G = 4
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        got = dequantize(blocks, scales, dtype)
        _same_bits(got, want.to(dtype))  # every one of these is exact in all three
    got = dequantize(blocks, scales)
    assert got.dtype == torch.bfloat16 and got.shape == (128,)
    assert torch.signbit(got[2]) and not torch.signbit(got[3])  # -0.0, then +0.0
    assert got[1].item() == 6.0 and got[5].item() == -6.0  # E2M1's extremes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("low", "high"), [(100, 150), (0, 252)])
@pytest.mark.parametrize("rows_per_chunk", [1 << 18, 7])
def test_matches_transformers_bit_for_bit(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype,
                                          low: int, high: int, rows_per_chunk: int) -> None:
    pytest.importorskip("transformers")
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    monkeypatch.setattr(mxfp4, "_ROWS_PER_CHUNK", rows_per_chunk)  # 7: chunks end mid-row
    gen = torch.Generator().manual_seed(low + high + rows_per_chunk)
    # gpt-oss's gate_up with hidden 96 and intermediate 20: (E, 2 * intermediate, G, 16)
    blocks = torch.randint(0, 256, (3, 40, 3, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(low, high + 1, (3, 40, 3), generator=gen, dtype=torch.uint8)
    theirs = convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=dtype)
    ours = expert_weight(blocks, scales, dtype)
    assert ours.shape == (3, 96, 40)  # (E, in = hidden, out = 2 * intermediate)
    assert ours.is_contiguous()
    _same_bits(ours, theirs)
    # dequantize is the same values before transformers' transpose: (E, out, in)
    _same_bits(dequantize(blocks, scales, dtype), theirs.transpose(1, 2).contiguous())


def test_down_proj_layout() -> None:
    """down_proj is stored (E, hidden, intermediate / 32, 16) and held (E, intermediate,
    hidden): element [e, i, o] is stored row o's value i."""
    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (2, 5, 2, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(120, 135, (2, 5, 2), generator=gen, dtype=torch.uint8)
    held = expert_weight(blocks, scales, torch.float32)  # (E, intermediate 64, hidden 5)
    stored = dequantize(blocks, scales, torch.float32)  # (E, hidden 5, intermediate 64)
    assert held.shape == (2, 64, 5) and stored.shape == (2, 5, 64)
    for e, i, o in [(0, 0, 0), (1, 63, 4), (0, 33, 2), (1, 1, 0)]:
        assert held[e, i, o].item() == stored[e, o, i].item()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), prefix=st.lists(st.integers(1, 3), max_size=3),
       groups=st.integers(1, 4), dtype=st.sampled_from(sorted(BITS, key=str)))
def test_round_trip(seed: int, prefix: list[int], groups: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(seed)
    # random E2M1 values (signed zeros included) times random powers over the whole finite
    # range: 252 is the largest scale at which 6.0 still fits float32 and bfloat16
    codes = torch.randint(0, 16, (*prefix, groups * 32), generator=gen)
    signs = torch.where(codes >= 8, -1.0, 1.0).double()
    fp4 = torch.tensor(MAGNITUDES, dtype=torch.float64)[codes % 8] * signs
    scales = torch.randint(0, 253, (*prefix, groups), generator=gen, dtype=torch.uint8)
    power = torch.pow(2.0, scales.double() - 127).repeat_interleave(32, dim=-1)
    values = fp4 * power  # (*prefix, G * 32) float64, exact
    got = dequantize(_pack(values, scales), scales, dtype)
    assert got.shape == values.shape
    _same_bits(got, values.to(dtype))  # the conversion is exact: nothing rounded
    assert torch.equal(got.double(), values)


def test_refuses_wrong_dtypes() -> None:
    blocks = torch.zeros(2, 16, dtype=torch.uint8)
    scales = torch.full((2,), 127, dtype=torch.uint8)
    with pytest.raises(TypeError, match=r"blocks must be uint8.*torch\.int8.*without casting"):
        dequantize(blocks.to(torch.int8), scales)
    with pytest.raises(TypeError, match=r"scales must be uint8.*torch\.int32"):
        dequantize(blocks, scales.to(torch.int32))
    with pytest.raises(TypeError, match=r"blocks must be uint8.*torch\.float32"):
        expert_weight(blocks.float().reshape(1, 1, 2, 16), scales.reshape(1, 1, 2))
    for dtype in (torch.float16, torch.int32):
        with pytest.raises(TypeError, match=rf"exactly only to .*got {dtype}.*bfloat16"):
            dequantize(blocks, scales, dtype)


def test_refuses_mismatched_shapes() -> None:
    scales = torch.full((3, 2), 127, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"\(\*prefix, G, 16\).*got \(3, 2, 15\)"):
        dequantize(torch.zeros(3, 2, 15, dtype=torch.uint8), scales)
    with pytest.raises(ValueError, match=r"\(\*prefix, G, 16\).*got \(16,\)"):
        dequantize(torch.zeros(16, dtype=torch.uint8), scales)
    blocks = torch.zeros(3, 2, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"\(3, 2\).*got \(2, 3\).*its own \*_scales"):
        dequantize(blocks, scales.reshape(2, 3))
    with pytest.raises(ValueError, match=r"\(3, 2\).*got \(3, 2, 1\)"):
        dequantize(blocks, scales.unsqueeze(-1))
    with pytest.raises(ValueError, match=r"on cpu but scales on meta"):
        dequantize(blocks, torch.empty(3, 2, dtype=torch.uint8, device="meta"))
    with pytest.raises(ValueError, match=r"4-D \(E, out, G, 16\).*\(3, 2, 16\).*dequantize\(\)"):
        expert_weight(blocks, scales)
    with pytest.raises(ValueError, match=r"\(1, 3, 2\).*got \(3, 2\)"):
        expert_weight(blocks.unsqueeze(0), scales)


def test_refuses_nan_scale() -> None:
    blocks = torch.zeros(2, 3, 4, 16, dtype=torch.uint8)
    scales = torch.full((2, 3, 4), 127, dtype=torch.uint8)
    scales[1, 2, 0] = scales[1, 2, 3] = 255
    for call in (dequantize, expert_weight):
        with pytest.raises(ValueError, match=r"255 \(NaN in E8M0\) in 2 block\(s\).*\(1, 2, 0\)"):
            call(blocks, scales)


def test_refuses_overflow() -> None:
    blocks = torch.zeros(2, 3, 1, 16, dtype=torch.uint8)  # (E, out, G, 16)
    scales = torch.full((2, 3, 1), 253, dtype=torch.uint8)
    blocks[..., 0] = 0x45  # 3.0 then 2.0: 3 * 2**126 and 2**127 fit
    assert torch.isfinite(expert_weight(blocks, scales)).all()
    blocks[1, 2, 0, 5] = 0x06  # 4.0 * 2**126 = 2**128 does not
    with pytest.raises(ValueError, match=r"index \(1, 2, 0\) \(scale byte 253\).*~2\*\*128"):
        dequantize(blocks, scales)
    with pytest.raises(ValueError, match=r"expert 1: .*index \(2, 0\) \(scale byte 253\)"):
        expert_weight(blocks, scales)
    scales[1, 2, 0] = 254
    blocks[1, 2, 0, 5] = 0x04  # 2.0 * 2**127 = 2**128 overflows too
    with pytest.raises(ValueError, match=r"index \(1, 2, 0\) \(scale byte 254\)"):
        dequantize(blocks, scales, torch.float64)  # refused for float64 too: one promise
