"""Dots1ForCausalLM (rednote's dots.llm1): Qwen3's attention (QK-norm per head, before RoPE;
`attention_bias` on all four projections; whole heads turned) with a window of
`sliding_window` on the layers `layer_types` names (by default those from
`max_window_layers` on, wherever `sliding_window` is set: no `use_sliding_window` switch),
and DeepSeek-V3's mixture: a sigmoid router with a correction bias, groups and scaling,
ungated shared experts and `first_k_dense_replace` dense first layers (`glm4_moe.py`'s
helpers).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .glm4_moe import DEEPSEEK_WEIGHTS, deepseek_experts, deepseek_experts_to_hf
from .llama import llama_like_config, llama_like_to_hf
from .mixtral import ROUTER_TRAINING, split_experts
from .qwen2 import checked_layer_types
from .registry import Family, window_layers_from, window_layers_to_hf

# Dots1Config's defaults where they differ from those `llama_like_config` assumes; it has
# none for the experts' counts (n_routed_experts, n_shared_experts, num_experts_per_tok),
# which config.json must give
DOTS1_DEFAULTS = dict(
    vocab_size=152064, hidden_size=4608, intermediate_size=10944, num_hidden_layers=62,
    num_attention_heads=32, moe_intermediate_size=1408, n_group=1, topk_group=1,
    first_k_dense_replace=0, norm_topk_prob=False)


def _window(f: Fields, n_layer: int) -> dict[str, Any]:
    """sliding_window / window_layers as Dots1Config derives its layer_types."""
    window = f.nullable("sliding_window", 4096)
    first = f.get("max_window_layers", 62)
    types = checked_layer_types(f, [
        "sliding_attention" if window is not None and i >= first else "full_attention"
        for i in range(n_layer)])
    windowed = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if not windowed:
        return dict(sliding_window=None, window_layers=None)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise f.refuse("sliding_window", window, "expected a positive integer (layer_types "
                       "names sliding_attention layers)")
    return dict(sliding_window=window, window_layers=window_layers_from(windowed, n_layer))


def _config(f: Fields) -> dict[str, Any]:
    f.setdefaults(DOTS1_DEFAULTS)
    n_layer = f.count("num_hidden_layers")
    attention_bias = f.flag("attention_bias", False)
    return llama_like_config(
        f, max_positions=2048, bias=False, qkv_bias=attention_bias, out_bias=attention_bias,
        qk_norm=True, **_window(f, n_layer), **deepseek_experts(f, n_layer))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    types = window_layers_to_hf(c)
    windowed = [i for i, t in enumerate(types) if t == "sliding_attention"]
    return llama_like_to_hf(c, DOTS1, attention_bias=c.qkv_biased,
                            sliding_window=c.sliding_window,
                            max_window_layers=windowed[0] if windowed else c.n_layer,
                            layer_types=types, **deepseek_experts_to_hf(c))


DOTS1 = Family(
    name="dots1", model_type="dots1", architecture="Dots1ForCausalLM",
    base_architecture="Dots1Model", config_from_hf=_config, config_to_hf=_to_hf,
    weights=DEEPSEEK_WEIGHTS, from_memory=partial(split_experts, weights=DEEPSEEK_WEIGHTS),
    irrelevant=ROUTER_TRAINING,
)
