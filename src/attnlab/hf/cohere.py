"""CohereForCausalLM (Command-R, Aya 23, Aya Expanse) and Cohere2ForCausalLM (Command R7B,
Command A): parallel blocks on one norm (x + attn(ln(x)) + mlp(ln(x)): `parallel_residual`
with `shared_norm`), LayerNorms without a bias, RoPE turning adjacent pairs of dims
(`rope_interleaved`), a SwiGLU MLP, tied embeddings, and logits times `logit_scale`.
Cohere 2 adds sliding-window layers (`layer_types`; by default three windowed, then a full
one) whose full layers turn no q or k (NoPE: `nope_layers`). `use_qk_norm` (Command R+'s):
a LayerNorm without bias on each head's q and k before RoPE, with a weight row per head
(`qk_norm_heads="cohere"`, `layers.HeadsLayerNorm`).
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .qwen2 import checked_layer_types
from .registry import Family, window_layers_from, window_layers_to_hf

# CohereConfig's defaults, where they differ from the Llama ones llama_like_config holds
DEFAULTS = {"vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528,
            "num_hidden_layers": 40, "num_attention_heads": 64}


def _config(f: Fields, windows: bool) -> dict[str, Any]:
    f.setdefaults(DEFAULTS)
    attention_bias, qk_norm = f.flag("attention_bias", False), f.flag("use_qk_norm", False)
    return llama_like_config(
        f, max_positions=8192, norm="layernorm", norm_bias=False, bias=False,
        norm_eps=f.number("layer_norm_eps", 1e-5), qkv_bias=attention_bias,
        out_bias=attention_bias, parallel_residual=True, shared_norm=True,
        rope_interleaved=True, rope_in_float32=True, rope_tables_rounded=True,
        qk_norm=qk_norm, qk_norm_heads="cohere" if qk_norm else None,
        tie_weights=f.flag("tie_word_embeddings", True),
        logit_scale=f.number("logit_scale", 0.0625),
        **(_windows(f, f.count("num_hidden_layers")) if windows else {}))


def _windows(f: Fields, n_layer: int) -> dict[str, Any]:
    """sliding_window, window_layers and nope_layers as Cohere2Config and its attention make
    them: RoPE on the windowed layers alone."""
    pattern = f.get("sliding_window_pattern", 4)  # read by Cohere2Config without layer_types
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise f.refuse("sliding_window_pattern", pattern, "expected a positive integer")
    types = checked_layer_types(f, ["full_attention" if (i + 1) % pattern == 0 else
                                    "sliding_attention" for i in range(n_layer)])
    windowed = [i for i, t in enumerate(types) if t == "sliding_attention"]
    full = [i for i in range(n_layer) if i not in windowed]
    window = f.count("sliding_window", 4096) if windowed else f.get("sliding_window")
    return dict(sliding_window=window if windowed else None,
                window_layers=window_layers_from(windowed, n_layer),
                nope_layers=full or None)


def _to_hf(c: GPTConfig, family: Family) -> dict[str, Any]:
    hf = llama_like_to_hf(c, family, attention_bias=c.qkv_biased, layer_norm_eps=c.norm_eps,
                          logit_scale=c.logit_scale, use_qk_norm=c.qk_norm)
    del hf["rms_norm_eps"]
    if family is COHERE2:
        hf.update(layer_types=window_layers_to_hf(c), sliding_window=c.sliding_window or 4096)
    return hf


def _cohere_config(f: Fields) -> dict[str, Any]:
    return _config(f, windows=False)


def _cohere2_config(f: Fields) -> dict[str, Any]:
    return _config(f, windows=True)


def _cohere_to_hf(c: GPTConfig) -> dict[str, Any]:
    return _to_hf(c, COHERE)


def _cohere2_to_hf(c: GPTConfig) -> dict[str, Any]:
    return _to_hf(c, COHERE2)


COHERE = Family(
    name="cohere", model_type="cohere", architecture="CohereForCausalLM",
    base_architecture="CohereModel", config_from_hf=_cohere_config,
    config_to_hf=_cohere_to_hf, weights=LLAMA_WEIGHTS,
)
COHERE2 = Family(
    name="cohere2", model_type="cohere2", architecture="Cohere2ForCausalLM",
    base_architecture="Cohere2Model", config_from_hf=_cohere2_config,
    config_to_hf=_cohere2_to_hf, weights=LLAMA_WEIGHTS,
)
