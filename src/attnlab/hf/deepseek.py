"""DeepseekV2ForCausalLM (DeepSeek-V2, V2-Lite, V2.5) and DeepseekV3ForCausalLM (DeepSeek-V3,
R1, Moonlight): Llama-style blocks with

- multi-head latent attention (`model/latent.py`): k and v of every head projected up
  (`kv_b_proj`) from a `kv_lora_rank`-wide latent (`kv_a_proj_with_mqa`, which also gives the
  `qk_rope_head_dim` key dims every head shares, `kv_a_layernorm`), q from a `q_lora_rank`-wide
  one (`q_a_proj`, `q_a_layernorm`, `q_b_proj`; null: `q_proj` straight from x); each head's q
  and k `qk_nope_head_dim` dims without RoPE, then `qk_rope_head_dim` turned in adjacent pairs
  (V2's complex product in float32; V3's in the model's dtype, in halves where
  `rope_interleave` is false); values `v_head_dim` wide; scores scaled by
  1/sqrt(qk_nope_head_dim + qk_rope_head_dim), times yarn's mscale(mscale_all_dim) squared;
- DeepSeek's mixture after `first_k_dense_replace` dense layers (`glm4_moe.py`'s helpers):
  V3's sigmoid router with a correction bias and groups; V2's softmax router in float32, its
  picks unrenormalised (transformers' DeepseekV2 reads no `norm_topk_prob`) among the
  `topk_group` groups of `n_group` with the best single expert where `topk_method` is
  "group_limited_greedy"; `n_shared_experts` shared experts added ungated.

transformers derives `head_dim` (as qk_rope_head_dim) and `qk_head_dim` itself, whatever
config.json says; so does attnlab (head_dim: qk_nope_head_dim + qk_rope_head_dim). V3's
multi-token-prediction layers are left unread, as transformers leaves them. DeepSeek's own
config.json keys that transformers ignores are read where they could say another model
(`scoring_func`, `topk_method` of V3, `moe_layer_freq`) and refused unless they say this one.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

from ..model.gpt import GPTConfig
from ..model.rope import scaling_kind
from .fields import Fields, rope_to_hf
from .glm4_moe import DEEPSEEK_WEIGHTS, deepseek_experts, deepseek_experts_to_hf
from .llama import llama_like_config, llama_like_to_hf
from .mixtral import ROUTER_TRAINING, split_experts
from .registry import Family

_LATENT = {
    "attn.query": "self_attn.q_proj", "attn.q_down": "self_attn.q_a_proj",
    "attn.q_latent_norm": "self_attn.q_a_layernorm", "attn.q_up": "self_attn.q_b_proj",
    "attn.kv_down": "self_attn.kv_a_proj_with_mqa",
    "attn.kv_latent_norm": "self_attn.kv_a_layernorm", "attn.kv_up": "self_attn.kv_b_proj",
    "attn.out_proj": "self_attn.o_proj"}
DEEPSEEK_V2_WEIGHTS = dataclasses.replace(DEEPSEEK_WEIGHTS, block={
    **{k: v for k, v in DEEPSEEK_WEIGHTS.block.items() if not k.startswith("attn.")},
    **_LATENT})
# V3's files hold its multi-token-prediction layer after the last (model.layers.61.*)
DEEPSEEK_V3_WEIGHTS = dataclasses.replace(DEEPSEEK_V2_WEIGHTS, later_layers=True)
# DeepSeek's own config.json: training's balance loss and expert parallelism
_DEEPSEEK_TRAINING = frozenset({"aux_loss_alpha", "seq_aux", "ep_size"})

_SHARED_DEFAULTS = dict(
    kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128,
    v_head_dim=128, rms_norm_eps=1e-6)
# the config classes' defaults where they differ from those `llama_like_config` assumes
V2_DEFAULTS = dict(
    _SHARED_DEFAULTS, vocab_size=102400, first_k_dense_replace=0, n_routed_experts=64,
    n_shared_experts=2, routed_scaling_factor=1.0, moe_intermediate_size=1407)
V3_DEFAULTS = dict(
    _SHARED_DEFAULTS, vocab_size=129280, hidden_size=7168, intermediate_size=18432,
    moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128,
    n_shared_experts=1, n_routed_experts=256, routed_scaling_factor=2.5, n_group=8,
    topk_group=4, num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True)


def latent_fields(f: Fields, **layout: Any) -> dict[str, Any]:
    """GPTConfig's latent-attention fields (and head_dim, biases) from a DeepSeek-style
    config.json, with the family's RoPE `layout` (rope_interleaved, rope_in_float32)."""
    n_head = f.count("num_attention_heads", 32)
    if f.count("num_key_value_heads", n_head) != n_head:
        raise f.refuse("num_key_value_heads", f.hf["num_key_value_heads"],
                       f"latent attention projects k and v for each of the {n_head} heads: "
                       "transformers' attention needs num_key_value_heads = "
                       "num_attention_heads")
    f.get("head_dim")  # transformers sets both from the two below, whatever is written
    f.get("qk_head_dim")
    rope = f.count("qk_rope_head_dim")
    # null (V2-Lite): q straight from x; absent: the config class's default
    q_latent = f.count("q_lora_rank") if f.get("q_lora_rank") is not None or (
        "q_lora_rank" not in f.hf) else None
    bias = f.flag("attention_bias", False)
    return dict(
        head_dim=f.count("qk_nope_head_dim") + rope, n_kv_head=None,
        kv_latent=f.count("kv_lora_rank"), q_latent=q_latent, rope_head_dim=rope,
        v_head_dim=f.count("v_head_dim"), qkv_bias=bias, out_bias=bias, **layout)


