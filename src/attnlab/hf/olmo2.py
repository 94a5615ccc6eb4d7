"""Olmo2ForCausalLM (OLMo 2): Llama-style attention and SwiGLU MLP in blocks that norm no
branch's input, only each branch's output before its residual add (`pre_norm=False` with
`sandwich_norm`: x + norm(attn(x)), then h + norm(mlp(h))), and QK-norm over each token's
whole q and k, not each head's (`qk_norm_whole`), before RoPE. `attention_bias` puts a bias
on all four projections. OLMo 2 rounds as its transformers class does: its RMSNorm
multiplies by its weight before casting back to the input's dtype (norm="olmo_rmsnorm";
Llama's casts first), and RoPE turns q and k in float32 (`rope_in_float32`); the same in
float32.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family, WeightMap

WEIGHTS = WeightMap(
    top=LLAMA_WEIGHTS.top, layer=LLAMA_WEIGHTS.layer, base=LLAMA_WEIGHTS.base,
    block={**{k: v for k, v in LLAMA_WEIGHTS.block.items() if k not in ("ln_1", "ln_2")},
           "ln_attn_post": "post_attention_layernorm",
           "ln_mlp_post": "post_feedforward_layernorm"},
)


def olmo2_config(f: Fields, **switches: Any) -> dict[str, Any]:
    """GPTConfig keyword arguments for OLMo 2's blocks, OLMo 3's `switches` (windows, RoPE
    per layer type) added."""
    attention_bias = f.flag("attention_bias", False)
    return llama_like_config(f, max_positions=2048, bias=False, qkv_bias=attention_bias,
                             out_bias=attention_bias, qk_norm=True, qk_norm_whole=True,
                             pre_norm=False, sandwich_norm=True, norm="olmo_rmsnorm",
                             rope_in_float32=True, **switches)


def _config(f: Fields) -> dict[str, Any]:
    return olmo2_config(f)


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, OLMO2, attention_bias=c.qkv_biased)


OLMO2 = Family(
    name="olmo2", model_type="olmo2", architecture="Olmo2ForCausalLM",
    base_architecture="Olmo2Model", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS,
)
