"""OPTForCausalLM (OPT-125m, 1.3b, 2.7b, 6.7b, ...): GPT-2's blocks (learned positions, pre-
LayerNorm, biases everywhere) with a ReLU MLP (`mlp="relu"`, fc1 / fc2) and separate q, k, v
projections.

OPT's position table has two more rows than positions: it looks up position p at row p + 2
(fairseq's padding offset; rows 0 and 1 serve only padding). attnlab's table starts at row
2 (`WeightMap.reshaped` slices the two rows off on import and writes two zero rows back on
export). OPT scales q by 1/sqrt(hs) before the product with k, attnlab the product: the
same math, rounded in another place.

Refused: OPT-350m's post-LayerNorm blocks (`do_layer_norm_before` false, or
`_remove_final_layer_norm`) and its 512-wide embedding projected to 1024
(`word_embed_proj_dim` != `hidden_size`), LayerNorms without weights, and `enable_bias` false
(attnlab's `bias` switch gives the LayerNorms their bias too).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..model.gpt import GPTConfig
from .fields import MAX_CONTEXT, Fields
from .registry import Family, WeightMap

OFFSET = 2  # rows of OPT's position table before position 0's
# training-only fields OPT names its own way, and the prompt prefix fairseq generated with
IRRELEVANT = frozenset({"dropout", "activation_dropout", "layerdrop", "init_std", "prefix"})
NEEDED = {"do_layer_norm_before": True, "_remove_final_layer_norm": False,
          "layer_norm_elementwise_affine": True, "enable_bias": True}


def _positions_in(table: Tensor) -> Tensor:
    return table[OFFSET:]  # (max_positions + 2, C) -> (max_positions, C)


def _positions_out(table: Tensor) -> Tensor:
    return torch.cat((table.new_zeros(OFFSET, table.shape[1]), table))  # (max_positions + 2, C)


WEIGHTS = WeightMap(
    top={"wte": "model.decoder.embed_tokens", "wpe": "model.decoder.embed_positions",
         "ln_f": "model.decoder.final_layer_norm", "lm_head": "lm_head"},
    layer="model.decoder.layers.{i}.",
    block={"ln_1": "self_attn_layer_norm", "attn.query": "self_attn.q_proj",
           "attn.key": "self_attn.k_proj", "attn.value": "self_attn.v_proj",
           "attn.out_proj": "self_attn.out_proj", "ln_2": "final_layer_norm",
           "mlp.fc": "fc1", "mlp.proj": "fc2"},
    base="model.",
    reshaped={"wpe.weight": (_positions_in, _positions_out)},
)


def _config(f: Fields) -> dict[str, Any]:
    for key, value in NEEDED.items():
        if f.flag(key, value) != value:
            raise f.refuse(key, not value, "attnlab builds OPT's pre-LayerNorm blocks with "
                           "affine norms and biases (as every OPT but the 350m)")
    n_embd = f.count("hidden_size", 768)
    projected = f.count("word_embed_proj_dim", n_embd)
    if projected != n_embd:
        raise f.refuse("word_embed_proj_dim", projected, f"attnlab's embeddings are "
                       f"hidden_size={n_embd} wide (OPT-350m's projection is not built)")
    f.one_of("activation_function", ("relu",), "relu")
    return dict(
        vocab_size=f.count("vocab_size", 50272),
        block_size=f.count("max_position_embeddings", 2048, MAX_CONTEXT),
        n_layer=f.count("num_hidden_layers", 12), n_head=f.count("num_attention_heads", 12),
        n_embd=n_embd, d_ff=f.count("ffn_dim", 3072), mlp="relu", bias=True, norm_eps=1e-5,
        tie_weights=f.flag("tie_word_embeddings", True),
    )


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return {
        "architectures": [OPT.architecture], "model_type": OPT.model_type,
        "vocab_size": c.vocab_size, "hidden_size": c.n_embd, "word_embed_proj_dim": c.n_embd,
        "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head, "ffn_dim": c.ff_size,
        "max_position_embeddings": c.block_size, "activation_function": "relu",
        "tie_word_embeddings": c.tie_weights, **NEEDED,
    }


OPT = Family(
    name="opt", model_type="opt", architecture="OPTForCausalLM",
    base_architecture="OPTModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
