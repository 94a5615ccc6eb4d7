"""OlmoForCausalLM (OLMo 1: OLMo-1B, OLMo-7B and their -0424 / -0724 releases): Llama's
blocks with LayerNorms that have no scale or bias, computed in float32 with transformers'
fixed eps of 1e-5 (norm="unit_layernorm"), q, k and v clamped to +-`clip_qkv` as they leave
their projections (`qkv_clip`; null: no clamp), RoPE turned in float32 (`rope_in_float32`),
and `attention_bias` on all four projections.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family

# OlmoConfig's defaults where they differ from those llama_like_config assumes
DEFAULTS = {"vocab_size": 50304}
NORM_EPS = 1e-5  # OlmoLayerNorm's, which no config field sets


def _config(f: Fields) -> dict[str, Any]:
    f.setdefaults(DEFAULTS)
    clip = f.get("clip_qkv")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, int | float)
                             or not 0 < clip < 1e30):
        raise f.refuse("clip_qkv", clip, "expected a positive number or null")
    bias = f.flag("attention_bias", False)
    values = llama_like_config(
        f, max_positions=2048, bias=False, qkv_bias=bias, out_bias=bias, norm="unit_layernorm",
        rope_in_float32=True, qkv_clip=None if clip is None else float(clip))
    return {**values, "norm_eps": NORM_EPS}  # (rms_norm_eps, read above, no OLMo 1 reads)


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, OLMO, attention_bias=c.qkv_biased, clip_qkv=c.qkv_clip)


OLMO = Family(
    name="olmo", model_type="olmo", architecture="OlmoForCausalLM",
    base_architecture="OlmoModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=LLAMA_WEIGHTS,
)
