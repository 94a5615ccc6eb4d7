"""Ernie4_5ForCausalLM (Baidu's ERNIE-4.5-0.3B): Llama's blocks with head_dim 128 by default,
biases on all four attention projections and the MLP where `use_bias`, tied embeddings by
default, and RoPE turning adjacent pairs of dims (`rope_interleaved`) in float32 with its
float32 tables (`rope_in_float32`: GLM's layout at full precision).
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family

# Ernie4_5Config's defaults (ERNIE-4.5-0.3B's shape) where they differ from llama_like_config's
DEFAULTS = {"vocab_size": 103424, "hidden_size": 1024, "intermediate_size": 3072,
            "num_hidden_layers": 18, "num_attention_heads": 16, "num_key_value_heads": 2}


def _config(f: Fields) -> dict[str, Any]:
    f.setdefaults(DEFAULTS)
    bias = f.flag("use_bias", False)
    return llama_like_config(
        f, max_positions=131072, default_head_dim=128, rope=dict(default_theta=500000.0),
        bias=bias, qkv_bias=bias, out_bias=bias, norm_eps=f.number("rms_norm_eps", 1e-5),
        rope_interleaved=True, rope_in_float32=True,
        tie_weights=f.flag("tie_word_embeddings", True))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, ERNIE4_5, use_bias=c.bias)


ERNIE4_5 = Family(
    name="ernie4_5", model_type="ernie4_5", architecture="Ernie4_5ForCausalLM",
    base_architecture="Ernie4_5Model", config_from_hf=_config, config_to_hf=_to_hf,
    weights=LLAMA_WEIGHTS,
)
