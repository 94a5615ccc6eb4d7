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

import dataclasses
from typing import Any

from ..model.gpt import GPTConfig
from .falcon import join_multi_query, split_multi_query
from .fields import Fields
from .gpt2 import WEIGHTS as GPT2_WEIGHTS
from .gpt2 import gpt2_like_config, gpt2_like_to_hf
from .registry import QKV, Family, Fused

# GPT-2's names, in nn.Linear's (out, in) layout (nothing transposed), c_attn [q | k | v]
WEIGHTS = dataclasses.replace(
    GPT2_WEIGHTS, transposed=frozenset(),
    fused=(Fused("attn.c_attn", QKV, split_multi_query, join_multi_query),))
# (num_key_value_heads: transformers 5 writes it and sets it again from multi_query)
IRRELEVANT = frozenset({
    "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32", "inference_runner",
    "max_batch_size", "max_sequence_length", "pad_key_length", "pre_allocate_kv_cache",
    "validate_runner_input", "n_ctx", "num_key_value_heads"})


def _config(f: Fields) -> dict[str, Any]:
    return {**gpt2_like_config(f, "gelu_pytorch_tanh"),
            "n_kv_head": 1 if f.flag("multi_query", True) else None}


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return {**gpt2_like_to_hf(c, GPT_BIGCODE, "gelu_pytorch_tanh"),
            "multi_query": c.n_kv_heads == 1}


GPT_BIGCODE = Family(
    name="gpt_bigcode", model_type="gpt_bigcode", architecture="GPTBigCodeForCausalLM",
    base_architecture="GPTBigCodeModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
