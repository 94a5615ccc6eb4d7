"""Qwen2ForCausalLM: Llama-style, with bias on q/k/v and none on the output projection
(hard-wired in transformers' modeling_qwen2.py, whatever the config says), no MLP bias, and
an optional sliding window on some layers (`use_sliding_window`, `sliding_window`,
`max_window_layers` or transformers 5's `layer_types`). Qwen3 reuses `qwen_window`.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family, window_layers_from, window_layers_to_hf

LAYER_TYPES = ("full_attention", "sliding_attention")


def checked_layer_types(f: Fields, default: list[str]) -> list[str]:
    """config.json's `layer_types`, else `default` (one per layer): each one of LAYER_TYPES,
    as many as the layers (Qwen2, Gemma 3, OLMo 3 and SmolLM3 read them alike)."""
    types = f.get("layer_types") or default
    if not isinstance(types, list) or len(types) != len(default) or any(
            t not in LAYER_TYPES for t in types):
        raise f.refuse("layer_types", types, f"expected {len(default)} entries, each one of "
                       f"{', '.join(LAYER_TYPES)}")
    return list(types)


def qwen_window(f: Fields, n_layer: int) -> dict[str, Any]:
    """sliding_window / window_layers from Qwen's fields, as transformers 5's Qwen2Config
    derives them: a window only with use_sliding_window, on layers >= max_window_layers
    unless `layer_types` names the layers."""
    use = f.flag("use_sliding_window", False)
    window = f.get("sliding_window", 4096)
    window = window if use else None
    first = f.get("max_window_layers", 28)
    types = checked_layer_types(f, [
        "sliding_attention" if window is not None and i >= first else "full_attention"
        for i in range(n_layer)
    ])
    windowed = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if windowed and window is None:
        raise f.refuse("layer_types", types, "names sliding_attention layers but "
                       "use_sliding_window is false or sliding_window is unset")
    if not windowed:
        return dict(sliding_window=None, window_layers=None)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise f.refuse("sliding_window", window, "expected a positive integer")
    return dict(sliding_window=window,
                window_layers=window_layers_from(windowed, n_layer))


def qwen_window_to_hf(c: GPTConfig) -> dict[str, Any]:
    types = window_layers_to_hf(c)
    windowed = [i for i, t in enumerate(types) if t == "sliding_attention"]
    return {
        "use_sliding_window": bool(windowed), "sliding_window": c.sliding_window,
        "max_window_layers": windowed[0] if windowed else c.n_layer, "layer_types": types,
    }


def _config(f: Fields) -> dict[str, Any]:
    n_layer = f.count("num_hidden_layers", 32)
    return llama_like_config(f, max_positions=32768, bias=False, qkv_bias=True,
                             out_bias=False, **qwen_window(f, n_layer))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, QWEN2, **qwen_window_to_hf(c))


QWEN2 = Family(
    name="qwen2", model_type="qwen2", architecture="Qwen2ForCausalLM",
    base_architecture="Qwen2Model", config_from_hf=_config, config_to_hf=_to_hf,
    weights=LLAMA_WEIGHTS,
)
