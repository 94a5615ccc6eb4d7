"""SeedOssForCausalLM (ByteDance's Seed-OSS-36B): Llama's blocks with head_dim 128 by default,
biases on q, k and v where `attention_bias` (true by default), on the output projection
where `attention_out_bias`, on the MLP where `mlp_bias`.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family

IRRELEVANT = frozenset({"residual_dropout"})  # training-only
# SeedOssConfig's defaults (Seed-OSS-36B's shape) where they differ from llama_like_config's
DEFAULTS = {"vocab_size": 155136, "hidden_size": 4096, "intermediate_size": 27648,
            "num_hidden_layers": 64, "num_attention_heads": 80, "num_key_value_heads": 8}


def _config(f: Fields) -> dict[str, Any]:
    f.setdefaults(DEFAULTS)
    return llama_like_config(
        f, max_positions=524288, default_head_dim=128, bias=f.flag("mlp_bias", False),
        qkv_bias=f.flag("attention_bias", True), out_bias=f.flag("attention_out_bias", False))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, SEED_OSS, attention_bias=c.qkv_biased,
                            attention_out_bias=c.out_biased, mlp_bias=c.bias)


SEED_OSS = Family(
    name="seed_oss", model_type="seed_oss", architecture="SeedOssForCausalLM",
    base_architecture="SeedOssModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=LLAMA_WEIGHTS, irrelevant=IRRELEVANT,
)
