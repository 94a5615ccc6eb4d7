"""Building blocks of the modern decoder family: norms, MLPs and rotary position embeddings.

Each is one `GPTConfig` switch (see `config.py`): `norm` picks LayerNorm, RMSNorm, Gemma's
RMSNorm or none; `mlp` the GELU MLP or a gated one (SwiGLU, GeGLU); `pos == "rope"` rotates
queries and keys by their positions (RoPE, in Hugging Face's rotate-half layout, optionally on
only the first `rotary_pct` of each head's dims, with `rope_scaling` of type linear, llama3 or
yarn). The math follows Hugging Face transformers so imported weights give its numbers. This
module owns the layers; wiring them into blocks is `gpt.py`'s, attention is `attention.py`'s.

Shapes use `attention.py`'s vocabulary (B, T, C, nh, hs); rd = rotary dims per head.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import runtime, tf32x3

#: GPTConfig.gelu -> F.gelu's `approximate`. GPT-2 was trained with the tanh form, so
#: imported weights need it; the exact (erf) form is faster on CPUs, forward and backward
#: (docs/performance.md#gelu), and nanoGPT and Pythia use it.
GELUS = {"tanh": "tanh", "exact": "none"}
NORMS = ("layernorm", "rmsnorm", "gemma_rmsnorm", "none")
MLPS = ("gelu", "swiglu", "geglu", "none")
#: rope_scaling["rope_type"] -> the keys it needs besides rope_type.
ROPE_SCALINGS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}
#: the keys a type may have besides (transformers' `_validate_yarn_rope_parameters`)
ROPE_OPTIONAL: dict[str, tuple[str, ...]] = {
    "yarn": ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
}
#: why transformers' other RoPE types are refused (the evidence: docs/models.md#rope-scaling)
ROPE_REFUSALS = {
    "dynamic": "it rescales RoPE only past max_position_embeddings, where attnlab does not "
               "run and transformers' numbers depend on its earlier calls (up to there it "
               "equals 'default': use that)",
    "longrope": "Phi-3's two frequency sets are not implemented",
}


# ----------------------------------------------------------------------------- linear


class Linear(nn.Linear):
    """`nn.Linear` (the same parameters, state dict and hooks) whose float32 CPU products
    without autograd run the kernel `runtime.linear_kernel()` picks: oneDNN's on the CPUs
    where it is the faster one (docs/performance.md#linear-kernel). Training (autograd),
    autocast, other dtypes and devices, weights that are not one dense matrix ((out, in) or
    (in, out) memory: oneDNN runs its slow reference kernel on others), products under
    `runtime.ONEDNN_MIN_MACS` multiply-adds, and tracing or compiling (torch.jit.trace,
    torch.compile, torch.export: the graph gets aten.linear, which exporters know and
    compilers choose kernels for) run F.linear, as nn.Linear does. On a GPU, float32
    products under no_grad run as three TF32 products where `tf32x3.wanted` says so."""

    def _onednn(self, x: Tensor) -> bool:
        w = self.weight  # (out, in)
        return (x.dtype == w.dtype == torch.float32 and x.device.type == "cpu"
                and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
                and x.numel() * w.shape[0] >= runtime.ONEDNN_MIN_MACS
                and runtime.linear_kernel() == "onednn"
                and (w.is_contiguous() or w.t().is_contiguous())
                and not torch.is_autocast_enabled("cpu")
                and not torch.jit.is_tracing() and not torch.compiler.is_compiling())

    def forward(self, x: Tensor) -> Tensor:
        if self._onednn(x):
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if tf32x3.wanted(x, self.weight, x.numel() // max(1, self.in_features)):
            return tf32x3.linear(x, self.weight, self.bias)  # (..., out)
        return F.linear(x, self.weight, self.bias)  # (..., out)

    def gelu(self, x: Tensor, approximate: str) -> Tensor:
        """F.gelu(self(x), approximate=approximate) (..., out): one oneDNN call, the GELU
        applied as each block of the product is written, where `forward` runs oneDNN and no
        hook watches this layer (a hook sees the product before the GELU). One pass over
        the output instead of two (docs/performance.md#linear-kernel)."""
        if self._onednn(x) and not _hooked(self):
            return torch.ops.mkldnn._linear_pointwise(
                x, self.weight, self.bias, "gelu", [], approximate)  # (..., out)
        return F.gelu(self(x), approximate=approximate)  # (..., out)


def _hooked(module: nn.Module) -> bool:
    """Whether a forward hook (the module's own or a global one) would see a call."""
    hooks = nn.modules.module
    return bool(module._forward_hooks or module._forward_pre_hooks
                or hooks._global_forward_hooks or hooks._global_forward_pre_hooks)


# ----------------------------------------------------------------------------- soft-capping


def soft_cap(x: Tensor, cap: float | None, *, inplace: bool = False) -> Tensor:
    """cap * tanh(x / cap): x squashed smoothly into (-cap, cap), Gemma 2's capping of
    attention scores (`GPTConfig.attn_logit_softcapping`) and of the head's logits
    (`final_logit_softcapping`); x itself when cap is None. Divide, tanh, multiply, in x's
    dtype: transformers' order, so it rounds as transformers does (modeling_gemma2.py).
    -inf comes out -cap, not -inf: cap scores before they are masked. inplace: overwrite x,
    where autograd does not need it (tanh's backward reads its output, which the multiply
    would overwrite)."""
    if cap is None:
        return x
    if inplace and not x.requires_grad:
        return x.div_(cap).tanh_().mul_(cap)
    return torch.tanh(x / cap) * cap


# ----------------------------------------------------------------------------- norms


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """x (..., C) -> x / sqrt(mean(x^2) + eps) * weight, computed in float32 (a float64
    model's in float64) and cast back before the weight multiplies (Llama's and Qwen's
    order)."""
    x32 = x.to(runtime.wide(x.dtype))
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # (..., C)
    y = y.to(x.dtype)
    return y if weight is None else weight * y


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale (no bias, no mean subtraction)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)  # (..., C)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def gemma_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x (..., C) -> x / sqrt(mean(x^2) + eps) * (1 + weight), all in float32 (a float64
    model's in float64), cast back at the end: Gemma's order, which differs from
    `rms_norm`'s in 16 bits. The stored weight is Gemma's, zero for the identity."""
    wide = runtime.wide(x.dtype)
    x32 = x.to(wide)
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # (..., C)
    return (y * (1.0 + weight.to(wide))).to(x.dtype)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: scaled by (1 + weight), the weight starting at zero. Not an
    `RMSNorm` subclass, so code written for RMSNorm's plain scale never takes it for one."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return gemma_rms_norm(x, self.weight, self.eps)  # (..., C)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def make_norm(kind: str, dim: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """GPTConfig.norm -> the module: LayerNorm (bias if `bias`), RMSNorm, Gemma's RMSNorm,
    or Identity."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps)
    if kind == "gemma_rmsnorm":
        return GemmaRMSNorm(dim, eps)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"norm={kind!r} must be one of {list(NORMS)}")


