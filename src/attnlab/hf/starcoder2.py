"""Starcoder2ForCausalLM (StarCoder2-3B, -7B, -15B): GPT-2's blocks (LayerNorms, with their
bias always, and a GELU MLP; the Linears' biases where `use_bias`) with grouped-query
attention, RoPE on whole heads (rotate-half layout) and Mistral's sliding window on every
layer where `sliding_window` is set. Names: Llama's attention and norms, the MLP's
`mlp.c_fc` / `mlp.c_proj`.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family, WeightMap

WEIGHTS = WeightMap(
    top=LLAMA_WEIGHTS.top, layer=LLAMA_WEIGHTS.layer, base=LLAMA_WEIGHTS.base,
    block={**{k: v for k, v in LLAMA_WEIGHTS.block.items() if not k.startswith("mlp.")},
           "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"},
)
# Starcoder2Config's defaults, where they differ from the Llama ones llama_like_config holds
DEFAULTS = {"vocab_size": 49152, "hidden_size": 3072, "intermediate_size": 12288,
            "num_hidden_layers": 30, "num_attention_heads": 24, "num_key_value_heads": 2}
# training-only: the dropout of each branch's output and of the embeddings
IRRELEVANT = frozenset({"residual_dropout", "embedding_dropout"})


def _config(f: Fields) -> dict[str, Any]:
    f.setdefaults(DEFAULTS)
    # the released config.json's training-code switches, which transformers' class ignores:
    # the values its one architecture has
    f.one_of("norm_type", ["layer_norm"], "layer_norm")
    f.one_of("mlp_type", ["default"], "default")
    return llama_like_config(
        f, max_positions=4096, norm="layernorm", norm_eps=f.number("norm_epsilon", 1e-5),
        mlp="gelu", gelu=f.gelu("hidden_act", "gelu_pytorch_tanh"),
        bias=f.flag("use_bias", True), norm_bias=True,  # its LayerNorms' bias, whatever use_bias
        sliding_window=f.get("sliding_window"),
        tie_weights=f.flag("tie_word_embeddings", True))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    hf = llama_like_to_hf(c, STARCODER2, use_bias=c.bias, norm_epsilon=c.norm_eps,
                          hidden_act="gelu" if c.gelu == "exact" else "gelu_pytorch_tanh",
                          sliding_window=c.sliding_window)
    del hf["rms_norm_eps"]
    return hf


STARCODER2 = Family(
    name="starcoder2", model_type="starcoder2", architecture="Starcoder2ForCausalLM",
    base_architecture="Starcoder2Model", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
