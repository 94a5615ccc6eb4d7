"""Rotary position embeddings (RoPE) and their scalings, as transformers computes them.

`Rotary` holds one model's float32 inverse frequencies and gives the cos and sin of any
positions; `apply_rotary` turns q and k by them (Hugging Face's rotate-half layout, on the
first `rotary_pct` of each head's dims). `rope_scaling` is Hugging Face's dict: types linear,
llama3, yarn and longrope (Phi-3.5 / Phi-4-mini: two frequency sets, the long one for every
position of a call that reaches past the pretraining length), each in the same float32
operations as transformers so imported weights give its numbers. `check_rope_scaling`
refuses, in one line, a dict the math cannot use (`GPTConfig` and the Hugging Face import
both call it).
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

#: rope_scaling["rope_type"] -> the keys it needs besides rope_type.
ROPE_SCALINGS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}
#: the keys a type may have besides (transformers' `_validate_*_rope_parameters`)
ROPE_OPTIONAL: dict[str, tuple[str, ...]] = {
    "yarn": ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    "longrope": ("attention_factor", "factor"),
}
#: LongRoPE's per-frequency divisors: lists, one number per pair of rotated dims
FACTOR_LISTS = ("short_factor", "long_factor")
#: why transformers' other RoPE types are refused (the evidence: docs/models.md#rope-scaling)
ROPE_REFUSALS = {
    "dynamic": "it rescales RoPE only past max_position_embeddings, where attnlab does not "
               "run and transformers' numbers depend on its earlier calls (up to there it "
               "equals 'default': use that)",
}


def real_positions(attention_mask: Tensor, T: int) -> Tensor:
    """(B, S) 1/0 mask -> (B, T): the position of each of the last T tokens among the real
    tokens of its row (cumsum - 1): a left pad gets 0, a pad after real tokens the last real
    token's position (pads are masked as keys, so their positions change no real token)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]


def scaling_kind(rope_scaling: Mapping[str, Any] | None) -> Any:
    """A rope_scaling's type: `rope_type`, or the older `type`; None for no scaling."""
    if rope_scaling is None:
        return None
    return rope_scaling.get("rope_type", rope_scaling.get("type"))


def check_rope_scaling(rope_scaling: Mapping[str, Any] | None, where: str = "rope_scaling",
                       theta: float | None = None, rotary_dims: int | None = None) -> None:
    """Refuse, in one line naming the field and value, a rope_scaling attnlab cannot honour:
    an unknown type, a missing key, or a value the scaling math cannot use (a factor of 0
    divides by zero; a string cannot divide at all; yarn divides by log(theta), so theta 1;
    longrope's factor lists need one number per pair of the `rotary_dims` rotated dims).
    `where` names the dict in messages ("llama config.json has rope_scaling")."""
    if rope_scaling is None:
        return
    if not isinstance(rope_scaling, Mapping):
        raise ValueError(
            f"{where}={rope_scaling!r} must be a dict with a 'rope_type' key, or None"
        )
    kind = scaling_kind(rope_scaling)
    if not isinstance(kind, str) or kind not in ROPE_SCALINGS:
        why = f": {ROPE_REFUSALS[kind]}" if isinstance(kind, str) and kind in ROPE_REFUSALS else ""
        raise ValueError(
            f"{where} rope_type={kind!r} is not supported{why}; supported types: "
            f"{sorted(ROPE_SCALINGS)} (None for no scaling)"
        )
    missing = [key for key in ROPE_SCALINGS[kind] if key not in rope_scaling]
    if missing:
        raise ValueError(f"{where} of rope_type={kind!r} lacks {missing}; add them")
    for key in ROPE_SCALINGS[kind]:
        value = rope_scaling[key]
        if key in FACTOR_LISTS:
            _check_factor_list(value, f"{where}.{key}", rotary_dims)
            continue
        whole = key == "original_max_position_embeddings"
        if not _positive(value, whole):
            raise ValueError(f"{where}.{key}={value!r}: expected "
                             f"{'a positive integer' if whole else 'a finite number > 0'}")
    if kind == "llama3" and rope_scaling["high_freq_factor"] <= rope_scaling["low_freq_factor"]:
        # the blend between the bands divides by their difference
        raise ValueError(f"{where}.high_freq_factor={rope_scaling['high_freq_factor']!r}: "
                         "expected more than low_freq_factor="
                         f"{rope_scaling['low_freq_factor']!r} (Llama 3.1: 4.0 and 1.0)")
    if kind == "yarn":
        _check_yarn(rope_scaling, where)
        if theta == 1:
            raise ValueError(f"{where} rope_type 'yarn' with rope_theta={theta!r}: its "
                             "frequency ramp divides by log(rope_theta); use the model's base "
                             "(e.g. 10000.0)")
    if kind == "longrope":
        _check_longrope(rope_scaling, where)