def latent_scale(c: dict[str, Any]) -> float | None:
    """attn_scale: transformers' `yarn_apply_mscale` of 1/sqrt(head_dim); None where it
    leaves that as it is."""
    scaling = c["rope_scaling"]
    if scaling is None or scaling_kind(scaling) != "yarn" or not scaling.get("mscale_all_dim"):
        return None
    factor, all_dim = scaling["factor"], scaling["mscale_all_dim"]
    mscale = 1.0 if factor <= 1 else 0.1 * all_dim * math.log(factor) + 1.0
    return c["head_dim"] ** -0.5 * mscale * mscale


def _deepseek_keys(f: Fields, scoring: str, methods: tuple[str, ...]) -> str:
    """DeepSeek's own router keys, which transformers ignores: refused unless they say the
    model transformers computes; the topk_method."""
    f.one_of("scoring_func", (scoring,), scoring)
    if f.count("moe_layer_freq", 1) != 1:
        raise f.refuse("moe_layer_freq", f.hf["moe_layer_freq"], "transformers puts a mixture "
                       "in every layer after first_k_dense_replace")
    return str(f.one_of("topk_method", methods, methods[0]))


def _v2_config(f: Fields) -> dict[str, Any]:
    f.setdefaults(V2_DEFAULTS)
    if f.flag("mlp_bias", False):
        raise f.refuse("mlp_bias", True, "transformers' DeepseekV2 puts it on the dense and "
                       "shared MLPs but not the experts, which attnlab does not build")
    method = _deepseek_keys(f, "softmax", ("greedy", "group_limited_greedy"))
    f.get("norm_topk_prob")  # transformers' DeepseekV2 router never renormalises
    if method == "greedy":  # no groups: transformers reads neither
        f.hf.update(n_group=1, topk_group=1)
    c = llama_like_config(
        # V2 turns pairs as complex numbers in float32
        f, max_positions=2048, bias=False,
        **latent_fields(f, rope_interleaved=True, rope_in_float32=True),
        **deepseek_experts(f, f.count("num_hidden_layers", 32)))
    c.update(router_scoring="softmax_float32", experts_normalized=False,
             attn_scale=latent_scale(c))
    return c


def _v3_config(f: Fields) -> dict[str, Any]:
    f.setdefaults(V3_DEFAULTS)
    _deepseek_keys(f, "sigmoid", ("noaux_tc",))
    f.get("num_mtp_layers")  # transformers' other name of num_nextn_predict_layers
    c = llama_like_config(
        # V3 in the model's dtype, in pairs or (rope_interleave false) halves
        f, max_positions=4096, bias=False,
        **latent_fields(f, rope_interleaved=f.flag("rope_interleave", True),
                        rope_in_float32=False),
        **deepseek_experts(f, f.count("num_hidden_layers")))
    c.update(attn_scale=latent_scale(c))
    return c


def latent_to_hf(c: GPTConfig, family: Family, **extra: Any) -> dict[str, Any]:
    """`latent_fields` the other way, beside the family's `extra` fields. What these fields
    cannot say is written as what they can, which reads back as another model (`misfits`
    names the difference): attention without latents as one from an n_embd-wide latent,
    grouped-query heads as one k and v per head, a RoPE part as wide as the head as two dims
    of it."""
    rope = c.rope_head_dim if 2 <= c.rope_head_dim < c.head_size else 2
    out = llama_like_to_hf(
        c, family, kv_lora_rank=c.kv_latent or c.n_embd, q_lora_rank=c.q_latent,
        qk_rope_head_dim=rope, qk_nope_head_dim=max(c.head_size - rope, 1),
        v_head_dim=c.v_head_dim or c.head_size, attention_bias=c.qkv_biased,
        num_key_value_heads=c.n_head, rope_parameters=rope_to_hf(c), **extra)
    out.pop("head_dim")  # transformers derives it (as qk_rope_head_dim)
    return out


def _v2_to_hf(c: GPTConfig) -> dict[str, Any]:
    return {**latent_to_hf(c, DEEPSEEK_V2, **deepseek_experts_to_hf(c)),
            "norm_topk_prob": False,
            "topk_method": "group_limited_greedy" if c.expert_groups > 1 else "greedy"}


def _v3_to_hf(c: GPTConfig) -> dict[str, Any]:
    return {**latent_to_hf(c, DEEPSEEK_V3, **deepseek_experts_to_hf(c)),
            "rope_interleave": c.rope_interleaved}


DEEPSEEK_V2 = Family(
    name="deepseek_v2", model_type="deepseek_v2", architecture="DeepseekV2ForCausalLM",
    base_architecture="DeepseekV2Model", config_from_hf=_v2_config, config_to_hf=_v2_to_hf,
    weights=DEEPSEEK_V2_WEIGHTS,
    from_memory=partial(split_experts, weights=DEEPSEEK_V2_WEIGHTS),
    irrelevant=ROUTER_TRAINING | _DEEPSEEK_TRAINING | {"auto_map"},
)
DEEPSEEK_V3 = Family(
    name="deepseek_v3", model_type="deepseek_v3", architecture="DeepseekV3ForCausalLM",
    base_architecture="DeepseekV3Model", config_from_hf=_v3_config, config_to_hf=_v3_to_hf,
    weights=DEEPSEEK_V3_WEIGHTS,
    from_memory=partial(split_experts, weights=DEEPSEEK_V3_WEIGHTS),
    irrelevant=ROUTER_TRAINING | _DEEPSEEK_TRAINING | {"auto_map", "num_nextn_predict_layers"},
)
