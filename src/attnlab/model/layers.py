"""Building blocks of the modern decoder family: the CPU-tuned Linear, norms, MLPs, soft caps.

Each is one `GPTConfig` switch (see `config.py`): `norm` picks LayerNorm, RMSNorm, Gemma's
RMSNorm or none; `mlp` the GELU MLP or a gated one (SwiGLU, GeGLU). The math follows Hugging
Face transformers so imported weights give its numbers. This module owns the layers (rotary
embeddings are `rope.py`'s); wiring them into blocks is `block.py`'s and `gpt.py`'s,
attention is `attention.py`'s.

Shapes use `attention.py`'s vocabulary (B, T, C, nh, hs).
"""

from __future__ import annotations

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
NORMS = ("layernorm", "rmsnorm", "gemma_rmsnorm", "olmo_rmsnorm", "unit_rmsnorm", "unit_layernorm",
         "none")
MLPS = ("gelu", "relu", "relu2", "swiglu", "geglu", "clamped_swiglu", "none")
GATED = ("swiglu", "geglu", "clamped_swiglu")  # the MLP kinds with a gate projection
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

    def forward(self, x: Tensor) -> Tensor:
        return product(x, self.weight, self.bias)  # (..., out)

    def activated(self, x: Tensor, act: str, approximate: str) -> Tensor:
        """act(self(x)) (..., out), act "gelu" (F.gelu with `approximate`) or "relu": one
        oneDNN call, the activation applied as each block of the product is written, where
        `forward` runs oneDNN and no hook watches this layer (a hook sees the product before
        the activation). One pass over the output instead of two
        (docs/performance.md#linear-kernel)."""
        if act in ("gelu", "relu") and _onednn(x, self.weight) and not _hooked(self):
            return torch.ops.mkldnn._linear_pointwise(
                x, self.weight, self.bias, act, [], approximate if act == "gelu" else "")
        return activation(act, approximate)(self(x))  # (..., out)


def product(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """x (..., in) @ w.T + b (..., out), w (out, in): `Linear`'s product, whose kernel
    depends on w's memory as well as its values (a packed layer lays out its dequantized
    weight as `GPT.lay_out_weights` would, for the same product bit for bit)."""
    if _onednn(x, w):
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    if tf32x3.wanted(x, w, x.numel() // max(1, w.shape[1])):
        return tf32x3.linear(x, w, b)  # (..., out)
    return F.linear(x, w, b)  # (..., out)


def _onednn(x: Tensor, w: Tensor) -> bool:
    """Whether x @ w.T (w (out, in)) runs oneDNN's kernel (`Linear`'s docstring)."""
    return (x.dtype == w.dtype == torch.float32 and x.device.type == "cpu"
            and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))
            and x.numel() * w.shape[0] >= runtime.ONEDNN_MIN_MACS
            and runtime.linear_kernel() == "onednn"
            and (w.is_contiguous() or w.t().is_contiguous())
            and not torch.is_autocast_enabled("cpu")
            and not torch.jit.is_tracing() and not torch.compiler.is_compiling())


def _hooked(module: nn.Module) -> bool:
    """Whether a forward hook (the module's own or a global one) would see a call."""
    hooks = nn.modules.module
    return bool(module._forward_hooks or module._forward_pre_hooks
                or hooks._global_forward_hooks or hooks._global_forward_pre_hooks)


# ----------------------------------------------------------------------------- branches


class KeepsFloat32(nn.Module):
    """A module some of whose tensors stay float32 whatever dtype the model is cast to
    (`float32_names`, dotted names within it): a mixture's float32 router and correction
    bias, which transformers keeps float32 too (`moe.MoE`), FP8 scales (`fp8.Fp8Linear`).
    They move with the model; `materialize` allocates them float32 (`kept_float32`)."""

    def float32_names(self) -> tuple[str, ...]:
        return ()

    def _apply(self, fn: Any, recurse: bool = True) -> KeepsFloat32:
        kept = {name: self._tensor(name).data for name in self.float32_names()}
        super()._apply(fn, recurse)
        for name, before in kept.items():
            moved = self._tensor(name)
            if moved.is_floating_point() and moved.dtype != torch.float32:
                moved.data = before.to(moved.device, torch.float32)
        return self

    def _tensor(self, name: str) -> Tensor:
        owner, _, attr = name.rpartition(".")
        return getattr(self.get_submodule(owner) if owner else self, attr)