def _check_factor_list(value: object, name: str, rotary_dims: int | None) -> None:
    """A LongRoPE factor list: finite numbers > 0 (each divides a frequency), as many as the
    head has pairs of rotated dims."""
    if not isinstance(value, list | tuple) or not value or \
            not all(_positive(v, False) for v in value):
        raise ValueError(f"{name}={reprlib.repr(value)}: expected a list of finite numbers > 0, "
                         "one per pair of rotated dims")
    if rotary_dims is not None and len(value) != rotary_dims // 2:
        raise ValueError(f"{name} has {len(value)} numbers; a head rotating {rotary_dims} dims "
                         f"needs {rotary_dims // 2}, one per pair (head_dim x "
                         "partial_rotary_factor / 2)")


def _check_longrope(rope_scaling: Mapping[str, Any], where: str) -> None:
    """longrope's factor and attention_factor: each absent, null or a finite number > 0, and
    one of them given (the attention factor comes from either)."""
    for key in ROPE_OPTIONAL["longrope"]:
        value = rope_scaling.get(key)
        if value is not None and not _positive(value, False):
            raise ValueError(f"{where}.{key}={value!r}: expected a finite number > 0")
    factor = rope_scaling.get("factor")
    if rope_scaling.get("attention_factor") is None:
        if factor is None:
            raise ValueError(f"{where} of rope_type 'longrope' needs factor (max_position_"
                             "embeddings / original_max_position_embeddings; Phi-3.5-mini: "
                             "32.0) or attention_factor; add one")
        if factor > 1 and rope_scaling["original_max_position_embeddings"] == 1:
            raise ValueError(f"{where} of rope_type 'longrope' has original_max_position_"
                             "embeddings=1: its attention factor divides by ln(1); give "
                             "attention_factor or the pretraining length")


def _check_yarn(rope_scaling: Mapping[str, Any], where: str) -> None:
    """yarn's optional keys, each absent or null (transformers' default) or a value its math
    can use: attention_factor > 0 (0 would zero every rotated q and k); beta_fast, beta_slow,
    mscale, mscale_all_dim >= 0 (transformers reads 0 as unset; a negative beta takes the
    log of a negative number); truncate a boolean (transformers tests it for truth)."""
    for key in ROPE_OPTIONAL["yarn"]:
        value = rope_scaling.get(key)
        if key == "truncate":
            if key in rope_scaling and not isinstance(value, bool):
                raise ValueError(f"{where}.truncate={value!r}: expected true or false")
        elif key == "attention_factor":
            if value is not None and not _positive(value, False):
                raise ValueError(f"{where}.{key}={value!r}: expected a finite number > 0")
        elif value is not None and not (_positive(value, False) or
                                        (type(value) in (int, float) and value == 0)):
            raise ValueError(f"{where}.{key}={value!r}: expected a finite number >= 0 (0 or "
                             "null: transformers' default)")


def _positive(value: object, whole: bool) -> bool:
    """A number > 0 (finite; an int if `whole`), not a bool or a string."""
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
        return False
    return 0 < value < math.inf


