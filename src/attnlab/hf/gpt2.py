"""GPT2LMHeadModel: learned positions, pre-LayerNorm, the tanh GELU ("gelu_new") MLP.

GPT-2 stores its linear layers as `Conv1D` with weights (in, out), and q, k and v fused in
one `c_attn` of width 3C ([q | k | v] along the output); attnlab keeps `nn.Linear` (out, in)
names (over (in, out) memory but for the MLP's down projection: `GPT.lay_out_weights`)
and separate query / key / value projections, so the mapping transposes and splits (and
on export joins back).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..model.gpt import GPTConfig
from .fields import MAX_CONTEXT, Fields
from .registry import QKV, Family, Fused, WeightMap


def _split(qkv: Tensor, config: GPTConfig) -> tuple[Tensor, Tensor, Tensor]:
    """c_attn weight (C, 3C) (Conv1D: in, out) or bias (3C,) -> q, k, v as Linear (C, C)."""
    C = config.n_embd
    if qkv.shape[-1] != 3 * C:
        raise ValueError(
            f"GPT-2 c_attn has shape {tuple(qkv.shape)}, expected last dim {3 * C} for "
            f"n_embd={C}; config.json and the weights disagree"
        )
    q, k, v = qkv.split(C, dim=-1)  # (C, C) each, (in, out); or (C,)
    return (q.t(), k.t(), v.t()) if qkv.dim() == 2 else (q, k, v)


def _join(parts: Sequence[Tensor], config: GPTConfig) -> Tensor:
    q, k, v = parts
    return torch.cat([q, k, v], dim=0).t() if q.dim() == 2 else torch.cat([q, k, v])  # (C, 3C)


WEIGHTS = WeightMap(
    top={"wte": "transformer.wte", "wpe": "transformer.wpe", "ln_f": "transformer.ln_f",
         "lm_head": "lm_head"},
    layer="transformer.h.{i}.",
    block={"ln_1": "ln_1", "ln_2": "ln_2", "attn.out_proj": "attn.c_proj",
           "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"},
    base="transformer.",
    transposed=frozenset({"attn.out_proj", "mlp.fc", "mlp.proj"}),
    fused=(Fused("attn.c_attn", QKV, _split, _join),),
)
# reorder_and_upcast_attn only changes the order and precision of the score product
# (the same math); n_ctx is an old alias of n_positions that nothing reads
IRRELEVANT = frozenset({"reorder_and_upcast_attn", "n_ctx"})


def gpt2_like_config(f: Fields, gelu: str) -> dict[str, Any]:
    """GPTConfig keyword arguments for the fields GPT-2's config.json shares with GPTBigCode's,
    `gelu` the activation_function their config class falls back on."""
    n_embd = f.count("n_embd", 768)
    return dict(
        vocab_size=f.count("vocab_size", 50257),
        block_size=f.count("n_positions", 1024, MAX_CONTEXT),
        n_layer=f.count("n_layer", 12), n_head=f.count("n_head", 12), n_embd=n_embd,
        d_ff=f.count("n_inner", 4 * n_embd),
        norm_eps=f.number("layer_norm_epsilon", 1e-5),
        gelu=f.gelu("activation_function", gelu),
        tie_weights=f.flag("tie_word_embeddings", True),
        attn_scale=None if f.flag("scale_attn_weights", True) else 1.0,
    )


def gpt2_like_to_hf(c: GPTConfig, family: Family, tanh: str) -> dict[str, Any]:
    """`gpt2_like_config` the other way, `tanh` the name of the tanh GELU it writes."""
    return {
        "architectures": [family.architecture], "model_type": family.model_type,
        "vocab_size": c.vocab_size, "n_positions": c.block_size, "n_embd": c.n_embd,
        "n_layer": c.n_layer, "n_head": c.n_head,
        "n_inner": None if c.d_ff in (None, 4 * c.n_embd) else c.d_ff,
        "activation_function": tanh if c.gelu == "tanh" else "gelu",
        "layer_norm_epsilon": c.norm_eps, "resid_pdrop": c.dropout, "embd_pdrop": c.dropout,
        "attn_pdrop": c.dropout, "scale_attn_weights": c.attn_scale is None,
        "tie_word_embeddings": c.tie_weights,
    }


def _config(f: Fields) -> dict[str, Any]:
    if f.flag("scale_attn_by_inverse_layer_idx", False):
        raise f.refuse("scale_attn_by_inverse_layer_idx", True, "attnlab scales every "
                       "layer's scores alike (1/sqrt(hs))")
    return gpt2_like_config(f, "gelu_new")


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return gpt2_like_to_hf(c, GPT2, "gelu_new")


GPT2 = Family(
    name="gpt2", model_type="gpt2", architecture="GPT2LMHeadModel",
    base_architecture="GPT2Model", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