def kept_float32(model: nn.Module) -> set[str]:
    """The state-dict names of `model`'s tensors that stay float32 (`KeepsFloat32`)."""
    return {f"{prefix}.{name}" if prefix else name
            for prefix, module in model.named_modules() if isinstance(module, KeepsFloat32)
            for name in module.float32_names()}


def branch_scaled(out: Tensor, scale: float) -> Tensor:
    """A block branch's output (..., C) as the residual adds it: times `scale` (Granite's
    residual_multiplier); `out` itself at 1.0. The block, the decode step and
    `interp.lens.residual_parts` all scale through it."""
    return out if scale == 1.0 else out * scale


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


def sink_softmax(scores: Tensor, sinks: Tensor | None, dtype: torch.dtype | None = None
                 ) -> Tensor:
    """Softmax over the keys of scores (B, heads, rows, keys) with one more logit per head,
    sinks (heads,), in each row: the sink takes weight and is dropped, so a row's weights sum
    to less than 1 (gpt-oss's learned attention sinks). transformers' steps: the sink as one
    more column, the row's max subtracted in the scores' dtype, softmax (in `dtype`, None:
    the scores'), the column dropped. A row masked everywhere gives the sink all its weight:
    zeros, never NaN. sinks None: a plain softmax."""
    if sinks is None:
        return torch.softmax(scores, dim=-1, dtype=dtype)  # (B, heads, rows, keys)
    sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    combined = torch.cat([scores, sink], dim=-1)  # (B, heads, rows, keys + 1)
    combined = combined - combined.amax(dim=-1, keepdim=True)  # (B, heads, rows, keys + 1)
    return torch.softmax(combined, dim=-1, dtype=dtype)[..., :-1]  # (B, heads, rows, keys)


# ----------------------------------------------------------------------------- norms


def rms_norm(x: Tensor, weight: Tensor | None, eps: float, wide_scale: bool = False) -> Tensor:
    """x (..., C) -> x / sqrt(mean(x^2) + eps) * weight, computed in float32 (a float64
    model's in float64) and cast back before the weight multiplies (Llama's and Qwen's
    order), or after it with `wide_scale` (OLMo 2's): the same in float32, not in 16 bits."""
    x32 = x.to(runtime.wide(x.dtype))
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # (..., C)
    if weight is not None and wide_scale:
        return (weight * y).to(x.dtype)  # the weight promoted to y's float32
    y = y.to(x.dtype)
    return y if weight is None else weight * y


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale (no bias, no mean subtraction); with
    `wide_scale` the scale multiplies before the cast back (`rms_norm`; norm="olmo_rmsnorm");
    without `scaled`, no scale at all (norm="unit_rmsnorm": nanochat's)."""

    def __init__(self, dim: int, eps: float = 1e-5, wide_scale: bool = False,
                 scaled: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim)) if scaled else None
        self.dim, self.eps = dim, eps
        self.wide_scale = wide_scale

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps, self.wide_scale)  # (..., C)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}" + (", wide_scale=True" if self.wide_scale else "") + (
            "" if self.weight is not None else ", scaled=False")