def rope_inv_freq(
    rotary_dims: int, theta: float = 10000.0, rope_scaling: Mapping[str, Any] | None = None
) -> Tensor:
    """(rd / 2,) float32 inverse frequencies theta^(-2i / rd), scaled as transformers does
    (`_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`,
    `_compute_yarn_parameters`; longrope's short set, `Rotary` keeps the long one). On the
    CPU, whatever the default device (a model built on the meta device still gets real
    values)."""
    if rotary_dims < 2 or rotary_dims % 2:
        raise ValueError(f"rotary dims={rotary_dims} must be a positive even number")
    check_rope_scaling(rope_scaling, theta=theta, rotary_dims=rotary_dims)
    exponents = torch.arange(0, rotary_dims, 2, dtype=torch.int64, device="cpu").float()
    inv_freq = 1.0 / (theta ** (exponents / rotary_dims))  # (rd/2,)
    if rope_scaling is None:
        return inv_freq
    kind = scaling_kind(rope_scaling)
    if kind == "linear":
        return inv_freq / rope_scaling["factor"]
    if kind == "llama3":
        # frequency bands: keep high frequencies, divide low ones by factor, blend between
        factor = rope_scaling["factor"]
        low, high = rope_scaling["low_freq_factor"], rope_scaling["high_freq_factor"]
        old_len = rope_scaling["original_max_position_embeddings"]
        low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq  # (rd/2,)
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)  # (rd/2,)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(medium, smoothed, scaled)
    if kind == "yarn":
        return _yarn_inv_freq(rotary_dims, theta, rope_scaling)
    if kind == "longrope":
        return longrope_inv_freq(rotary_dims, theta, rope_scaling["short_factor"])
    return inv_freq  # "default"


def longrope_inv_freq(dim: int, theta: float, factors: Sequence[float]) -> Tensor:
    """(rd / 2,) LongRoPE frequencies (arXiv 2402.13753): each default frequency divided by
    its own factor, in `_compute_longrope_parameters`' operations (the product before the
    reciprocal) so the float32 roundings agree."""
    ext = torch.tensor(list(factors), dtype=torch.float32, device="cpu")  # (rd/2,)
    shape = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim  # (rd/2,)
    return 1.0 / (ext * theta**shape)


def _yarn_inv_freq(dim: int, theta: float, rope_scaling: Mapping[str, Any]) -> Tensor:
    """YaRN (arXiv 2309.00071) as transformers' `_compute_yarn_parameters` computes it, in
    the same operations so the float32 roundings agree: dims that turn fewer than beta_slow
    times over original_max_position_embeddings are interpolated (divided by factor), those
    that turn more than beta_fast times kept, and a linear ramp blends the dims between."""
    factor, old_len = rope_scaling["factor"], rope_scaling["original_max_position_embeddings"]
    beta_fast = rope_scaling.get("beta_fast") or 32  # transformers' defaults, for 0 too
    beta_slow = rope_scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:  # the dim that turns `rotations` times
        return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rope_scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against dividing by zero
    ramp = (torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)
    extrapolated = 1 - torch.clamp(ramp, 0, 1)  # (rd/2,) 1: keep, 0: interpolate
    pos_freqs = theta ** (torch.arange(0, dim, 2, device="cpu").float() / dim)  # (rd/2,)
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolated) + (1.0 / pos_freqs) * extrapolated


def rope_attention_factor(rope_scaling: Mapping[str, Any] | None) -> float:
    """What transformers multiplies cos and sin by (its rotary classes' `attention_scaling`),
    so every rotated q and k: 1.0 but for yarn and longrope, whose attention_factor is given
    or derived from factor: yarn's from mscale / mscale_all_dim too when both are set
    (`_compute_yarn_parameters`), longrope's sqrt(1 + ln factor / ln original length)
    (`_compute_longrope_parameters`)."""
    check_rope_scaling(rope_scaling)
    kind = scaling_kind(rope_scaling)
    if rope_scaling is None or kind not in ("yarn", "longrope"):
        return 1.0
    given = rope_scaling.get("attention_factor")
    if given is not None:
        return float(given)
    factor = rope_scaling["factor"]
    if kind == "longrope":
        old_len = rope_scaling["original_max_position_embeddings"]
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old_len))
    mscale, mscale_all_dim = rope_scaling.get("mscale"), rope_scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(_mscale(factor, mscale) / _mscale(factor, mscale_all_dim))
    return _mscale(factor)


