"""GPTBigCodeForCausalLM (BigCode's StarCoder, StarCoderBase, SantaCoder, tiny_starcoder and
their fine-tunes): GPT-2's blocks (learned positions, biased LayerNorms and Linears, a GELU
MLP, a tied head) in nn.Linear layout, with multi-query attention (`multi_query`: one key and
value head) whose q, k and v live in one `attn.c_attn` ([q | k | v] rows; without
multi_query per head, (nh, 3, hs), as Falcon's).

`attention_softmax_in_fp32` and `scale_attention_softmax_in_fp32` are read by no forward of
transformers 5 (its eager attention takes every softmax in float32), and the releases' runner
fields (`inference_runner`, `max_batch_size`, ...) by none at all.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .falcon import join_multi_query, split_multi_query
from .fields import MAX_CONTEXT, Fields
from .registry import QKV, Family, Fused, WeightMap

WEIGHTS = WeightMap(
    top={"wte": "transformer.wte", "wpe": "transformer.wpe", "ln_f": "transformer.ln_f",
         "lm_head": "lm_head"},
    layer="transformer.h.{i}.",
    block={"ln_1": "ln_1", "ln_2": "ln_2", "attn.out_proj": "attn.c_proj",
           "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"},
    base="transformer.",
    fused=(Fused("attn.c_attn", QKV, split_multi_query, join_multi_query),),
)
# (num_key_value_heads: transformers 5 writes it and sets it again from multi_query)
IRRELEVANT = frozenset({
    "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32", "inference_runner",
    "max_batch_size", "max_sequence_length", "pad_key_length", "pre_allocate_kv_cache",
    "validate_runner_input", "n_ctx", "num_key_value_heads"})


def _config(f: Fields) -> dict[str, Any]:
    n_embd, n_head = f.count("n_embd", 768), f.count("n_head", 12)
    return dict(
        vocab_size=f.count("vocab_size", 50257),
        block_size=f.count("n_positions", 1024, MAX_CONTEXT),
        n_layer=f.count("n_layer", 12), n_head=n_head, n_embd=n_embd,
        n_kv_head=1 if f.flag("multi_query", True) else None,
        d_ff=f.count("n_inner", 4 * n_embd),
        norm_eps=f.number("layer_norm_epsilon", 1e-5),
        gelu=f.gelu("activation_function", "gelu_pytorch_tanh"),
        tie_weights=f.flag("tie_word_embeddings", True),
        attn_scale=None if f.flag("scale_attn_weights", True) else 1.0,
    )


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return {
        "architectures": [GPT_BIGCODE.architecture], "model_type": GPT_BIGCODE.model_type,
        "vocab_size": c.vocab_size, "n_positions": c.block_size, "n_embd": c.n_embd,
        "n_layer": c.n_layer, "n_head": c.n_head, "multi_query": c.n_kv_heads == 1,
        "n_inner": c.ff_size, "layer_norm_epsilon": c.norm_eps,
        "activation_function": "gelu_pytorch_tanh" if c.gelu == "tanh" else "gelu",
        "resid_pdrop": c.dropout, "embd_pdrop": c.dropout, "attn_pdrop": c.dropout,
        "scale_attn_weights": c.attn_scale is None, "tie_word_embeddings": c.tie_weights,
    }


GPT_BIGCODE = Family(
    name="gpt_bigcode", model_type="gpt_bigcode", architecture="GPTBigCodeForCausalLM",
    base_architecture="GPTBigCodeModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
