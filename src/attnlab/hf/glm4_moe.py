"""Glm4MoeForCausalLM (GLM-4.5, GLM-4.5-Air, GLM-4.6): Llama-style blocks with

- RoPE on the first `partial_rotary_factor` (0.5) of each head, the two halves of that part
  turned (Llama's layout, not GLM-4's pairs); biases on q, k and v (`attention_bias`), none
  on the output projection; QK-norm per head where `use_qk_norm`;
- DeepSeek-V3's mixture (the helpers here serve dots.llm1 too): a router (`mlp.gate`, its
  float32 buffer `e_score_correction_bias`) scoring `n_routed_experts` SwiGLU experts
  `moe_intermediate_size` wide by sigmoid, picking `num_experts_per_tok` by score plus the
  correction bias among the `topk_group` best of `n_group` groups, weighing them by their
  scores (renormalised where `norm_topk_prob`) times `routed_scaling_factor`
  (`GPTConfig.router_scoring="sigmoid"`); beside them `n_shared_experts` shared experts in
  one MLP (`mlp.shared_experts`) every token goes through, added ungated;
- the first `first_k_dense_replace` layers with one dense MLP `intermediate_size` wide.

The multi-token-prediction layers (`num_nextn_predict_layers`) take no part in a forward
pass: transformers builds none and leaves their tensors in the files unread, and so does
attnlab (`WeightMap.later_layers`).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields, rope_to_hf
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .mixtral import ROUTER_TRAINING, moe_weights, split_experts
from .registry import Family

_EXPERTS = moe_weights("mlp", "mlp.experts", "gate_proj", "up_proj", "down_proj")
# the dense layers' MLP under Llama's names, the mixtures' router, experts and shared experts
DEEPSEEK_WEIGHTS = dataclasses.replace(_EXPERTS, block={
    **_EXPERTS.block, **{k: v for k, v in LLAMA_WEIGHTS.block.items() if k.startswith("mlp.")},
    "mlp.shared.gate": "mlp.shared_experts.gate_proj",
    "mlp.shared.fc": "mlp.shared_experts.up_proj",
    "mlp.shared.proj": "mlp.shared_experts.down_proj"})
# GLM-4.5's files hold its multi-token-prediction layers after the last (model.layers.46.*)
GLM4_MOE_WEIGHTS = dataclasses.replace(DEEPSEEK_WEIGHTS, later_layers=True)


def deepseek_experts(f: Fields, n_layer: int) -> dict[str, Any]:
    """GPTConfig's mixture fields from a DeepSeek-V3-style config.json (GLM-4.5's, dots.llm1's;
    `f` filled with the family's defaults first): the sigmoid router, its groups and
    scaling, the ungated shared experts and the dense first layers."""
    key = "num_local_experts" if f.has("num_local_experts") and not f.has(
        "n_routed_experts") else "n_routed_experts"  # transformers' attribute_map
    n = f.count(key)
    if key == "n_routed_experts":
        f.get("num_local_experts")
    groups = f.count("n_group")
    if n % groups or (groups > 1 and n // groups < 2):
        raise f.refuse("n_group", groups, f"must split the {n} experts into equal groups of "
                       "at least 2 (each group is scored by its two best experts)")
    width = f.count("moe_intermediate_size")
    dense = f.get("first_k_dense_replace")
    if isinstance(dense, bool) or not isinstance(dense, int) or not 0 <= dense < n_layer:
        raise f.refuse("first_k_dense_replace", dense, f"expected 0 to {n_layer - 1} (the "
                       "dense layers before the mixtures; attnlab needs one mixture at least)")
    return dict(
        n_experts=n, experts_per_token=f.count("num_experts_per_tok", limit=n),
        experts_normalized=f.flag("norm_topk_prob", False), expert_weights_in_float32=True,
        router_scoring="sigmoid", expert_groups=groups,
        expert_groups_chosen=f.count("topk_group", limit=groups),
        routed_scaling=f.number("routed_scaling_factor", 1.0),
        shared_expert_size=width * f.count("n_shared_experts"), shared_expert_gated=False,
        d_ff=width, dense_layers=dense, dense_d_ff=f.count("intermediate_size"))


def deepseek_experts_to_hf(c: GPTConfig) -> dict[str, Any]:
    """`deepseek_experts` the other way. What these fields cannot say is written as what
    they can, which reads back as another model (`misfits` names the difference): a dense
    model as experts_per_token experts, a missing shared expert or one whose width is no
    whole number of experts' as one or that number rounded down."""
    return dict(
        n_routed_experts=c.n_experts or c.experts_per_token,
        num_experts_per_tok=c.experts_per_token,
        norm_topk_prob=c.experts_normalized, n_group=c.expert_groups,
        topk_group=c.expert_groups_chosen, routed_scaling_factor=c.routed_scaling,
        n_shared_experts=max(1, (c.shared_expert_size or 0) // c.ff_size),
        moe_intermediate_size=c.ff_size,  # the first mixture (misfits names any later gap)
        first_k_dense_replace=next(i for i in range(c.n_layer) if c.has_mixture(i)) if (
            c.n_experts is not None) else 0,
        intermediate_size=c.dense_d_ff or c.ff_size)


# Glm4MoeConfig's defaults where they differ from those `llama_like_config` assumes
GLM4_MOE_DEFAULTS = dict(
    vocab_size=151552, hidden_size=4096, intermediate_size=10944, num_hidden_layers=46,
    num_attention_heads=96, num_key_value_heads=8, rms_norm_eps=1e-5,
    moe_intermediate_size=1408, num_experts_per_tok=8, n_shared_experts=1,
    n_routed_experts=128, n_group=1, topk_group=1, first_k_dense_replace=1,
    norm_topk_prob=True)


def _config(f: Fields) -> dict[str, Any]:
    f.setdefaults(GLM4_MOE_DEFAULTS)
    f.get("num_mtp_layers")  # transformers' other name of num_nextn_predict_layers
    return llama_like_config(
        f, max_positions=131072, partial_key="partial_rotary_factor",
        rope=dict(default_partial=0.5), bias=False, qkv_bias=f.flag("attention_bias", False),
        out_bias=False, qk_norm=f.flag("use_qk_norm", False),
        **deepseek_experts(f, f.count("num_hidden_layers")))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, GLM4_MOE, attention_bias=c.qkv_biased, use_qk_norm=c.qk_norm,
                            rope_parameters=rope_to_hf(c, partial=True),
                            **deepseek_experts_to_hf(c))


GLM4_MOE = Family(
    name="glm4_moe", model_type="glm4_moe", architecture="Glm4MoeForCausalLM",
    base_architecture="Glm4MoeModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=GLM4_MOE_WEIGHTS, from_memory=partial(split_experts, weights=GLM4_MOE_WEIGHTS),
    irrelevant=ROUTER_TRAINING | {"num_nextn_predict_layers"},
)
