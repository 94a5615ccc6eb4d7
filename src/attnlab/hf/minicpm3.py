"""MiniCPM3ForCausalLM (OpenBMB's MiniCPM3-4B): DeepSeek-V2's multi-head latent attention
(q and k/v through normed latents, a RoPE part every head shares; `GPTConfig.kv_latent`) in a
dense Llama block, with RoPE turned in halves in the model's dtype (Llama's), and three
scalars: the embeddings times `scale_emb` (`embedding_multiplier`), each branch times
`scale_depth` / sqrt(layers) before its residual add (`residual_multiplier`), and the final
norm's output divided by hidden_size / `dim_model_base` before the head (`logits_scaling`
with `logits_scaled_first`; Granite divides the logits after it). transformers rounds
`scale_emb` to the model's dtype before it multiplies (exact for the release's 12).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..model.gpt import GPTConfig
from .deepseek import DEEPSEEK_V2_WEIGHTS, latent_fields, latent_scale, latent_to_hf
from .fields import ROPE_TYPES, Fields
from .llama import llama_like_config
from .registry import Family

# MiniCPM3Config's defaults where they differ from those llama_like_config assumes
DEFAULTS = dict(vocab_size=73448, hidden_size=2560, intermediate_size=6400,
                num_hidden_layers=62, num_attention_heads=40, rms_norm_eps=1e-5,
                kv_lora_rank=256, q_lora_rank=768, qk_nope_head_dim=64, qk_rope_head_dim=32)


def _config(f: Fields) -> dict[str, Any]:
    f.setdefaults(DEFAULTS)
    n_embd, n_head = f.count("hidden_size"), f.count("num_attention_heads")
    n_layer = f.count("num_hidden_layers")
    if f.get("v_head_dim") is None:  # MiniCPM3Config's: the hidden width a head
        f.hf["v_head_dim"] = n_embd // n_head
    if f.flag("mlp_bias", False):
        raise f.refuse("mlp_bias", True, "MiniCPM3's MLP has no bias in transformers")
    f.get("pretraining_tp")  # transformers 5 reads it nowhere
    emb = f.number("scale_emb", 12.0)
    depth = f.positive_or_none("scale_depth", 1.4)  # null: MiniCPM3Config's scaling of 1
    base = f.positive_or_none("dim_model_base", 256.0)
    c = llama_like_config(
        f, max_positions=32768, bias=False, tie_weights=f.flag("tie_word_embeddings", True),
        rope=dict(types=(*ROPE_TYPES, "longrope")),
        **latent_fields(f, rope_interleaved=False, rope_in_float32=False),
        embedding_multiplier=emb,
        residual_multiplier=1.0 if depth is None else depth / math.sqrt(n_layer),
        logits_scaling=1.0 if base is None else n_embd / base, logits_scaled_first=True)
    c.update(attn_scale=latent_scale(c))
    return c


def _inverse(target: float, guess: float, forward: Callable[[float], float]) -> float:
    """The float within a few ulps of `guess` that `forward` maps to `target` exactly (so an
    exported scalar reads back as the same config), else `guess`."""
    below = above = guess
    for _ in range(4):
        for x in (below, above):
            if forward(x) == target:
                return x
        below, above = math.nextafter(below, -math.inf), math.nextafter(above, math.inf)
    return guess


def _whole(x: float) -> float | int:
    """x as an int where it is one (MiniCPM3Config types dim_model_base int)."""
    return int(x) if x.is_integer() else x


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    root = math.sqrt(c.n_layer)
    return latent_to_hf(
        c, MINICPM3, scale_emb=c.embedding_multiplier,
        scale_depth=_inverse(c.residual_multiplier, c.residual_multiplier * root,
                             lambda depth: depth / root),
        dim_model_base=_whole(_inverse(c.logits_scaling, c.n_embd / c.logits_scaling,
                                       lambda base: c.n_embd / base)),
        tie_word_embeddings=c.tie_weights)


MINICPM3 = Family(
    name="minicpm3", model_type="minicpm3", architecture="MiniCPM3ForCausalLM",
    base_architecture="MiniCPM3Model", config_from_hf=_config, config_to_hf=_to_hf,
    weights=DEEPSEEK_V2_WEIGHTS,
)
