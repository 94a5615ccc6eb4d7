"""Qwen2MoeForCausalLM (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v bias,
`qkv_bias`, and its optional windows) with a mixture of `num_experts` SwiGLU experts
`moe_intermediate_size` wide (OLMoE's names) and beside them a shared expert
`shared_expert_intermediate_size` wide that every token goes through, its output times
sigmoid of `shared_expert_gate`'s score (`GPTConfig.shared_expert_size`). The top
`num_experts_per_tok` weights are the router's probabilities, renormalised where
`norm_topk_prob`, rounded to the model's dtype. Dense layers (`mlp_only_layers`,
`decoder_sparse_step` > 1) are refused.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import llama_like_config, llama_like_to_hf
from .mixtral import ROUTER_TRAINING, moe_weights, split_experts
from .qwen2 import qwen_window, qwen_window_to_hf
from .qwen3_moe import qwen_experts, qwen_experts_to_hf
from .registry import Family

_EXPERTS = moe_weights("mlp", "mlp.experts", "gate_proj", "up_proj", "down_proj")
WEIGHTS = dataclasses.replace(_EXPERTS, block={
    **_EXPERTS.block, "mlp.shared.gate": "mlp.shared_expert.gate_proj",
    "mlp.shared.fc": "mlp.shared_expert.up_proj", "mlp.shared.proj": "mlp.shared_expert.down_proj",
    "mlp.shared_gate": "mlp.shared_expert_gate"})


def _config(f: Fields) -> dict[str, Any]:
    n_layer = f.count("num_hidden_layers", 24)
    return llama_like_config(
        f, max_positions=32768, bias=False, qkv_bias=f.flag("qkv_bias", True), out_bias=False,
        shared_expert_size=f.count("shared_expert_intermediate_size", 5632),
        **qwen_experts(f, 1408), **qwen_window(f, n_layer))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, QWEN2_MOE, qkv_bias=c.qkv_biased,
                            shared_expert_intermediate_size=c.shared_expert_size,
                            **qwen_experts_to_hf(c), **qwen_window_to_hf(c))


QWEN2_MOE = Family(
    name="qwen2_moe", model_type="qwen2_moe", architecture="Qwen2MoeForCausalLM",
    base_architecture="Qwen2MoeModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, from_memory=partial(split_experts, weights=WEIGHTS),
    irrelevant=ROUTER_TRAINING,
)
