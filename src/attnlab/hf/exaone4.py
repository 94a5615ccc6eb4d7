"""Exaone4ForCausalLM (LG's EXAONE 4.0 1.2B and 32B): OLMo 2's blocks (no norm on a branch's
input, one on each branch's output before its residual add: `pre_norm=False` with
`sandwich_norm`) with Llama's RMSNorm, QK-norm per head before RoPE, and, where
`sliding_window` is set, sliding-window and full layers (`layer_types`; by default every
`sliding_window_pattern`-th layer full) whose full layers turn no q or k (NoPE: `nope_layers`);
without a window every layer is full and rotates.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import llama_like_config, llama_like_to_hf
from .olmo2 import WEIGHTS
from .qwen2 import checked_layer_types
from .registry import Family, window_layers_from, window_layers_to_hf


def _layers(f: Fields, n_layer: int) -> dict[str, Any]:
    """sliding_window, window_layers and nope_layers as Exaone4Config and its attention make
    them."""
    # Exaone4Config's default window where the key is absent, none where it is null
    window = f.nullable("sliding_window", 4096)
    pattern = f.get("sliding_window_pattern", 4)
    if window is None:
        default = ["full_attention"] * n_layer
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0:
        default = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                   for i in range(n_layer)]
    elif "layer_types" not in f.hf:
        raise f.refuse("sliding_window_pattern", pattern, "expected a positive integer (a "
                       "pattern string needs layer_types beside it, which transformers reads)")
    else:
        default = []  # layer_types names them
    types = checked_layer_types(f, default or ["full_attention"] * n_layer)
    windowed = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if window is None:
        if windowed:
            raise f.refuse("layer_types", types, "names sliding_attention layers but "
                           "sliding_window is null")
        return dict(sliding_window=None, window_layers=None, nope_layers=None)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise f.refuse("sliding_window", window, "expected a positive integer or null")
    full = [i for i in range(n_layer) if i not in windowed]
    return dict(sliding_window=window if windowed else None,
                window_layers=window_layers_from(windowed, n_layer),
                nope_layers=full or None)


def _config(f: Fields) -> dict[str, Any]:
    n_layer = f.count("num_hidden_layers", 32)
    return llama_like_config(
        f, max_positions=2048, norm_eps=f.number("rms_norm_eps", 1e-5), bias=False,
        qk_norm=True, pre_norm=False, sandwich_norm=True, **_layers(f, n_layer))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    types = window_layers_to_hf(c)
    windowed = "sliding_attention" in types
    return llama_like_to_hf(c, EXAONE4, layer_types=types,
                            sliding_window=c.sliding_window if windowed else None,
                            sliding_window_pattern=None)


EXAONE4 = Family(
    name="exaone4", model_type="exaone4", architecture="Exaone4ForCausalLM",
    base_architecture="Exaone4Model", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS,
)