def gemma_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x (..., C) -> x / sqrt(mean(x^2) + eps) * (1 + weight), all in float32 (a float64
    model's in float64), cast back at the end: Gemma's order, which differs from
    `rms_norm`'s in 16 bits. The stored weight is Gemma's, zero for the identity."""
    wide = runtime.wide(x.dtype)
    x32 = x.to(wide)
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # (..., C)
    return (y * (1.0 + weight.to(wide))).to(x.dtype)


class UnitLayerNorm(nn.Module):
    """LayerNorm without a learned scale or bias, computed in float32 (a float64 model's in
    float64) and cast back (norm="unit_layernorm": OLMo 1's OlmoLayerNorm)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x: Tensor) -> Tensor:
        return unit_layer_norm(x, self.eps)  # (..., C)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


def unit_layer_norm(x: Tensor, eps: float) -> Tensor:
    """x (..., C) -> (x - mean) / sqrt(var + eps), in float32 (float64's in float64), cast
    back once (OLMo 1's rounding)."""
    return F.layer_norm(x.to(runtime.wide(x.dtype)), x.shape[-1:], None, None, eps).to(x.dtype)


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


def heads_layer_norm(x: Tensor, weight: Tensor, eps: float, steps: str = "cohere") -> Tensor:
    """x (B, n, T, hs) -> each head's vector LayerNormed over hs and scaled by that head's
    weight row (weight (n, hs)), rounded as `steps` says: "cohere", in float32 (a float64
    model's in float64) and cast back at the end (CohereLayerNorm over a (heads, head_dim)
    shape); "stablelm", torch's LayerNorm head by head in x's dtype (StableLM's
    StableLmLayerNormPerHead)."""
    if steps == "stablelm":
        return torch.cat([F.layer_norm(x[:, h:h + 1], x.shape[-1:], weight[h], None, eps)
                          for h in range(x.shape[1])], dim=1)  # (B, n, T, hs)
    wide = runtime.wide(x.dtype)
    x32 = x.to(wide)
    centred = x32 - x32.mean(-1, keepdim=True)  # (B, n, T, hs)
    y = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.to(wide)[:, None] * y).to(x.dtype)  # (n, 1, hs) * (B, n, T, hs)


class HeadsLayerNorm(nn.Module):
    """A LayerNorm without bias on each head's q or k with a weight row per head, weight
    (n, hs), rounded as `steps` says (`heads_layer_norm`): Command R+'s and StableLM-2-12B's
    QK-norm (`GPTConfig.qk_norm_heads`)."""

    def __init__(self, n_head: int, head_size: int, eps: float = 1e-5,
                 steps: str = "cohere") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n_head, head_size))
        self.eps, self.steps = eps, steps

    def forward(self, x: Tensor) -> Tensor:
        return heads_layer_norm(x, self.weight, self.eps, self.steps)  # (B, n, T, hs)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, steps={self.steps!r}"


def make_norm(kind: str, dim: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """GPTConfig.norm -> the module: LayerNorm (bias if `bias`), RMSNorm (OLMo's scaling in
    float32), Gemma's RMSNorm, or Identity."""
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps, bias=bias)
    if kind in ("rmsnorm", "olmo_rmsnorm", "unit_rmsnorm"):
        return RMSNorm(dim, eps, wide_scale=kind == "olmo_rmsnorm", scaled=kind != "unit_rmsnorm")
    if kind == "gemma_rmsnorm":
        return GemmaRMSNorm(dim, eps)
    if kind == "unit_layernorm":
        return UnitLayerNorm(dim, eps)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"norm={kind!r} must be one of {list(NORMS)}")


# ----------------------------------------------------------------------------- MLPs


def relu_squared(x: Tensor) -> Tensor:
    """relu(x) squared (Primer's; Arcee's MLP): transformers' two steps."""
    return torch.square(F.relu(x))


def activation(name: str, approximate: str) -> Any:
    """The function an MLP applies: "silu" (SwiGLU's gate), "relu" (OPT), "relu2" (relu
    squared: Arcee) or "gelu" (with F.gelu's `approximate`: GPT-2's MLP, GeGLU's gate)."""
    if name == "silu":
        return F.silu
    if name == "relu":
        return F.relu
    if name == "relu2":
        return relu_squared
    return partial(F.gelu, approximate=approximate)  # a partial pickles, a lambda would not


