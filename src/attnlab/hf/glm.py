"""GlmForCausalLM (GLM-4-9B-chat-hf, GLM-Edge) and Glm4ForCausalLM (GLM-4-9B-0414,
GLM-4-32B-0414, GLM-Z1): Llama-style blocks with

- RoPE on the first `partial_rotary_factor` (0.5) of each head, turning adjacent pairs of
  dims (GPT-J's layout: `rope_interleaved`);
- biases on q, k and v (`attention_bias`), none on the output projection or the MLP;
- the MLP's gate and up projections in one `mlp.gate_up_proj` ([gate | up], Phi-3's);
- GLM-4 (Glm4) adds a norm on each branch's output before its residual add
  (`post_self_attn_layernorm`, `post_mlp_layernorm`: `sandwich_norm`, Llama's RMSNorm).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..model.gpt import GPTConfig
from .fields import Fields, rope_to_hf
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family, Fused, WeightMap


def _split_gate_up(gate_up: Tensor, config: GPTConfig) -> tuple[Tensor, ...]:
    """gate_up_proj weight (2 d_ff, C) -> gate (d_ff, C), up (d_ff, C)."""
    if gate_up.shape[0] != 2 * config.ff_size:
        raise ValueError(f"GLM gate_up_proj has shape {tuple(gate_up.shape)}, expected "
                         f"{2 * config.ff_size} rows for intermediate_size={config.ff_size}; "
                         "config.json and the weights disagree")
    return tuple(gate_up.split(config.ff_size))


def _join(parts: Sequence[Tensor], config: GPTConfig) -> Tensor:
    return torch.cat(list(parts))  # (2 d_ff, C)


_BLOCK = {k: v for k, v in LLAMA_WEIGHTS.block.items() if k not in ("mlp.gate", "mlp.fc")}
_GATE_UP = (Fused("mlp.gate_up_proj", ("mlp.gate", "mlp.fc"), _split_gate_up, _join),)
WEIGHTS = WeightMap(top=LLAMA_WEIGHTS.top, layer=LLAMA_WEIGHTS.layer, base=LLAMA_WEIGHTS.base,
                    block=_BLOCK, fused=_GATE_UP)
GLM4_WEIGHTS = WeightMap(
    top=LLAMA_WEIGHTS.top, layer=LLAMA_WEIGHTS.layer, base=LLAMA_WEIGHTS.base,
    block={**_BLOCK, "ln_attn_post": "post_self_attn_layernorm",
           "ln_mlp_post": "post_mlp_layernorm"},
    fused=_GATE_UP,
)


def _config(f: Fields, sandwich: bool) -> dict[str, Any]:
    return llama_like_config(
        f, max_positions=131072, default_head_dim=128, partial_key="partial_rotary_factor",
        rope=dict(default_partial=0.5), bias=False, qkv_bias=f.flag("attention_bias", True),
        out_bias=False, rope_interleaved=True, sandwich_norm=sandwich,
        norm_eps=f.number("rms_norm_eps", 1.5625e-07))


def _to_hf(c: GPTConfig, family: Family) -> dict[str, Any]:
    return {**llama_like_to_hf(c, family, attention_bias=c.qkv_biased),
            "rope_parameters": rope_to_hf(c, partial=True)}


def _glm_config(f: Fields) -> dict[str, Any]:
    return _config(f, sandwich=False)


def _glm4_config(f: Fields) -> dict[str, Any]:
    return _config(f, sandwich=True)


def _glm_to_hf(c: GPTConfig) -> dict[str, Any]:
    return _to_hf(c, GLM)


def _glm4_to_hf(c: GPTConfig) -> dict[str, Any]:
    return _to_hf(c, GLM4)


GLM = Family(
    name="glm", model_type="glm", architecture="GlmForCausalLM", base_architecture="GlmModel",
    config_from_hf=_glm_config, config_to_hf=_glm_to_hf, weights=WEIGHTS,
)
GLM4 = Family(
    name="glm4", model_type="glm4", architecture="Glm4ForCausalLM",
    base_architecture="Glm4Model", config_from_hf=_glm4_config, config_to_hf=_glm4_to_hf,
    weights=GLM4_WEIGHTS,
)
