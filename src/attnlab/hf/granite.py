"""GraniteForCausalLM (IBM Granite 3.0 to 3.3, 2B and 8B): Llama with four scalars. Scores
are scaled by `attention_multiplier` (`attn_scale`, not 1/sqrt(hs)), token embeddings times
`embedding_multiplier`, each branch's output times `residual_multiplier` before its residual
add, and the logits divided by `logits_scaling` (the `GPTConfig` fields of the same names).
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family

SCALARS = ("embedding_multiplier", "residual_multiplier", "logits_scaling")


def _config(f: Fields) -> dict[str, Any]:
    attention_bias = f.flag("attention_bias", False)
    scalars: dict[str, Any] = {name: f.number(name, 1.0) for name in SCALARS}
    return llama_like_config(
        f, max_positions=2048, bias=f.flag("mlp_bias", False), qkv_bias=attention_bias,
        out_bias=attention_bias, attn_scale=f.number("attention_multiplier", 1.0), **scalars,
    )


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, GRANITE, attention_bias=c.qkv_biased, mlp_bias=c.bias,
                            attention_multiplier=c.score_scale,
                            **{name: getattr(c, name) for name in SCALARS})


GRANITE = Family(
    name="granite", model_type="granite", architecture="GraniteForCausalLM",
    base_architecture="GraniteModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=LLAMA_WEIGHTS,
)