def _mscale(scale: float, mscale: float = 1) -> float:
    """YaRN's attention temperature for a context `scale` times longer (transformers'
    `get_mscale`, the same expression)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


class Rotary:
    """RoPE for one model: inverse frequencies (float32, computed once, on the CPU) and the
    cos/sin of any positions, computed from them on the fly (no block_size-sized table).

    A plain object, not a module: it holds no parameters or state-dict entries, and its
    float32 frequencies stay float32 when the model is cast to bfloat16.

    LongRoPE has two sets: a call whose positions all lie within the pretraining length
    (`switch`, original_max_position_embeddings) takes the short one, a call reaching past
    it the long one for every position, as transformers' `longrope_frequency_update` picks
    by the call's largest position. A generation crossing it encodes the whole sequence
    again (`generate`), as Phi-3's `prepare_inputs_for_generation` does.
    """

    def __init__(
        self, head_size: int, rotary_pct: float = 1.0, theta: float = 10000.0,
        rope_scaling: Mapping[str, Any] | None = None, interleaved: bool = False,
        backwards: bool = False,
    ) -> None:
        self.dims = int(head_size * rotary_pct)  # rd
        self.interleaved = interleaved  # cos and sin laid out for adjacent pairs (GPT-J)
        self.backwards = backwards  # sin negated: each pair turned by minus its angle
        self.inv_freq = rope_inv_freq(self.dims, theta, rope_scaling)  # (rd/2,)
        self.switch: int | None = None  # longrope: how many positions the short set covers
        self.long_inv_freq: Tensor | None = None  # (rd/2,) longrope's long set
        if rope_scaling is not None and scaling_kind(rope_scaling) == "longrope":
            self.switch = rope_scaling["original_max_position_embeddings"]
            self.long_inv_freq = longrope_inv_freq(self.dims, theta, rope_scaling["long_factor"])
        for freqs in (self.inv_freq, self.long_inv_freq):
            if freqs is not None and not torch.isfinite(freqs).all():
                raise ValueError(f"RoPE with rope_theta={theta!r} and rope_scaling="
                                 f"{reprlib.repr(rope_scaling)} gives infinite or NaN "
                                 "frequencies; use the model's base (e.g. 10000.0) and scaling")
        # cos and sin are multiplied by it, as transformers does: yarn's and longrope's
        self.attention_factor = rope_attention_factor(rope_scaling)
        if not self.attention_factor <= torch.finfo(torch.float32).max:  # sin 0 * inf: NaN
            raise ValueError(f"rope_scaling attention factor {self.attention_factor!r} is "
                             "past float32's range; the models that set it use 1 to 2")
        # the sets per device, copied once: a host-to-device copy in every forward could not
        # be captured in a CUDA graph (compiled decode, the graphed training step)
        self._on: dict[torch.device, tuple[Tensor, Tensor | None]] = {}

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions (B or 1, T) -> cos, sin (B or 1, 1, T, rd) in float32, broadcasting over
        heads: Hugging Face's `cat((freqs, freqs))` layout (`interleaved`: each frequency twice
        in a row, GPT-J's `repeat_interleave`), sin negated where `backwards` (nanochat's
        rotate_half turns the other way), times the attention factor. Every
        path that rotates q and k (explicit, fused, traced, the decode step, the compiled
        decode) takes them from here."""
        sets = self._on.get(positions.device)
        if sets is None:
            long = None if self.long_inv_freq is None else self.long_inv_freq.to(positions.device)
            sets = self._on[positions.device] = (self.inv_freq.to(positions.device), long)
        inv_freq, long = sets
        if long is not None and self.switch is not None:
            # a tensor condition: no device sync, and a CUDA graph replays the choice
            inv_freq = torch.where(positions.max() + 1 > self.switch, long, inv_freq)  # (rd/2,)
        freqs = positions[:, None, :, None].float() * inv_freq  # (B, 1, T, rd/2)
        emb = freqs.repeat_interleave(2, dim=-1) if self.interleaved else torch.cat(
            (freqs, freqs), dim=-1)  # (B, 1, T, rd)
        cos, sin = emb.cos(), emb.sin()  # (B, 1, T, rd) each
        if self.backwards:  # nanochat's turn: exact, a sign flipped
            sin = sin.neg_()
        if self.attention_factor == 1.0:  # skip two multiplications by 1
            return cos, sin
        return cos * self.attention_factor, sin * self.attention_factor


