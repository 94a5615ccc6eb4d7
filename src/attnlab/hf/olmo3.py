"""Olmo3ForCausalLM (OLMo 3): OLMo 2's blocks (a norm after each branch only, QK-norm over
each token's whole q and k) with sliding-window and full layers (`layer_types`, by default
three windowed layers then a full one, `sliding_window` 4096) and RoPE per layer type: a
scaling (the long-context models' yarn) on the full layers only, the windowed layers' own
unscaled base (`local_rope_theta`).

transformers' Olmo3Config gives a legacy top-level rope_theta to the full layers alone: the
windowed layers take its default base (500,000) unless rope_parameters names theirs, and
attnlab reads it the same way.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import MAX_CONTEXT, Fields, rope_to_hf
from .gemma3 import layer_types, type_ropes
from .llama import llama_like_to_hf
from .olmo2 import WEIGHTS, olmo2_config
from .registry import Family, window_layers_from, window_layers_to_hf

THETA = 500_000.0  # Olmo3Config's default_theta


def _config(f: Fields) -> dict[str, Any]:
    n_layer = f.count("num_hidden_layers", 32)
    windowed = [i for i, t in enumerate(layer_types(f, n_layer, pattern=4))
                if t == "sliding_attention"]
    f.get("sliding_window")  # read either way: without windowed layers it changes nothing
    rope, local_theta = type_ropes(
        f, f.count("max_position_embeddings", 2048, MAX_CONTEXT),
        full_theta=f.get("rope_theta", THETA), local_theta=THETA)
    window = f.count("sliding_window", 4096) if windowed else None
    return olmo2_config(
        f, sliding_window=window, local_rope_theta=None if window is None else local_theta,
        window_layers=window_layers_from(windowed, n_layer), **rope)


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    full = rope_to_hf(c)
    local = full if c.local_rope_theta is None else {"rope_type": "default",
                                                     "rope_theta": c.local_rope_theta}
    return llama_like_to_hf(
        c, OLMO3, attention_bias=c.qkv_biased, layer_types=window_layers_to_hf(c),
        # transformers builds the sliding mask even where no layer uses it: a size it accepts
        sliding_window=c.sliding_window or 4096,
        rope_parameters={"full_attention": full, "sliding_attention": local})


OLMO3 = Family(
    name="olmo3", model_type="olmo3", architecture="Olmo3ForCausalLM",
    base_architecture="Olmo3Model", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS,
)
