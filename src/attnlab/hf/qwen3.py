"""Qwen3ForCausalLM: Llama-style with QK-norm (RMSNorm over each head's q and k, before
RoPE: `self_attn.q_norm` / `k_norm`), `head_dim` often wider than hidden_size / heads,
`attention_bias` on all four projections, and Qwen2's optional sliding window."""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .qwen2 import qwen_window, qwen_window_to_hf
from .registry import Family


def _config(f: Fields) -> dict[str, Any]:
    n_layer = f.count("num_hidden_layers", 32)
    attention_bias = f.flag("attention_bias", False)
    # Qwen3Config's head_dim defaults to 128, not hidden_size / heads
    return llama_like_config(f, max_positions=32768, default_head_dim=128, bias=False,
                             qkv_bias=attention_bias, out_bias=attention_bias, qk_norm=True,
                             **qwen_window(f, n_layer))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, QWEN3, attention_bias=c.qkv_biased, **qwen_window_to_hf(c))


QWEN3 = Family(
    name="qwen3", model_type="qwen3", architecture="Qwen3ForCausalLM",
    base_architecture="Qwen3Model", config_from_hf=_config, config_to_hf=_to_hf,
    weights=LLAMA_WEIGHTS,
)
