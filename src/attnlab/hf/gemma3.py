"""Gemma3ForCausalLM (model_type "gemma3_text", the text-only Gemma 3 such as gemma-3-1b):
Gemma's scaled embeddings, (1 + w) RMSNorm and GeGLU, plus

- sandwich norms (`sandwich_norm`): input_layernorm -> attention -> post_attention_layernorm
  -> residual add, pre_feedforward_layernorm -> MLP -> post_feedforward_layernorm -> residual
  add (so `post_attention_layernorm` here is not Llama's pre-MLP norm);
- QK-norm with Gemma's (1 + w) norm, and scores scaled by query_pre_attn_scalar ** -0.5;
- sliding-window and full layers (`layer_types`, or the older `sliding_window_pattern`: every
  Nth layer full), with RoPE per layer type: the sliding layers' base (`local_rope_theta`,
  unscaled; older configs' `rope_local_base_freq`), the full layers' rope_theta and scaling.

Soft-capping (Gemma 2's: `gemma2.py`) and bidirectional attention are refused by name; the
multimodal Gemma3ForConditionalGeneration (model_type "gemma3") is not this family.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import MAX_CONTEXT, Fields, rope_from_hf, rope_to_hf
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .qwen2 import LAYER_TYPES, checked_layer_types
from .registry import Family, WeightMap, window_layers_from, window_layers_to_hf

WEIGHTS = WeightMap(
    top=LLAMA_WEIGHTS.top, layer=LLAMA_WEIGHTS.layer, base=LLAMA_WEIGHTS.base,
    block={
        "ln_1": "input_layernorm", "ln_attn_post": "post_attention_layernorm",
        "ln_2": "pre_feedforward_layernorm", "ln_mlp_post": "post_feedforward_layernorm",
        "attn.query": "self_attn.q_proj", "attn.key": "self_attn.k_proj",
        "attn.value": "self_attn.v_proj", "attn.out_proj": "self_attn.o_proj",
        "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm",
        "mlp.gate": "mlp.gate_proj", "mlp.fc": "mlp.up_proj", "mlp.proj": "mlp.down_proj",
    },
)
# hub configs ask generate for the sliding-window cache (attnlab has its own);
# transformers 5 saves its private _sliding_window_pattern beside layer_types, which decide
# (reloading, it reads sliding_window_pattern only)
IRRELEVANT = frozenset({"cache_implementation", "_sliding_window_pattern"})
#: model_types beside this family's that attnlab does not read, and what to read instead
NEAR_MISSES = {
    "gemma3": "that is the multimodal Gemma3ForConditionalGeneration (a vision tower and a "
              "language model: gemma-3-4b and larger); attnlab reads the text-only "
              "Gemma3ForCausalLM (model_type 'gemma3_text': gemma-3-270m, gemma-3-1b)",
}


def layer_types(f: Fields, n_layer: int, pattern: int | None = None) -> list[str]:
    """Each layer's "sliding_attention" or "full_attention": `layer_types`, else every
    `pattern`-th layer full (None: Gemma 3's `sliding_window_pattern`, 6 by default)."""
    pattern = f.count("sliding_window_pattern", 6) if pattern is None else pattern
    return checked_layer_types(f, ["sliding_attention" if (i + 1) % pattern else
                                   "full_attention" for i in range(n_layer)])


def type_ropes(f: Fields, block_size: int, *, full_theta: float,
               local_theta: float) -> tuple[dict[str, Any], float | None]:
    """(the full layers' rope GPTConfig fields, the sliding layers' base or None when they
    share the full layers' RoPE) from either spelling: transformers 5's rope_parameters
    keyed by layer type, or the older rope_scaling (the full layers'); each type's
    rope_theta where its dict has none is the caller's (Gemma 3: rope_theta and
    rope_local_base_freq)."""
    params = f.get("rope_parameters") or {}
    if not isinstance(params, dict) or set(params) - set(LAYER_TYPES):
        raise f.refuse("rope_parameters", params, f"{f.family} keys its RoPE parameters by "
                       f"layer type: {', '.join(LAYER_TYPES)}")
    given = {f"rope_parameters.{kind}": params.get(kind) for kind in LAYER_TYPES}
    for key, value in {**given, "rope_scaling": f.get("rope_scaling")}.items():
        if value is not None and not isinstance(value, dict):
            raise f.refuse(key, value, "expected an object of RoPE parameters or null")
    full = dict(params.get("full_attention") or {"rope_type": "default"})
    full.update(f.get("rope_scaling") or {})
    full.setdefault("rope_theta", full_theta)
    local = dict(params.get("sliding_attention") or {"rope_type": "default"})
    local.setdefault("rope_theta", local_theta)
    theta, scaling, _ = rope_from_hf(Fields({"rope_parameters": full}, f.family),
                                     max_positions=block_size)
    if local == full:
        return dict(rope_theta=theta, rope_scaling=scaling), None
    if local.get("rope_type", "default") != "default" or set(local) - {"rope_type",
                                                                      "rope_theta"}:
        raise f.refuse("rope_parameters.sliding_attention", local, "attnlab's sliding layers "
                       "take a RoPE base of their own, unscaled (rope_type 'default')")
    local_theta, _, _ = rope_from_hf(Fields({"rope_parameters": local}, f.family),
                                     max_positions=block_size)
    return dict(rope_theta=theta, rope_scaling=scaling), local_theta


def sandwich_config(f: Fields, *, max_positions: int, pattern: int | None,
                    **switches: Any) -> dict[str, Any]:
    """GPTConfig keyword arguments for what Gemma 2 and 3 share (sandwich norms, Gemma's norm,
    GeGLU and embeddings, query_pre_attn_scalar, windowed layers by `layer_types` or every
    `pattern`-th full: `layer_types`), the family's own `switches` added or put in their
    place (VaultGemma's sandwich_norm=False)."""
    if f.get("use_bidirectional_attention"):
        raise f.refuse("use_bidirectional_attention", True, "attnlab's attention is causal")
    n_layer = f.count("num_hidden_layers", 26)
    windowed = [i for i, t in enumerate(layer_types(f, n_layer, pattern))
                if t == "sliding_attention"]
    window = f.count("sliding_window", 4096)
    attention_bias = f.flag("attention_bias", False)
    shared = dict(
        bias=False, qkv_bias=attention_bias, out_bias=attention_bias, norm="gemma_rmsnorm",
        mlp="geglu", gelu=f.gelu("hidden_activation", "gelu_pytorch_tanh"),
        scale_embeddings=True, sandwich_norm=True,
        tie_weights=f.flag("tie_word_embeddings", True),
        attn_scale=f.number("query_pre_attn_scalar", 256) ** -0.5,
        sliding_window=window if windowed else None,
        window_layers=window_layers_from(windowed, n_layer))
    return llama_like_config(f, max_positions=max_positions, default_head_dim=256,
                             **{**shared, **switches})  # a family's switch wins


def sandwich_to_hf(c: GPTConfig, family: Family, **extra: Any) -> dict[str, Any]:
    """The config.json fields Gemma 2 and 3 share, the family's own `extra` added."""
    scalar = c.score_scale ** -2
    out = llama_like_to_hf(
        c, family, attention_bias=c.qkv_biased, layer_types=window_layers_to_hf(c),
        hidden_activation={"tanh": "gelu_pytorch_tanh", "exact": "gelu"}[c.gelu],
        # transformers builds the sliding mask even where no layer uses it: a size it accepts
        sliding_window=c.sliding_window or 4096,
        query_pre_attn_scalar=round(scalar) if abs(scalar - round(scalar)) < 1e-9 else scalar,
        **extra,
    )
    del out["hidden_act"]  # Gemma 2 and 3 read hidden_activation
    return out


def _config(f: Fields) -> dict[str, Any]:
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if f.get(key) is not None:
            raise f.refuse(key, f.get(key), "soft-capping (Gemma 2's) is not supported")
    rope, local_theta = type_ropes(
        f, f.count("max_position_embeddings", 131072, MAX_CONTEXT),
        full_theta=f.get("rope_theta", 1_000_000.0),
        local_theta=f.get("rope_local_base_freq", 10_000.0))
    config = sandwich_config(f, max_positions=131072, pattern=None, qk_norm=True, **rope)
    return {**config, "local_rope_theta": None if config["sliding_window"] is None
            else local_theta}


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    full = rope_to_hf(c)
    local = full if c.local_rope_theta is None else {"rope_type": "default",
                                                     "rope_theta": c.local_rope_theta}
    return sandwich_to_hf(c, GEMMA3, final_logit_softcapping=None, attn_logit_softcapping=None,
                          rope_parameters={"full_attention": full, "sliding_attention": local})


GEMMA3 = Family(
    name="gemma3", model_type="gemma3_text", architecture="Gemma3ForCausalLM",
    base_architecture="Gemma3TextModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
