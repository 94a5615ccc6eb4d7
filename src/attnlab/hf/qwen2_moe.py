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
from .mixtral import ROUTER_TRAINING, experts_from_hf, moe_weights, split_experts
from .qwen2 import qwen_window, qwen_window_to_hf
from .registry import Family

_EXPERTS = moe_weights("mlp", "mlp.experts", "gate_proj", "up_proj", "down_proj")
WEIGHTS = dataclasses.replace(_EXPERTS, block={
    **_EXPERTS.block, "mlp.shared.gate": "mlp.shared_expert.gate_proj",
    "mlp.shared.fc": "mlp.shared_expert.up_proj", "mlp.shared.proj": "mlp.shared_expert.down_proj",
    "mlp.shared_gate": "mlp.shared_expert_gate"})


def _config(f: Fields) -> dict[str, Any]:
    f.one_of("decoder_sparse_step", [1], 1)
    f.one_of("mlp_only_layers", [[]], [])
    f.get("intermediate_size")  # the dense MLP's width: no layer has one
    n_layer = f.count("num_hidden_layers", 24)
    experts = experts_from_hf(f, "num_experts", normalized=f.flag("norm_topk_prob", False))
    return {**llama_like_config(
        f, max_positions=32768, bias=False, qkv_bias=f.flag("qkv_bias", True), out_bias=False,
        expert_weights_in_float32=False, **experts, **qwen_window(f, n_layer)),
        "d_ff": f.count("moe_intermediate_size", 1408),
        "shared_expert_size": f.count("shared_expert_intermediate_size", 5632)}


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return {**llama_like_to_hf(c, QWEN2_MOE, qkv_bias=c.qkv_biased, num_experts=c.n_experts,
                               num_experts_per_tok=c.experts_per_token,
                               norm_topk_prob=c.experts_normalized,
                               moe_intermediate_size=c.ff_size,
                               shared_expert_intermediate_size=c.shared_expert_size,
                               **qwen_window_to_hf(c)),
            "intermediate_size": c.ff_size}


QWEN2_MOE = Family(
    name="qwen2_moe", model_type="qwen2_moe", architecture="Qwen2MoeForCausalLM",
    base_architecture="Qwen2MoeModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, from_memory=partial(split_experts, weights=WEIGHTS),
    irrelevant=ROUTER_TRAINING,
)
