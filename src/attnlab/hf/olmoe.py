"""OlmoeForCausalLM (OLMoE-1B-7B): Llama-style blocks with QK-norm over each token's whole q
and k (`qk_norm_whole`, as OLMo 2's, but Llama's RMSNorm and pre-norms) and a mixture of
`num_experts` SwiGLU experts (`mlp.gate` the router, `mlp.experts.{e}.gate_proj` etc.) whose
top `num_experts_per_tok` weights are the router's probabilities as they are
(`norm_topk_prob` false) or renormalised. `clip_qkv` (clamping q, k and v) is refused.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import llama_like_config, llama_like_to_hf
from .mixtral import ROUTER_TRAINING, experts_from_hf, moe_weights, split_experts
from .registry import Family

EXPERT_WEIGHTS = moe_weights("mlp", "mlp.experts", "gate_proj", "up_proj", "down_proj")


def topk_experts(f: Fields) -> dict[str, Any]:
    """GPTConfig's mixture fields where transformers routes as OLMoE, Qwen2-MoE and Qwen3-MoE
    do (one router class): `num_experts`, the top `num_experts_per_tok` renormalised where
    `norm_topk_prob`, each weight rounded to the model's dtype before it multiplies."""
    return {**experts_from_hf(f, "num_experts", normalized=f.flag("norm_topk_prob", False)),
            "expert_weights_in_float32": False}


def topk_experts_to_hf(c: GPTConfig) -> dict[str, Any]:
    """`topk_experts` the other way: the config.json fields of the mixture."""
    return dict(num_experts=c.n_experts, num_experts_per_tok=c.experts_per_token,
                norm_topk_prob=c.experts_normalized)


def _config(f: Fields) -> dict[str, Any]:
    f.one_of("clip_qkv", [None], None)
    attention_bias = f.flag("attention_bias", False)
    return llama_like_config(
        f, max_positions=4096, bias=False, qkv_bias=attention_bias, out_bias=attention_bias,
        qk_norm=True, qk_norm_whole=True, **topk_experts(f))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, OLMOE, attention_bias=c.qkv_biased, **topk_experts_to_hf(c))


OLMOE = Family(
    name="olmoe", model_type="olmoe", architecture="OlmoeForCausalLM",
    base_architecture="OlmoeModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=EXPERT_WEIGHTS, from_memory=partial(split_experts, weights=EXPERT_WEIGHTS),
    irrelevant=ROUTER_TRAINING,
)
