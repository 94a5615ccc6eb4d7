"""Phi3ForCausalLM (Phi-3-mini / -medium, Phi-4-mini): Llama-style blocks whose q, k and v
live in one `self_attn.qkv_proj` ([q | k | v] along the output, grouped-query widths) and
whose MLP's gate and up projections live in one `mlp.gate_up_proj` ([gate | up]), with no
biases, RoPE on the first `partial_rotary_factor` of each head (rotate-half layout, as
GPT-NeoX), and Mistral's sliding window on every layer where `sliding_window` is set
(Phi-3-mini-4k: 2047).

Phi-3's long-context RoPE ("longrope", which transformers also reads from the older "su"
and "yarn" spellings: Phi-3-mini-128k, Phi-3.5, Phi-4-mini) has two frequency sets, the long
one for a call reaching past original_max_position_embeddings (`model/rope.py`), and a
generation crossing it encodes the sequence again, as transformers' Phi-3 does. Other RoPE
types are refused, as transformers' Phi3Config refuses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..model.gpt import GPTConfig
from .fields import Fields, rope_to_hf
from .llama import LLAMA_WEIGHTS, llama_like_config
from .registry import QKV, Family, Fused, WeightMap

# transformers' Phi3 builds no attention bias whatever config.json says, and reads the
# custom-code pointers (auto_map) only with trust_remote_code, whose modules hub Phi-3
# repositories keep from before transformers had the family; Phi-4-mini's config.json has
# two more fields that code reads (full_attn_mod 1: every layer full; interpolate_factor 1)
IRRELEVANT = frozenset({"attention_bias", "auto_map", "full_attn_mod", "interpolate_factor"})
OLD_LONGROPE = ("su", "yarn")  # Phi3Config reads these as longrope
ROPE = dict(types=("default", "longrope"), original_default=4096)  # Phi3Config's


def _qkv_widths(config: GPTConfig) -> list[int]:
    hs = config.head_size
    return [config.n_head * hs, config.n_kv_heads * hs, config.n_kv_heads * hs]


def _split_qkv(qkv: Tensor, config: GPTConfig) -> tuple[Tensor, ...]:
    """qkv_proj weight ((nh + 2 nkv) hs, C) -> q (nh hs, C), k and v (nkv hs, C)."""
    widths = _qkv_widths(config)
    if qkv.shape[0] != sum(widths):
        raise ValueError(f"Phi-3 qkv_proj has shape {tuple(qkv.shape)}, expected "
                         f"{sum(widths)} rows for {config.n_head} query and "
                         f"{config.n_kv_heads} key/value heads of {config.head_size}; "
                         "config.json and the weights disagree")
    return tuple(qkv.split(widths))


def _split_gate_up(gate_up: Tensor, config: GPTConfig) -> tuple[Tensor, ...]:
    """gate_up_proj weight (2 d_ff, C) -> gate (d_ff, C), up (d_ff, C)."""
    d_ff = config.d_ff or 4 * config.n_embd
    if gate_up.shape[0] != 2 * d_ff:
        raise ValueError(f"Phi-3 gate_up_proj has shape {tuple(gate_up.shape)}, expected "
                         f"{2 * d_ff} rows for intermediate_size={d_ff}; config.json and "
                         "the weights disagree")
    return tuple(gate_up.split(d_ff))


def _join(parts: Sequence[Tensor], config: GPTConfig) -> Tensor:
    return torch.cat(list(parts))  # (sum of the parts' rows, C)


WEIGHTS = WeightMap(
    top=LLAMA_WEIGHTS.top, layer=LLAMA_WEIGHTS.layer, base=LLAMA_WEIGHTS.base,
    block={k: v for k, v in LLAMA_WEIGHTS.block.items()
           if k in ("ln_1", "ln_2", "attn.out_proj", "mlp.proj")},
    fused=(Fused("self_attn.qkv_proj", QKV, _split_qkv, _join),
           Fused("mlp.gate_up_proj", ("mlp.gate", "mlp.fc"), _split_gate_up, _join)),
)


def _config(f: Fields) -> dict[str, Any]:
    for key in ("rope_parameters", "rope_scaling"):
        rope = f.hf.get(key)
        kind_key = "rope_type" if isinstance(rope, dict) and "rope_type" in rope else "type"
        if isinstance(rope, dict) and rope.get(kind_key) in OLD_LONGROPE:
            f.hf[key] = {**rope, kind_key: "longrope"}
    for key in ("mlp_bias", "lm_head_bias"):  # Phi-4-mini's, false
        if f.flag(key, False):
            raise f.refuse(key, True, "transformers' Phi-3 builds no such bias (the hub's "
                           "custom code would)")
    window = f.get("sliding_window")  # Phi3Config's default: none
    return llama_like_config(f, max_positions=4096, partial_key="partial_rotary_factor",
                             rope=ROPE, bias=False, sliding_window=window)


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    hs = c.head_size
    return {
        "architectures": [PHI3.architecture], "model_type": PHI3.model_type,
        "vocab_size": c.vocab_size, "hidden_size": c.n_embd,
        "intermediate_size": c.d_ff or 4 * c.n_embd, "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_heads,
        **({} if hs * c.n_head == c.n_embd else {"head_dim": hs}),
        "hidden_act": "silu", "max_position_embeddings": c.block_size,
        "original_max_position_embeddings": (c.rope_scaling or {}).get(
            "original_max_position_embeddings", c.block_size),
        "rms_norm_eps": c.norm_eps,
        "tie_word_embeddings": c.tie_weights, "sliding_window": c.sliding_window,
        "rope_parameters": rope_to_hf(c, partial=True),
    }


PHI3 = Family(
    name="phi3", model_type="phi3", architecture="Phi3ForCausalLM",
    base_architecture="Phi3Model", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
