"""GraniteMoeForCausalLM (Granite 3.0 / 3.1 1B-A400M and 3B-A800M, the mixtures small enough
for a laptop): Granite's four scalars (granite.py) with a mixture of `num_local_experts`
SwiGLU experts `intermediate_size` wide for the MLP. Its router takes each token's top
`num_experts_per_tok` logits and weighs those experts by a softmax over them alone
(`experts_from_top_logits`), rounded to the model's dtype before they multiply. Its files
hold each layer's experts as two 3-D tensors: `input_linear` (n_experts, 2 x width, hidden:
gate rows, then up) and `output_linear` (n_experts, hidden, width), split on import and
stacked on export (`Stacked`); the router is `router.layer`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ..model.gpt import GPTConfig
from .fields import Fields
from .granite import SCALARS
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .mixtral import ROUTER_TRAINING, experts_from_hf
from .registry import Family, Stacked, WeightMap

WEIGHTS = WeightMap(
    top=LLAMA_WEIGHTS.top, layer=LLAMA_WEIGHTS.layer, base=LLAMA_WEIGHTS.base,
    block={**{k: v for k, v in LLAMA_WEIGHTS.block.items() if not k.startswith("mlp.")},
           "mlp.router": "block_sparse_moe.router.layer"},
    stacked=(Stacked("block_sparse_moe.input_linear.weight", ("gate", "fc")),
             Stacked("block_sparse_moe.output_linear.weight", ("proj",))),
)
# transformers 5's names in memory -> its files' (the same tensors, other names)
IN_MEMORY = {"router.weight": "router.layer.weight", "experts.gate_up_proj": "input_linear.weight",
             "experts.down_proj": "output_linear.weight"}


def _from_memory(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    out = {}
    for name, tensor in state.items():
        match = re.fullmatch(r"(.*\.block_sparse_moe\.)(.*)", name)
        out[name if match is None or match[2] not in IN_MEMORY
            else match[1] + IN_MEMORY[match[2]]] = tensor
    return out


def _config(f: Fields) -> dict[str, Any]:
    attention_bias = f.flag("attention_bias", False)
    scalars: dict[str, Any] = {name: f.number(name, 1.0) for name in SCALARS}
    return llama_like_config(
        f, max_positions=2048, bias=False, qkv_bias=attention_bias, out_bias=attention_bias,
        attn_scale=f.number("attention_multiplier", 1.0), expert_weights_in_float32=False,
        experts_from_top_logits=True, **scalars,
        **experts_from_hf(f, "num_local_experts", normalized=True))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, GRANITEMOE, attention_bias=c.qkv_biased,
                            attention_multiplier=c.score_scale,
                            num_local_experts=c.n_experts,
                            num_experts_per_tok=c.experts_per_token,
                            **{name: getattr(c, name) for name in SCALARS})


GRANITEMOE = Family(
    name="granitemoe", model_type="granitemoe", architecture="GraniteMoeForCausalLM",
    base_architecture="GraniteMoeModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=ROUTER_TRAINING, from_memory=_from_memory,
)
