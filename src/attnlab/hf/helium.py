"""HeliumForCausalLM (Kyutai's Helium-1 2B): Llama's blocks with head_dim 128 by default,
RoPE turning adjacent pairs of dims (`rope_interleaved`), RMSNorm scaled in float32 before
the cast back (`olmo_rmsnorm`), biases on q, k and v where `attention_bias` (none on the
output projection) and on the MLP where `mlp_bias`.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family

# HeliumConfig's defaults (Helium-1 2B's shape) where they differ from llama_like_config's
DEFAULTS = {"vocab_size": 48000, "hidden_size": 2560, "intermediate_size": 7040,
            "num_hidden_layers": 24, "num_attention_heads": 20, "num_key_value_heads": 20}


def _config(f: Fields) -> dict[str, Any]:
    f.setdefaults(DEFAULTS)
    return llama_like_config(
        f, max_positions=4096, default_head_dim=128, rope=dict(default_theta=100000.0),
        bias=f.flag("mlp_bias", False), qkv_bias=f.flag("attention_bias", False),
        out_bias=False, norm="olmo_rmsnorm", norm_eps=f.number("rms_norm_eps", 1e-8),
        rope_interleaved=True)


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, HELIUM, attention_bias=c.qkv_biased, mlp_bias=c.bias)


HELIUM = Family(
    name="helium", model_type="helium", architecture="HeliumForCausalLM",
    base_architecture="HeliumModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=LLAMA_WEIGHTS,
)
