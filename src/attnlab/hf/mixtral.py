"""MixtralForCausalLM (Mixtral 8x7B, 8x22B): Mistral's blocks with a sparse mixture of
experts for the MLP (`GPTConfig.n_experts`): a router (`block_sparse_moe.gate`) sends each
token to its `num_experts_per_tok` most probable of `num_local_experts` SwiGLU experts
(`experts.{e}.w1` gate, `w3` up, `w2` down), weighted by their softmax probabilities
renormalised over the chosen. The expert helpers here serve OLMoE and Qwen3-MoE too.

transformers 5 holds each layer's experts as two 3-D tensors in memory and writes them
per expert, as the released files store them: attnlab reads and writes the files' names,
and `split_experts` turns a state dict in memory into them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import partial
from typing import Any

from torch import Tensor

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family, WeightMap

# training-only router settings: the auxiliary load-balancing loss, the router's noise
ROUTER_TRAINING = frozenset({"output_router_logits", "router_aux_loss_coef",
                             "router_jitter_noise"})


def moe_weights(moe: str, experts: str, gate: str, up: str, down: str) -> WeightMap:
    """LLAMA_WEIGHTS with the MLP a mixture: the router at `moe`.gate and expert e's
    matrices at `experts`.{e}.`gate` / `up` / `down` in each layer."""
    block = {k: v for k, v in LLAMA_WEIGHTS.block.items() if not k.startswith("mlp.")}
    return WeightMap(top=LLAMA_WEIGHTS.top, layer=LLAMA_WEIGHTS.layer, base=LLAMA_WEIGHTS.base,
                     block={**block, "mlp.router": f"{moe}.gate",
                            "mlp.experts.{e}.gate": f"{experts}.{{e}}.{gate}",
                            "mlp.experts.{e}.fc": f"{experts}.{{e}}.{up}",
                            "mlp.experts.{e}.proj": f"{experts}.{{e}}.{down}"})


def split_experts(state: Mapping[str, Tensor], weights: WeightMap) -> dict[str, Tensor]:
    """A transformers 5 model's state dict in memory, whose mixtures hold each layer's router
    at mlp.gate and its experts in mlp.experts.gate_up_proj (E, 2F, C: gate rows, then up)
    and mlp.experts.down_proj (E, C, F), under the names its files use (`weights`'): views,
    one per expert. Other names pass as they are; a state dict of files' names, unchanged."""
    out: dict[str, Tensor] = {}
    for name, tensor in state.items():
        match = re.fullmatch(r"(.*layers\.\d+\.)mlp\.(gate\.weight|experts\.gate_up_proj|"
                             r"experts\.down_proj)", name)
        if match is None:
            out[name] = tensor
            continue
        layer, part = match.groups()
        if part == "gate.weight":
            out[f"{layer}{weights.block['mlp.router']}.weight"] = tensor
            continue
        halves = tensor.chunk(2, dim=1) if part.endswith("gate_up_proj") else (tensor,)
        ours = ("gate", "fc") if part.endswith("gate_up_proj") else ("proj",)
        for e in range(tensor.shape[0]):
            for module, half in zip(ours, halves, strict=True):
                hf = weights.block[f"mlp.experts.{{e}}.{module}"].format(e=e)
                out[f"{layer}{hf}.weight"] = half[e]  # (F, C) or (C, F)
    return out


def experts_from_hf(f: Fields, count_key: str, normalized: bool) -> dict[str, Any]:
    """GPTConfig's mixture fields: the expert count at `count_key` (or its other spelling,
    which transformers maps onto it), the top-k, and whether the chosen are renormalised."""
    other = {"num_local_experts": "num_experts", "num_experts": "num_local_experts"}[count_key]
    key = other if f.has(other) and not f.has(count_key) else count_key
    n = f.count(key, 8)
    if f.has(other) and f.count(other) != n:
        raise f.refuse(other, f.hf[other], f"{key}={n} names the experts too; keep one")
    return dict(n_experts=n, experts_per_token=f.count("num_experts_per_tok", 2, limit=n),
                experts_normalized=normalized)


def _config(f: Fields) -> dict[str, Any]:
    window = f.get("sliding_window")
    return llama_like_config(f, max_positions=131072, bias=False, sliding_window=window,
                             rope=dict(default_theta=1e6),
                             **experts_from_hf(f, "num_local_experts", normalized=True))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, MIXTRAL, sliding_window=c.sliding_window,
                            num_local_experts=c.n_experts,
                            num_experts_per_tok=c.experts_per_token)


WEIGHTS = moe_weights("block_sparse_moe", "block_sparse_moe.experts", "w1", "w3", "w2")
MIXTRAL = Family(
    name="mixtral", model_type="mixtral", architecture="MixtralForCausalLM",
    base_architecture="MixtralModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=ROUTER_TRAINING,
    from_memory=partial(split_experts, weights=WEIGHTS),
)
