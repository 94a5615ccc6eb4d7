"""ArceeForCausalLM (Arcee's AFM-4.5B): Llama's attention and norms with an MLP of no gate,
down(relu(up(x))^2) (`mlp="relu2"`), biases on all four attention projections where
`attention_bias` and on the MLP where `mlp_bias`.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family, WeightMap

WEIGHTS = WeightMap(
    top=LLAMA_WEIGHTS.top, layer=LLAMA_WEIGHTS.layer, base=LLAMA_WEIGHTS.base,
    block={k: v for k, v in LLAMA_WEIGHTS.block.items() if k != "mlp.gate"},
)
# ArceeConfig's defaults (AFM-4.5B's shape) where they differ from llama_like_config's
DEFAULTS = {"hidden_size": 2560, "intermediate_size": 18432}


def _config(f: Fields) -> dict[str, Any]:
    f.setdefaults(DEFAULTS)
    f.one_of("hidden_act", ["relu2"], "relu2")
    attention_bias = f.flag("attention_bias", False)
    return llama_like_config(
        f, max_positions=4096, mlp="relu2", bias=f.flag("mlp_bias", False),
        qkv_bias=attention_bias, out_bias=attention_bias, norm_eps=f.number("rms_norm_eps", 1e-5))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return {**llama_like_to_hf(c, ARCEE, attention_bias=c.qkv_biased, mlp_bias=c.bias),
            "hidden_act": "relu2"}


ARCEE = Family(
    name="arcee", model_type="arcee", architecture="ArceeForCausalLM",
    base_architecture="ArceeModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS,
)
