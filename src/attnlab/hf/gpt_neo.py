"""GPTNeoForCausalLM (GPT-Neo 125M / 1.3B / 2.7B, the TinyStories models): GPT-2's blocks
(learned positions, LayerNorm, the tanh GELU MLP) with unscaled scores (q @ k^T, no
1/sqrt(hs): `attn_scale=1.0`), no bias on q, k or v (the output projection has one), and
"local" layers that see the last `window_size` tokens (`sliding_window` on `window_layers`)
between "global" ones, as `attention_types` lists them ([[["global", "local"], 12]]: the
pair twelve times).

Names: `transformer.h.{i}.attn.attention.q_proj`, ..., `mlp.c_fc` / `mlp.c_proj` (nn.Linear,
not GPT-2's Conv1D). Old checkpoints' causal-mask buffers (`attn.attention.bias`,
`masked_bias`) are skipped.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import MAX_CONTEXT, Fields
from .registry import Family, WeightMap

WEIGHTS = WeightMap(
    top={"wte": "transformer.wte", "wpe": "transformer.wpe", "ln_f": "transformer.ln_f",
         "lm_head": "lm_head"},
    layer="transformer.h.{i}.",
    block={"ln_1": "ln_1", "ln_2": "ln_2", "attn.query": "attn.attention.q_proj",
           "attn.key": "attn.attention.k_proj", "attn.value": "attn.attention.v_proj",
           "attn.out_proj": "attn.attention.out_proj", "mlp.fc": "mlp.c_fc",
           "mlp.proj": "mlp.c_proj"},
    base="transformer.",
)
KINDS = ("global", "local")
# GPTNeoConfig writes the expanded kinds too and, reading, derives them from attention_types
IRRELEVANT = frozenset({"attention_layers"})


def _layer_kinds(f: Fields, n_layer: int) -> list[str]:
    """Each layer's kind from `attention_types` ([[kinds, repeats], ...]: the kinds repeated,
    item after item, as GPTNeoConfig expands them), one per layer."""
    types = f.get("attention_types", [[list(KINDS), 12]])
    kinds: list[str] = []
    well_formed = isinstance(types, list) and all(
        isinstance(item, list) and len(item) == 2 and isinstance(item[0], list)
        and all(k in KINDS for k in item[0]) and isinstance(item[1], int)
        and not isinstance(item[1], bool) and 0 <= item[1] <= n_layer for item in types)
    if well_formed:
        for pattern, repeats in types:
            kinds += pattern * repeats
    if not well_formed or len(kinds) != n_layer:
        raise f.refuse("attention_types", types, f"expected [[kinds, repeats], ...] giving "
                       f"num_layers={n_layer} kinds, each 'global' or 'local'")
    return kinds


def _config(f: Fields) -> dict[str, Any]:
    n_layer = f.count("num_layers", 24)
    local = [i for i, kind in enumerate(_layer_kinds(f, n_layer)) if kind == "local"]
    window = f.count("window_size", 256)  # read either way: without local layers, unused
    return dict(
        vocab_size=f.count("vocab_size", 50257),
        block_size=f.count("max_position_embeddings", 2048, MAX_CONTEXT),
        n_layer=n_layer, n_head=f.count("num_heads", 16), n_embd=f.count("hidden_size", 2048),
        d_ff=None if f.get("intermediate_size") is None else f.count("intermediate_size"),
        norm_eps=f.number("layer_norm_epsilon", 1e-5),
        gelu=f.gelu("activation_function", "gelu_new"), bias=True, qkv_bias=False,
        out_bias=True, attn_scale=1.0, scores_in_float32=True,
        sliding_window=window if local else None,
        window_layers=None if len(local) == n_layer else local or None,
        tie_weights=f.flag("tie_word_embeddings", True),
    )


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    windowed = set(range(c.n_layer) if c.window_layers is None else c.window_layers)
    kinds = ["local" if c.sliding_window is not None and i in windowed else "global"
             for i in range(c.n_layer)]
    return {
        "architectures": [GPT_NEO.architecture], "model_type": GPT_NEO.model_type,
        "vocab_size": c.vocab_size, "max_position_embeddings": c.block_size,
        "hidden_size": c.n_embd, "num_layers": c.n_layer, "num_heads": c.n_head,
        "intermediate_size": c.d_ff, "attention_types": [[kinds, 1]],
        "window_size": c.sliding_window or 256,
        "activation_function": "gelu_new" if c.gelu == "tanh" else "gelu",
        "layer_norm_epsilon": c.norm_eps, "tie_word_embeddings": c.tie_weights,
    }


GPT_NEO = Family(
    name="gpt_neo", model_type="gpt_neo", architecture="GPTNeoForCausalLM",
    base_architecture="GPTNeoModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