Rope = tuple[Tensor, Tensor]  # cos, sin (B|1, 1, T, rd)


def layer_ropes(rotary: Rotary | None, local: Rotary | None,
                positions: Tensor) -> dict[bool, Rope | None]:
    """{windowed: cos, sin (B|1, 1, T, rd) each, or None without RoPE} at `positions`
    (B|1, T): the sliding-window layers' under True (`local`'s where there is one, Gemma 3),
    the others' under False."""
    rope = None if rotary is None else rotary.cos_sin(positions)
    return {False: rope, True: rope if local is None else local.cos_sin(positions)}


def nope_temperatures(positions: Tensor, scale: float, floor: int) -> Tensor:
    """positions (B|1, T) -> (B|1, 1, T, 1) float32: the factor of a NoPE layer's q at each,
    1 + scale * log(1 + floor((p + 1) / floor)) (`GPTConfig.nope_temperature`, Llama 4's
    attn_temperature_tuning; transformers counts p by the slot, padding included)."""
    steps = torch.floor((positions.float() + 1.0) / floor)  # (B|1, T)
    return (torch.log1p(steps) * scale + 1.0)[:, None, :, None]  # (B|1, 1, T, 1)


def rotate_half(x: Tensor) -> Tensor:
    """(..., d) -> (..., d): [x1, x2] -> [-x2, x1], the halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_pairs(x: Tensor) -> Tensor:
    """(..., d) -> (..., d): each adjacent pair (a, b) -> (-b, a) (GPT-J's rotate_every_two)."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, wide: bool = False,
                 pairs: bool = False, rounded: bool = False) -> Tensor:
    """Rotate the first rd = cos.shape[-1] dims of x (B, heads, T, hs) by cos/sin (B or 1, 1,
    T, rd); the other hs - rd dims pass through. cos/sin are cast to x's dtype first, as
    Hugging Face's Llama does, or with `wide` x's rotated dims are rotated in float32 and
    cast back, as its OLMo does (`GPTConfig.rope_in_float32`), with `rounded` by cos/sin
    rounded to x's dtype first, as its Cohere does (`rope_tables_rounded`). `pairs`: the dims
    turn in adjacent pairs, cos/sin in `Rotary`'s interleaved layout (`rope_interleaved`)."""
    rd = cos.shape[-1]
    turn = rotate_pairs if pairs else rotate_half
    if wide and x.dtype in (torch.bfloat16, torch.float16):
        if rounded:  # (B or 1, 1, T, rd) float32 again, holding x's dtype's values
            cos, sin = cos.to(x.dtype).float(), sin.to(x.dtype).float()
        rot = x[..., :rd]  # (B, heads, T, rd): times float32 cos and sin, in float32
        turned = (rot * cos + turn(rot) * sin).to(x.dtype)  # (B, heads, T, rd)
        return turned if rd == x.shape[-1] else torch.cat((turned, x[..., rd:]), dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if rd == x.shape[-1]:
        return x * cos + turn(x) * sin  # (B, heads, T, hs)
    rot, passed = x[..., :rd], x[..., rd:]  # (B, heads, T, rd), (B, heads, T, hs - rd)
    return torch.cat((rot * cos + turn(rot) * sin, passed), dim=-1)  # (B, heads, T, hs)
