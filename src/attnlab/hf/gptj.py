"""GPTJForCausalLM (GPT-J-6B, and the GPT-J-shaped models built on it): Phi's block
(attention and the tanh GELU MLP side by side on one LayerNorm, a bias on the head) with
no bias on q, k, v or the output projection, and RoPE on the first `rotary_dim` dims of
each head turned in adjacent pairs (`rotate_every_two`: `GPTConfig.rope_interleaved`), at
base 10000 and without scaling (GPT-J's config has no field for either).

Names: `transformer.h.{i}.attn.q_proj`, ..., `mlp.fc_in` / `mlp.fc_out`, `transformer.ln_f`,
`lm_head` (with its bias). Old checkpoints' causal-mask buffers (`attn.bias`,
`attn.masked_bias`) are skipped, as for GPT-2.
"""

from __future__ import annotations

import math
from typing import Any

from ..model.gpt import GPTConfig
from .fields import MAX_CONTEXT, Fields
from .registry import Family, WeightMap

# GPTJConfig holds neither: transformers' GPT-J always scales by 1/sqrt(head_dim) and always
# rotates (`rotary`, `scale_attn_weights` are GPT-J-6B config.json's, from mesh-transformer-
# jax's export); the rest are the converted checkpoint's own bookkeeping
IRRELEVANT = frozenset({"rotary", "scale_attn_weights", "task_specific_params",
                        "tokenizer_class"})

WEIGHTS = WeightMap(
    top={"wte": "transformer.wte", "ln_f": "transformer.ln_f", "lm_head": "lm_head"},
    layer="transformer.h.{i}.",
    block={"ln_1": "ln_1", "attn.query": "attn.q_proj", "attn.key": "attn.k_proj",
           "attn.value": "attn.v_proj", "attn.out_proj": "attn.out_proj",
           "mlp.fc": "mlp.fc_in", "mlp.proj": "mlp.fc_out"},
    base="transformer.",
)


def _rotary_part(f: Fields, head_dim: int, n_embd: int) -> float:
    """rotary_pct for GPT-J's rotary_dim (64 of GPT-J-6B's 256): transformers builds its
    frequencies over rotary_dim, or over the whole hidden size when it is null, which fits a
    head only when there is one."""
    dims = f.nullable("rotary_dim", 64)
    if dims is None:
        dims = n_embd
    if isinstance(dims, bool) or not isinstance(dims, int) or not 0 < dims <= head_dim or dims % 2:
        raise f.refuse("rotary_dim", f.hf.get("rotary_dim", 64),
                       f"must be an even number of dims within a head ({head_dim})")
    part = dims / head_dim
    return part if int(head_dim * part) == dims else math.nextafter(part, 1.0)


def _config(f: Fields) -> dict[str, Any]:
    n_embd, n_head = f.count("n_embd", 4096), f.count("n_head", 16)
    if n_embd % n_head:
        raise f.refuse("n_embd", n_embd, f"must be a multiple of n_head={n_head}")
    return dict(
        vocab_size=f.count("vocab_size", 50400),
        block_size=f.count("n_positions", 2048, MAX_CONTEXT),
        n_layer=f.count("n_layer", 28), n_head=n_head, n_embd=n_embd,
        d_ff=None if f.get("n_inner") is None else f.count("n_inner"),
        pos="rope", rope_theta=10000.0, rotary_pct=_rotary_part(f, n_embd // n_head, n_embd),
        rope_interleaved=True, scores_in_float32=True,
        norm="layernorm", norm_eps=f.number("layer_norm_epsilon", 1e-5),
        mlp="gelu", gelu=f.gelu("activation_function", "gelu_new"), bias=True,
        qkv_bias=False, out_bias=False, parallel_residual=True, shared_norm=True,
        head_bias=True, tie_weights=f.flag("tie_word_embeddings", False),
    )


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return {
        "architectures": [GPTJ.architecture], "model_type": GPTJ.model_type,
        "vocab_size": c.vocab_size, "n_positions": c.block_size, "n_embd": c.n_embd,
        "n_layer": c.n_layer, "n_head": c.n_head, "n_inner": c.d_ff,
        "rotary_dim": int(c.head_size * c.rotary_pct),
        "activation_function": "gelu" if c.gelu == "exact" else "gelu_new",
        "layer_norm_epsilon": c.norm_eps, "tie_word_embeddings": c.tie_weights,
    }


GPTJ = Family(
    name="gptj", model_type="gptj", architecture="GPTJForCausalLM",
    base_architecture="GPTJModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
