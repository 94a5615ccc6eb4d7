"""FalconForCausalLM, the first architecture (Falcon-7B and its instruct model): with
`parallel_attn`, attention and the exact-GELU MLP side by side on one LayerNorm
(`shared_norm`), else one after the other; multi-query attention (`multi_query`: one key and
value head) whose q, k and v live in one `self_attention.query_key_value` ([q | k | v]
along the output; without multi_query per head, (nh, 3, hs), as GPT-NeoX's); LayerNorms with
a bias beside Linears without (`bias`); RoPE on whole heads; a tied head by default.

transformers divides Falcon's scores by sqrt(hs), attnlab multiplies them by its inverse: the
same math, a rounding apart. Refused: the later architecture (`new_decoder_architecture`,
Falcon-40B / 180B / Falcon2: grouped q/k/v and norms named per branch) and ALiBi positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..model.gpt import GPTConfig
from .fields import MAX_CONTEXT, Fields, rope_from_hf, rope_to_hf
from .gpt_neox import join_per_head, split_per_head
from .registry import QKV, Family, Fused, WeightMap

# transformers reads neither (the first is a pre-port field the model never applied; the
# second points to the hub's custom code, read only with trust_remote_code)
IRRELEVANT = frozenset({"apply_residual_connection_post_layernorm", "auto_map"})


def split_multi_query(qkv: Tensor, config: GPTConfig) -> tuple[Tensor, ...]:
    """A fused q/k/v weight or bias -> q, k, v: [q | k | v] rows with one key/value head, else
    per head (nh, 3, hs) rows (Falcon's query_key_value, GPTBigCode's c_attn)."""
    if config.n_kv_heads != 1:
        return split_per_head(qkv, config)
    hs = config.head_size
    widths = [config.n_head * hs, hs, hs]
    if qkv.shape[0] != sum(widths):
        raise ValueError(f"a fused q/k/v of shape {tuple(qkv.shape)}, expected {sum(widths)} "
                         f"rows for {config.n_head} query heads and one key/value head of "
                         f"{hs}; config.json and the weights disagree")
    return tuple(qkv.split(widths))


def join_multi_query(parts: Sequence[Tensor], config: GPTConfig) -> Tensor:
    """`split_multi_query` the other way: q, k, v -> the fused weight or bias."""
    if config.n_kv_heads != 1:
        return join_per_head(parts, config)
    return torch.cat(list(parts))  # (nh hs + 2 hs, C)


WEIGHTS = WeightMap(
    top={"wte": "transformer.word_embeddings", "ln_f": "transformer.ln_f", "lm_head": "lm_head"},
    layer="transformer.h.{i}.",
    block={"ln_1": "input_layernorm", "ln_2": "post_attention_layernorm",
           "attn.out_proj": "self_attention.dense", "mlp.fc": "mlp.dense_h_to_4h",
           "mlp.proj": "mlp.dense_4h_to_h"},
    base="transformer.",
    fused=(Fused("self_attention.query_key_value", QKV, split_multi_query, join_multi_query),),
)


def _config(f: Fields) -> dict[str, Any]:
    for key, why in (("new_decoder_architecture", "Falcon-40B / 180B's later blocks (grouped "
                      "q/k/v, a norm per branch) are not built"),
                     ("alibi", "attnlab's positions are learned or rotary, not ALiBi")):
        if f.flag(key, False):
            raise f.refuse(key, True, why)
    f.get("num_ln_in_parallel_attn")  # read by the later architecture alone
    n_embd, n_head = f.count("hidden_size", 4544), f.count("num_attention_heads", 71)
    multi_query = f.flag("multi_query", True)
    n_kv = f.count("num_kv_heads", n_head)
    if not multi_query and n_kv != n_head:
        raise f.refuse("num_kv_heads", n_kv, f"the first architecture without multi_query "
                       f"has a key/value head per query head ({n_head})")
    parallel = f.flag("parallel_attn", True)
    block_size = f.count("max_position_embeddings", 2048, MAX_CONTEXT)
    theta, scaling, _ = rope_from_hf(f, max_positions=block_size)
    return dict(
        vocab_size=f.count("vocab_size", 65024), block_size=block_size,
        n_layer=f.count("num_hidden_layers", 32), n_head=n_head,
        n_kv_head=1 if multi_query else n_head, n_embd=n_embd,
        d_ff=f.count("ffn_hidden_size", 4 * n_embd), pos="rope", rope_theta=theta,
        rope_scaling=scaling, norm="layernorm", norm_eps=f.number("layer_norm_epsilon", 1e-5),
        mlp="gelu", gelu=f.gelu("activation", "gelu"), bias=f.flag("bias", False),
        norm_bias=True, parallel_residual=parallel, shared_norm=parallel,
        tie_weights=f.flag("tie_word_embeddings", True),
    )


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return {
        "architectures": [FALCON.architecture], "model_type": FALCON.model_type,
        "vocab_size": c.vocab_size, "hidden_size": c.n_embd, "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head, "num_kv_heads": c.n_kv_heads,
        "multi_query": c.n_kv_heads == 1, "new_decoder_architecture": False, "alibi": False,
        "parallel_attn": c.parallel_residual, "bias": c.bias, "ffn_hidden_size": c.ff_size,
        "activation": "gelu" if c.gelu == "exact" else "gelu_pytorch_tanh",
        "layer_norm_epsilon": c.norm_eps, "max_position_embeddings": c.block_size,
        "tie_word_embeddings": c.tie_weights, "rope_parameters": rope_to_hf(c),
    }


FALCON = Family(
    name="falcon", model_type="falcon", architecture="FalconForCausalLM",
    base_architecture="FalconModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