# ----------------------------------------------------------------------------- MLPs


def gate_activation(gate_act: str, approximate: str) -> Any:
    """The function a gated MLP applies to its gate: SiLU (SwiGLU) or GELU (GeGLU, with
    F.gelu's `approximate`)."""
    if gate_act == "silu":
        return F.silu
    return partial(F.gelu, approximate=approximate)  # a partial pickles, a lambda would not


class MLP(nn.Module):
    """GELU: proj(gelu(fc(x))). Gated (gated=True): proj(act(gate(x)) * fc(x)), act SiLU
    (SwiGLU, gate_act="silu") or GELU (GeGLU, gate_act="gelu": Gemma).

    fc is the up projection (the only input projection of the GELU form), gate the gate
    projection (Llama's gate_proj), proj the down projection; all (C <-> d_ff).
    """

    def __init__(
        self, n_embd: int, d_ff: int, *, gated: bool = False, gelu: str = "tanh",
        bias: bool = True, dropout: float = 0.0, gate_act: str = "silu",
    ) -> None:
        super().__init__()
        self.fc = Linear(n_embd, d_ff, bias=bias)
        self.gate = Linear(n_embd, d_ff, bias=bias) if gated else None
        self.proj = Linear(d_ff, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.approximate = GELUS[gelu]
        self.gate_act = gate_activation(gate_act, self.approximate)

    def forward(self, x: Tensor, trace: Any = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); `trace` (a layer's seam, `model/trace.py`) records the
        pre-activations as "mlp_pre" and the hidden activations as "mlp_hidden", and may
        replace them (an edit)."""
        # the fused GELU never holds the pre-activations: a seam that may read or edit them
        # takes the product and its activation apart
        apart = trace is not None and trace.may_see("mlp_pre")
        if self.gate is None and isinstance(self.fc, Linear) and not apart:
            h = self.fc.gelu(x, self.approximate)  # (B, T, d_ff)
        else:  # fc replaced by another module, pre-activations wanted, or gated
            pre = (self.fc if self.gate is None else self.gate)(x)  # (B, T, d_ff)
            if trace is not None:
                pre = trace.record("mlp_pre", pre)
            h = (F.gelu(pre, approximate=self.approximate) if self.gate is None
                 else self.gate_act(pre) * self.fc(x))  # (B, T, d_ff)
        if trace is not None:
            h = trace.record("mlp_hidden", h)
        return self.dropout(self.proj(h))  # (B, T, C)


# ----------------------------------------------------------------------------- positions


def embedding_scale(n_embd: int, like: Tensor) -> Tensor:
    """sqrt(n_embd) rounded to the dtype of `like`, on its device (a 0-dim tensor, which
    torch.compile keeps as a constant): the factor Gemma multiplies its token embeddings by
    (in bfloat16 sqrt(2048) = 45.2548... is 45.25)."""
    return torch.tensor(n_embd ** 0.5, dtype=like.dtype, device=like.device)



def real_positions(attention_mask: Tensor, T: int) -> Tensor:
    """(B, S) 1/0 mask -> (B, T): the position of each of the last T tokens among the real
    tokens of its row (cumsum - 1): a left pad gets 0, a pad after real tokens the last real
    token's position (pads are masked as keys, so their positions change no real token)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]


def check_rope_scaling(rope_scaling: Mapping[str, Any] | None, where: str = "rope_scaling",
                       theta: float | None = None) -> None:
    """Refuse, in one line naming the field and value, a rope_scaling attnlab cannot honour:
    an unknown type, a missing key, or a value the scaling math cannot use (a factor of 0
    divides by zero; a string cannot divide at all; yarn divides by log(theta), so theta 1).
    `where` names the dict in messages ("llama config.json has rope_scaling")."""
    if rope_scaling is None:
        return
    if not isinstance(rope_scaling, Mapping):
        raise ValueError(
            f"{where}={rope_scaling!r} must be a dict with a 'rope_type' key, or None"
        )
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    if kind not in ROPE_SCALINGS:
        why = f": {ROPE_REFUSALS[kind]}" if kind in ROPE_REFUSALS else ""
        raise ValueError(
            f"{where} rope_type={kind!r} is not supported{why}; supported types: "
            f"{sorted(ROPE_SCALINGS)} (None for no scaling)"
        )
    missing = [key for key in ROPE_SCALINGS[kind] if key not in rope_scaling]
    if missing:
        raise ValueError(f"{where} of rope_type={kind!r} lacks {missing}; add them")
    for key in ROPE_SCALINGS[kind]:
        value = rope_scaling[key]
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
    `_compute_yarn_parameters`). On the CPU, whatever the default device (a model built on
    the meta device still gets real values)."""
    if rotary_dims < 2 or rotary_dims % 2:
        raise ValueError(f"rotary dims={rotary_dims} must be a positive even number")
    check_rope_scaling(rope_scaling, theta=theta)
    exponents = torch.arange(0, rotary_dims, 2, dtype=torch.int64, device="cpu").float()
    inv_freq = 1.0 / (theta ** (exponents / rotary_dims))  # (rd/2,)
    if rope_scaling is None:
        return inv_freq
    kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
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
    return inv_freq  # "default"


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
    so every rotated q and k: 1.0 but for yarn, whose attention_factor is given or derived
    from factor (and mscale / mscale_all_dim when both are set), as in
    `_compute_yarn_parameters`."""
    check_rope_scaling(rope_scaling)
    if rope_scaling is None or rope_scaling.get("rope_type",
                                                rope_scaling.get("type")) != "yarn":
        return 1.0
    given = rope_scaling.get("attention_factor")
    if given is not None:
        return float(given)
    factor = rope_scaling["factor"]
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
    """

    def __init__(
        self, head_size: int, rotary_pct: float = 1.0, theta: float = 10000.0,
        rope_scaling: Mapping[str, Any] | None = None,
    ) -> None:
        self.dims = int(head_size * rotary_pct)  # rd
        self.inv_freq = rope_inv_freq(self.dims, theta, rope_scaling)  # (rd/2,)
        # cos and sin are multiplied by it, as transformers does: yarn's attention factor
        self.attention_factor = rope_attention_factor(rope_scaling)
        # inv_freq per device, copied once: a host-to-device copy in every forward could not
        # be captured in a CUDA graph (compiled decode, the graphed training step)
        self._on: dict[torch.device, Tensor] = {}

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions (B or 1, T) -> cos, sin (B or 1, 1, T, rd) in float32, broadcasting over
        heads: Hugging Face's `cat((freqs, freqs))` layout, times the attention factor. Every
        path that rotates q and k (explicit, fused, traced, the decode step, the compiled
        decode) takes them from here."""
        device = positions.device
        inv_freq = self._on.get(device)
        if inv_freq is None:
            inv_freq = self._on[device] = self.inv_freq.to(device)
        freqs = positions[:, None, :, None].float() * inv_freq  # (B, 1, T, rd/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, 1, T, rd)
        if self.attention_factor == 1.0:  # all but yarn: skip two multiplications by 1
            return emb.cos(), emb.sin()
        return emb.cos() * self.attention_factor, emb.sin() * self.attention_factor


Rope = tuple[Tensor, Tensor]  # cos, sin (B|1, 1, T, rd)


def layer_ropes(rotary: Rotary | None, local: Rotary | None,
                positions: Tensor) -> dict[bool, Rope | None]:
    """{windowed: cos, sin (B|1, 1, T, rd) each, or None without RoPE} at `positions`
    (B|1, T): the sliding-window layers' under True (`local`'s where there is one, Gemma 3),
    the others' under False."""
    rope = None if rotary is None else rotary.cos_sin(positions)
    return {False: rope, True: rope if local is None else local.cos_sin(positions)}


def rotate_half(x: Tensor) -> Tensor:
    """(..., d) -> (..., d): [x1, x2] -> [-x2, x1], the halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first rd = cos.shape[-1] dims of x (B, heads, T, hs) by cos/sin (B or 1, 1,
    T, rd); the other hs - rd dims pass through. cos/sin are cast to x's dtype first, as
    Hugging Face does."""
    rd = cos.shape[-1]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if rd == x.shape[-1]:
        return x * cos + rotate_half(x) * sin  # (B, heads, T, hs)
    rot, passed = x[..., :rd], x[..., rd:]  # (B, heads, T, rd), (B, heads, T, hs - rd)
    return torch.cat((rot * cos + rotate_half(rot) * sin, passed), dim=-1)  # (B, heads, T, hs)
