"""Qwen3MoeForCausalLM (Qwen3-30B-A3B, 235B-A22B): Qwen3's attention (QK-norm per head) with a
mixture of `num_experts` SwiGLU experts `moe_intermediate_size` wide in every layer (OLMoE's
names), the top `num_experts_per_tok` renormalised where `norm_topk_prob`. A dense MLP in
some layers (`mlp_only_layers`, `decoder_sparse_step` > 1) and the sliding window are
refused: no released model uses them.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import llama_like_config, llama_like_to_hf
from .mixtral import ROUTER_TRAINING, split_experts
from .olmoe import EXPERT_WEIGHTS, topk_experts, topk_experts_to_hf
from .registry import Family


def qwen_experts(f: Fields, width: int) -> dict[str, Any]:
    """GPTConfig's mixture fields from a Qwen MoE config.json: `topk_experts`' in every layer
    (`decoder_sparse_step` 1, no `mlp_only_layers`), `moe_intermediate_size` wide (default
    `width`; `intermediate_size`, the dense MLP's, sizes nothing then)."""
    f.one_of("decoder_sparse_step", [1], 1)
    f.one_of("mlp_only_layers", [[]], [])
    return {**topk_experts(f), "d_ff": f.count("moe_intermediate_size", width)}


def qwen_experts_to_hf(c: GPTConfig) -> dict[str, Any]:
    return {**topk_experts_to_hf(c), "moe_intermediate_size": c.ff_size}


def _config(f: Fields) -> dict[str, Any]:
    f.one_of("use_sliding_window", [False], False)
    attention_bias = f.flag("attention_bias", False)
    return llama_like_config(
        f, max_positions=32768, bias=False, qkv_bias=attention_bias, out_bias=attention_bias,
        qk_norm=True, **qwen_experts(f, 768))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, QWEN3_MOE, attention_bias=c.qkv_biased, **qwen_experts_to_hf(c))


QWEN3_MOE = Family(
    name="qwen3_moe", model_type="qwen3_moe", architecture="Qwen3MoeForCausalLM",
    base_architecture="Qwen3MoeModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=EXPERT_WEIGHTS, from_memory=partial(split_experts, weights=EXPERT_WEIGHTS),
    irrelevant=ROUTER_TRAINING | {"sliding_window", "max_window_layers"},
)
