"""Gemma2ForCausalLM (gemma-2-2b, Gemma Scope's model): Gemma's scaled embeddings, (1 + w)
RMSNorm and GeGLU, Gemma 3's sandwich norms and weight names, scores scaled by
query_pre_attn_scalar ** -0.5, a sliding window on every other layer (the first, third, ...:
`layer_types`), one RoPE for all layers, and soft caps: cap * tanh(x / cap) on the attention
scores (`attn_logit_softcapping`, 50 where the field is absent) and on the logits
(`final_logit_softcapping`, 30), which send every attention through the explicit path
(docs/models.md#soft-capping).
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .gemma3 import WEIGHTS, layer_types
from .llama import llama_like_config, llama_like_to_hf, out_bias_of, qkv_bias_of
from .registry import Family, misfits_of, window_layers_to_hf

# hub configs carry hidden_act beside hidden_activation, which Gemma 2's MLP reads in
# transformers 5; and ask generate for the sliding-window cache (attnlab has its own)
IRRELEVANT = frozenset({"hidden_act", "cache_implementation"})


def _cap(f: Fields, key: str, default: float) -> float | None:
    """A soft cap: the field's value, null for none, Gemma2Config's default when absent."""
    if key not in f.hf:
        return default
    return None if f.get(key) is None else f.number(key, default)


def _config(f: Fields) -> dict[str, Any]:
    if f.get("use_bidirectional_attention"):
        raise f.refuse("use_bidirectional_attention", True, "attnlab's attention is causal")
    n_layer = f.count("num_hidden_layers", 26)
    types = layer_types(f, n_layer, pattern=2)
    windowed = [i for i, t in enumerate(types) if t == "sliding_attention"]
    window = f.count("sliding_window", 4096)
    attention_bias = f.flag("attention_bias", False)
    return llama_like_config(
        f, max_positions=8192, default_head_dim=256, bias=False, qkv_bias=attention_bias,
        out_bias=attention_bias, norm="gemma_rmsnorm", mlp="geglu",
        gelu=f.gelu("hidden_activation", "gelu_pytorch_tanh"), scale_embeddings=True,
        sandwich_norm=True, tie_weights=f.flag("tie_word_embeddings", True),
        attn_scale=f.number("query_pre_attn_scalar", 256) ** -0.5,
        sliding_window=window if windowed else None,
        window_layers=None if len(windowed) in (0, n_layer) else windowed,
        attn_logit_softcapping=_cap(f, "attn_logit_softcapping", 50.0),
        final_logit_softcapping=_cap(f, "final_logit_softcapping", 30.0),
    )


def _misfits(c: GPTConfig) -> list[str]:
    return misfits_of({
        "pos='rope'": c.pos == "rope", "norm='gemma_rmsnorm'": c.norm == "gemma_rmsnorm",
        "mlp='geglu'": c.mlp == "geglu", "scale_embeddings=True": c.scale_embeddings,
        "sandwich_norm=True": c.sandwich_norm, "qk_norm=False": not c.qk_norm,
        "local_rope_theta=None": c.local_rope_theta is None, "bias=False": not c.bias,
        "qkv_bias == out_bias": qkv_bias_of(c) == out_bias_of(c),
        "rotary_pct=1.0": c.rotary_pct == 1.0, "attn_out_proj=True": c.attn_out_proj,
    })


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    scalar = c.score_scale ** -2
    out = llama_like_to_hf(
        c, GEMMA2, attention_bias=qkv_bias_of(c), layer_types=window_layers_to_hf(c),
        hidden_activation={"tanh": "gelu_pytorch_tanh", "exact": "gelu"}[c.gelu],
        sliding_window=c.sliding_window or 4096,  # see gemma3.py: transformers wants one
        query_pre_attn_scalar=round(scalar) if abs(scalar - round(scalar)) < 1e-9 else scalar,
        attn_logit_softcapping=c.attn_logit_softcapping,
        final_logit_softcapping=c.final_logit_softcapping,
    )
    del out["hidden_act"]  # Gemma 2 reads hidden_activation
    return out


GEMMA2 = Family(
    name="gemma2", model_type="gemma2", architecture="Gemma2ForCausalLM",
    base_architecture="Gemma2Model", config_from_hf=_config, config_to_hf=_to_hf,
    misfits=_misfits, weights=WEIGHTS, irrelevant=IRRELEVANT,
)