def glu(gate: Tensor, up: Tensor, act: Any, clamp: tuple[float, float] | None = None) -> Tensor:
    """A gated MLP's hidden activations from its gate's and up projection's outputs (both
    (..., d_ff)): act(gate) * up, or with clamp = (alpha, limit) gpt-oss's clamped SwiGLU,
    g * sigmoid(alpha * g) * (u + 1) with g = gate capped at limit and u = up clamped to
    +-limit (transformers' order of operations)."""
    if clamp is None:
        return act(gate) * up  # (..., d_ff)
    alpha, limit = clamp
    g = gate.clamp(max=limit)  # (..., d_ff)
    return (up.clamp(-limit, limit) + 1) * (g * torch.sigmoid(g * alpha))  # (..., d_ff)


class MLP(nn.Module):
    """GELU: proj(gelu(fc(x))), or with act="relu" proj(relu(fc(x))) (OPT), act="relu2"
    proj(relu(fc(x))^2) (Arcee). Gated
    (gated=True): proj(act(gate(x)) * fc(x)), act SiLU (SwiGLU, gate_act="silu") or GELU
    (GeGLU, gate_act="gelu": Gemma); with clamp = (alpha, limit) gpt-oss's clamped SwiGLU
    (`glu`).

    fc is the up projection (the only input projection of the GELU form), gate the gate
    projection (Llama's gate_proj), proj the down projection; all (C <-> d_ff).
    """

    def __init__(
        self, n_embd: int, d_ff: int, *, gated: bool = False, gelu: str = "tanh",
        bias: bool = True, dropout: float = 0.0, gate_act: str = "silu", act: str = "gelu",
        clamp: tuple[float, float] | None = None,
    ) -> None:
        super().__init__()
        self.fc = Linear(n_embd, d_ff, bias=bias)
        self.gate = Linear(n_embd, d_ff, bias=bias) if gated else None
        self.proj = Linear(d_ff, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.approximate = GELUS[gelu]
        self.act = act  # the ungated form's: fused into fc's product where it can be
        self.up_act = activation(act, self.approximate)
        self.gate_act = activation(gate_act, self.approximate)
        self.clamp = clamp  # gpt-oss's (alpha, limit); None: act(gate) * up

    def forward(self, x: Tensor, trace: Any = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); `trace` (a layer's seam, `model/trace.py`) records the
        pre-activations as "mlp_pre" and the hidden activations as "mlp_hidden", and may
        replace them (an edit)."""
        # the fused GELU never holds the pre-activations: a seam that may read or edit them
        # takes the product and its activation apart
        apart = trace is not None and trace.may_see("mlp_pre")
        if self.gate is None and isinstance(self.fc, Linear) and not apart:
            h = self.fc.activated(x, self.act, self.approximate)  # (B, T, d_ff)
        else:  # fc replaced by another module, pre-activations wanted, or gated
            pre = (self.fc if self.gate is None else self.gate)(x)  # (B, T, d_ff)
            if trace is not None:
                pre = trace.record("mlp_pre", pre)
            h = (self.up_act(pre) if self.gate is None
                 else glu(pre, self.fc(x), self.gate_act, self.clamp))  # (B, T, d_ff)
        if trace is not None:
            h = trace.record("mlp_hidden", h)
        return self.dropout(self.proj(h))  # (B, T, C)


# ----------------------------------------------------------------------------- positions


def embedding_scale(n_embd: int, like: Tensor) -> Tensor:
    """sqrt(n_embd) rounded to the dtype of `like`, on its device (a 0-dim tensor, which
    torch.compile keeps as a constant): the factor Gemma multiplies its token embeddings by
    (in bfloat16 sqrt(2048) = 45.2548... is 45.25)."""
    return torch.tensor(n_embd ** 0.5, dtype=like.dtype, device=like.device)
