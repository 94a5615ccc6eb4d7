"""GemmaForCausalLM: Llama-style blocks with Gemma's three differences, each a GPTConfig
switch: token embeddings times sqrt(hidden_size) (`scale_embeddings`), an RMSNorm computed
in float32 and scaled by (1 + weight) (`norm="gemma_rmsnorm"`; the files store the weight
itself, so export writes what it read), and a GeGLU MLP (`mlp="geglu"`, tanh GELU on the gate).
Heads are often wider than hidden_size / heads (head_dim 256), the head is tied, and the
weight names are Llama's (`post_attention_layernorm` is the norm before the MLP, as in Llama).

Gemma 2 is `gemma2.py`, Gemma 3 (text) `gemma3.py`.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import GELUS, Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family

# transformers 5's GemmaConfig turns the legacy "gelu" of the first releases into the tanh form
# (`hidden_act="gelu"` ... "is meant to target the tanh approximation"), so every GELU name is it
_GELU_NAMES = (*GELUS, "gelu_pytorch_tanh")
# Gemma's MLP reads hidden_act alone in transformers 5; hub configs also carry the newer name
IRRELEVANT = ("hidden_activation",)


def _config(f: Fields) -> dict[str, Any]:
    f.one_of("hidden_act", _GELU_NAMES, "gelu_pytorch_tanh")
    if f.get("use_bidirectional_attention"):
        raise f.refuse("use_bidirectional_attention", True, "attnlab's attention is causal "
                       "(an embedding model's bidirectional attention is not supported)")
    attention_bias = f.flag("attention_bias", False)
    return llama_like_config(
        f, max_positions=8192, default_head_dim=256, bias=False, qkv_bias=attention_bias,
        out_bias=attention_bias, norm="gemma_rmsnorm", mlp="geglu", gelu="tanh",
        scale_embeddings=True, tie_weights=f.flag("tie_word_embeddings", True),
    )


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, GEMMA, hidden_act="gelu_pytorch_tanh",
                            attention_bias=c.qkv_biased)


GEMMA = Family(
    name="gemma", model_type="gemma", architecture="GemmaForCausalLM",
    base_architecture="GemmaModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=LLAMA_WEIGHTS, irrelevant=frozenset(IRRELEVANT),
)
