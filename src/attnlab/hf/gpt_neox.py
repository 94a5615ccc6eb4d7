"""GPTNeoXForCausalLM (Pythia): LayerNorm with bias, the exact GELU MLP, RoPE on the first
`rotary_pct` of each head (rotate-half layout, the rest passed through), and a parallel
residual (x + attn(ln_1(x)) + mlp(ln_2(x))) unless `use_parallel_residual` is false.

q, k and v live in one `attention.query_key_value` Linear laid out per head: its output
rows are (nh, 3, hs), not (3, nh, hs) (transformers views them as (..., nh, 3 * hs)).
The head is `embed_out`; Pythia pads vocab_size past the tokenizer's (50304 vs 50277), so
the logits are wider than the vocabulary, as in transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..model.gpt import GPTConfig
from .fields import MAX_CONTEXT, Fields, rope_from_hf, rope_to_hf
from .registry import QKV, Family, Fused, WeightMap


def split_per_head(qkv: Tensor, config: GPTConfig) -> tuple[Tensor, Tensor, Tensor]:
    """query_key_value weight (nh*3*hs, C) or bias (nh*3*hs,) -> q, k, v (nh*hs, ...)."""
    nh = config.n_head
    per_head = qkv.view(nh, 3, -1, *qkv.shape[1:])  # (nh, 3, hs[, C])
    q, k, v = (per_head[:, j].reshape(-1, *qkv.shape[1:]) for j in range(3))  # (nh*hs[, C])
    return q, k, v


def join_per_head(parts: Sequence[Tensor], config: GPTConfig) -> Tensor:
    q, k, v = parts
    nh = config.n_head
    per_head = [t.reshape(nh, 1, -1, *t.shape[1:]) for t in (q, k, v)]  # (nh, 1, hs[, C])
    return torch.cat(per_head, dim=1).reshape(-1, *q.shape[1:])  # (nh*3*hs[, C])


WEIGHTS = WeightMap(
    top={"wte": "gpt_neox.embed_in", "ln_f": "gpt_neox.final_layer_norm",
         "lm_head": "embed_out"},
    layer="gpt_neox.layers.{i}.",
    block={"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm",
           "attn.out_proj": "attention.dense", "mlp.fc": "mlp.dense_h_to_4h",
           "mlp.proj": "mlp.dense_4h_to_h"},
    base="gpt_neox.",
    fused=(Fused("attention.query_key_value", QKV, split_per_head, join_per_head),),
)


def _config(f: Fields) -> dict[str, Any]:
    n_embd, n_head = f.count("hidden_size", 6144), f.count("num_attention_heads", 64)
    block_size = f.count("max_position_embeddings", 2048, MAX_CONTEXT)
    theta, scaling, partial = rope_from_hf(f, max_positions=block_size,
                                           theta_key="rotary_emb_base",
                                           partial_key="rotary_pct", default_partial=0.25)
    attention_bias = f.flag("attention_bias", True)
    return dict(
        vocab_size=f.count("vocab_size", 50432),
        block_size=block_size,
        n_layer=f.count("num_hidden_layers", 44), n_head=n_head, n_embd=n_embd,
        d_ff=f.count("intermediate_size", 24576),
        pos="rope", rope_theta=theta, rope_scaling=scaling, rotary_pct=partial,
        norm="layernorm", norm_eps=f.number("layer_norm_eps", 1e-5),
        mlp="gelu", gelu=f.gelu("hidden_act", "gelu"), bias=True,
        qkv_bias=attention_bias, out_bias=attention_bias,
        parallel_residual=f.flag("use_parallel_residual", True),
        tie_weights=f.flag("tie_word_embeddings", False),
    )


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return {
        "architectures": [GPT_NEOX.architecture], "model_type": GPT_NEOX.model_type,
        "vocab_size": c.vocab_size, "hidden_size": c.n_embd, "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head, "intermediate_size": c.d_ff or 4 * c.n_embd,
        "hidden_act": "gelu" if c.gelu == "exact" else "gelu_new",
        "max_position_embeddings": c.block_size, "layer_norm_eps": c.norm_eps,
        "rope_parameters": rope_to_hf(c, partial=True),
        "use_parallel_residual": c.parallel_residual,
        "attention_bias": c.qkv_biased,
        "tie_word_embeddings": c.tie_weights,
    }


GPT_NEOX = Family(
    name="gpt_neox", model_type="gpt_neox", architecture="GPTNeoXForCausalLM",
    base_architecture="GPTNeoXModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS,
)
