"""EXAONE 3.0 / 3.5 (LG AI Research's EXAONE-3.5-2.4B / 7.8B / 32B): Llama's computation, which
transformers 5 runs as LlamaForCausalLM for model_type "exaone". The releases name their
tensors their own way (`transformer.h.{i}.attn.attention.q_proj`, `mlp.c_fc_0` for the gate,
`mlp.c_fc_1` for up, ...) and some config fields too (`num_layers`, `layer_norm_epsilon`,
`activation_function`); both are read as transformers reads them (its conversion mapping's
renames, its config's attribute_map), and a directory transformers saved (Llama's names)
reads the same. An export writes what transformers writes: Llama's names under
model_type "exaone".
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family

# transformers' conversion mapping for "exaone", in its order: the releases' names -> Llama's
RENAMES = (
    (r"^transformer\.wte\.", "model.embed_tokens."), (r"^transformer\.h\.", "model.layers."),
    (r"^transformer\.ln_f\.", "model.norm."), (r"\.attn\.attention\.", ".self_attn."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."), (r"\.ln_1\.", ".input_layernorm."),
    (r"\.ln_2\.", ".post_attention_layernorm."), (r"\.mlp\.c_fc_0\.", ".mlp.gate_proj."),
    (r"\.mlp\.c_fc_1\.", ".mlp.up_proj."), (r"\.mlp\.c_proj\.", ".mlp.down_proj."))
# ExaoneConfig's attribute_map: the releases' spellings of Llama's fields
SPELLINGS = {"num_layers": "num_hidden_layers", "layer_norm_epsilon": "rms_norm_eps",
             "activation_function": "hidden_act"}
# ExaoneConfig's defaults where they differ from those llama_like_config assumes
DEFAULTS = {"vocab_size": 102400, "intermediate_size": 14336, "num_key_value_heads": 8,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5}
# the releases' pointer to their own modeling code, which transformers 5 does not run
IRRELEVANT = frozenset({"auto_map"})


def _config(f: Fields) -> dict[str, Any]:
    for spelling, field in SPELLINGS.items():
        if spelling in f.hf:
            value = f.hf.pop(spelling)
            if f.hf.setdefault(field, value) != value:
                raise f.refuse(spelling, value, f"{field}={f.hf[field]!r} says otherwise")
    f.setdefaults(DEFAULTS)
    attention_bias = f.flag("attention_bias", False)
    return llama_like_config(
        f, max_positions=4096, rope=dict(default_theta=500000.0), bias=f.flag("mlp_bias", False),
        qkv_bias=attention_bias, out_bias=attention_bias)


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, EXAONE, attention_bias=c.qkv_biased, mlp_bias=c.bias)


EXAONE = Family(
    name="exaone", model_type="exaone", architecture="LlamaForCausalLM",
    base_architecture="LlamaModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=LLAMA_WEIGHTS, irrelevant=IRRELEVANT, renames=RENAMES,
    aliases=("ExaoneForCausalLM", "ExaoneModel"),
)
