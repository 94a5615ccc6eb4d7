"""MinistralForCausalLM (Mistral AI's Ministral-8B): Mistral's blocks with the sliding window
on the layers `layer_types` names (by default every layer, where there is a window). A
config.json whose model_type is "mistral" but that writes `layer_types` is read as this
family, as transformers' AutoConfig reads it.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .qwen2 import checked_layer_types
from .registry import Family, window_layers_from, window_layers_to_hf

# MistralConfig's defaults where they differ from those llama_like_config assumes
DEFAULTS = {"intermediate_size": 14336, "num_key_value_heads": 8}


def _config(f: Fields) -> dict[str, Any]:
    f.setdefaults(DEFAULTS)
    n_layer = f.count("num_hidden_layers", 32)
    window = f.nullable("sliding_window", 4096)  # MinistralConfig's default where absent
    types = checked_layer_types(f, ["sliding_attention" if window is not None
                                    else "full_attention"] * n_layer)
    windowed = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if windowed and window is None:
        raise f.refuse("layer_types", types, "sliding_attention layers need a sliding_window")
    return llama_like_config(
        f, max_positions=131072, bias=False, sliding_window=window if windowed else None,
        window_layers=window_layers_from(windowed, n_layer))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, MINISTRAL, sliding_window=c.sliding_window,
                            layer_types=window_layers_to_hf(c))


MINISTRAL = Family(
    name="ministral", model_type="ministral", architecture="MinistralForCausalLM",
    base_architecture="MinistralModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=LLAMA_WEIGHTS, aliases=("MistralForCausalLM", "MistralModel"),
)
