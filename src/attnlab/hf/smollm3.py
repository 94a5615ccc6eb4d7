"""SmolLM3ForCausalLM (SmolLM3): Llama's blocks with RoPE left out of some layers (NoPE:
`no_rope_layers`, 1 where a layer rotates q and k, by default every fourth layer without;
`GPTConfig.nope_layers`), and sliding windows where `layer_types` names them (by default the
NoPE layers, when `use_sliding_window` is set). `attention_bias` puts a bias on all four
attention projections, `mlp_bias` on the MLP's.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .qwen2 import checked_layer_types
from .registry import Family, window_layers_from, window_layers_to_hf

# Qwen2's window field, which a SmolLM3 config.json may carry and transformers 5's SmolLM3
# reads nowhere (its layer_types decide the windows)
IRRELEVANT = frozenset({"max_window_layers"})


def _rotating(f: Fields, n_layer: int) -> list[bool]:
    """Whether each layer rotates q and k: `no_rope_layers`, else all but every
    `no_rope_layer_interval`-th (SmolLM3Config's default)."""
    flags = f.get("no_rope_layers")
    if flags is None:
        interval = f.count("no_rope_layer_interval", 4)
        return [(i + 1) % interval != 0 for i in range(n_layer)]
    f.get("no_rope_layer_interval")  # the list decides
    if not isinstance(flags, list) or len(flags) != n_layer or any(
            type(x) not in (int, bool) or x not in (0, 1) for x in flags):
        raise f.refuse("no_rope_layers", flags, f"expected {n_layer} entries, each 1 (the "
                       "layer uses RoPE) or 0 (it does not)")
    return [bool(x) for x in flags]


def _windows(f: Fields, rotating: list[bool]) -> dict[str, Any]:
    """sliding_window / window_layers as transformers' eager SmolLM3 masks them: the layers
    `layer_types` names sliding (by default the NoPE ones, with use_sliding_window and a
    sliding_window), each with `sliding_window`."""
    use, window = f.flag("use_sliding_window", False), f.get("sliding_window")
    types = checked_layer_types(f, [
        "sliding_attention" if use and window is not None and not rope else "full_attention"
        for rope in rotating])
    windowed = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if not windowed:
        return dict(sliding_window=None, window_layers=None)
    if not use or isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise f.refuse("sliding_window", window, "layer_types names sliding_attention layers: "
                       "expected use_sliding_window true and a positive integer window")
    return dict(sliding_window=window,
                window_layers=window_layers_from(windowed, len(rotating)))


def _config(f: Fields) -> dict[str, Any]:
    rotating = _rotating(f, f.count("num_hidden_layers", 36))
    attention_bias = f.flag("attention_bias", False)
    nope = [i for i, rope in enumerate(rotating) if not rope]
    return llama_like_config(
        f, max_positions=32768, rope=dict(default_theta=2_000_000.0),
        bias=f.flag("mlp_bias", False), qkv_bias=attention_bias, out_bias=attention_bias,
        tie_weights=f.flag("tie_word_embeddings", True), nope_layers=nope or None,
        **_windows(f, rotating))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    types = window_layers_to_hf(c)
    return llama_like_to_hf(
        c, SMOLLM3, attention_bias=c.qkv_biased, mlp_bias=c.bias, layer_types=types,
        no_rope_layers=[int(c.rotates(i)) for i in range(c.n_layer)],
        use_sliding_window="sliding_attention" in types, sliding_window=c.sliding_window)


SMOLLM3 = Family(
    name="smollm3", model_type="smollm3", architecture="SmolLM3ForCausalLM",
    base_architecture="SmolLM3Model", config_from_hf=_config, config_to_hf=_to_hf,
    weights=LLAMA_WEIGHTS, irrelevant=IRRELEVANT,
)
