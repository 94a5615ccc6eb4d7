"""Ernie4_5_MoeForCausalLM (Baidu's ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B): dense ERNIE
4.5's attention (`ernie4_5.py`: RoPE on adjacent pairs in float32, head_dim hidden_size /
heads unless config.json names one, tied embeddings by default) with

- a mixture of `moe_num_experts` SwiGLU experts `moe_intermediate_size` wide whose router
  (`mlp.gate`, in float32: float32 logits of the float32 input) picks `moe_k` by softmax
  probability plus a correction bias (`mlp.moe_statics.e_score_correction_bias`, (1, E) in
  the files, a float32 buffer here) and weighs them by their unbiased probabilities
  renormalised by their sum clamped at `moe_norm_min`, rounded to the model's dtype before
  they multiply (`GPTConfig.router_scoring="softmax_corrected"`); beside them
  `moe_num_shared_experts` shared experts in one ungated MLP (`mlp.shared_experts`);
- the mixture on the layers from `moe_layer_start_index` to `moe_layer_end_index` (-1: the
  last) whose index + 1 is a multiple of `moe_layer_interval`, the others with one dense
  MLP `intermediate_size` wide (`GPTConfig.mixture_layers`, or `dense_layers` where the
  mixtures are every layer from one on).

Baidu's configs also state keys only its own code reads (`BAIDU_ONLY`), accepted as
transformers accepts them, and their files may hold a multi-token-prediction layer ("mtp"
tensors), left unread as transformers leaves it. Refused: `use_rmsnorm=false`, `is_quantized=true`,
`use_bias=true`, which in transformers biases the attention, the dense and shared
MLPs and the output head but not the routed experts (attnlab's one `bias` switch biases
every MLP alike); no released ERNIE 4.5 MoE sets it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from ..model.gpt import GPTConfig
from .fields import Fields
from .glm4_moe import DEEPSEEK_WEIGHTS
from .llama import llama_like_config, llama_like_to_hf
from .mixtral import ROUTER_TRAINING, split_experts
from .registry import Family

_BIAS = "mlp.router.e_score_correction_bias"
# GLM-4.5's names but for the correction bias, which sits beside the router, (1, E)
WEIGHTS = dataclasses.replace(
    DEEPSEEK_WEIGHTS, block={**DEEPSEEK_WEIGHTS.block,
                             _BIAS: "mlp.moe_statics.e_score_correction_bias"},
    reshaped={_BIAS: (lambda t: t.reshape(-1), lambda t: t[None])},
    unread="mtp")  # the multi-token-prediction layer's tensors, which transformers skips
# what Baidu's own code reads and transformers does not, none of it in a forward: the gate's
# training kernel, the correction bias's switch (transformers always adds the files' bias),
# the multi-token-prediction layers and their loss weight
BAIDU_ONLY = frozenset({"moe_gate", "moe_use_aux_free", "num_nextn_predict_layers",
                        "multi_token_pred_lambda"})

# Ernie4_5_MoeConfig's defaults (ERNIE-4.5-21B-A3B's shape) where they differ from those
# `llama_like_config` assumes
DEFAULTS = {"vocab_size": 103424, "hidden_size": 2560, "intermediate_size": 12288,
            "num_hidden_layers": 28, "num_attention_heads": 20, "num_key_value_heads": 4}


def _integer(f: Fields, key: str, default: int) -> int:
    value = f.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise f.refuse(key, value, "expected an integer")
    return value


def mixture_layers_from(f: Fields, n_layer: int) -> list[int]:
    """The layers Ernie4_5_MoeDecoderLayer gives a mixture: (i + 1) % interval == 0 and
    start <= i <= end."""
    start = _integer(f, "moe_layer_start_index", 1)
    end = _integer(f, "moe_layer_end_index", -1)
    interval = _integer(f, "moe_layer_interval", 1)
    if interval < 1:
        raise f.refuse("moe_layer_interval", interval, "expected a positive integer (a "
                       "mixture on every interval-th layer)")
    end = n_layer - 1 if end == -1 else end  # as Ernie4_5_MoeConfig.__post_init__ reads it
    layers = [i for i in range(n_layer) if (i + 1) % interval == 0 and start <= i <= end]
    if not layers:
        raise f.refuse("moe_layer_start_index", start, f"with moe_layer_end_index={end} and "
                       f"moe_layer_interval={interval} none of the {n_layer} layers is a "
                       "mixture; a dense ERNIE 4.5 is model_type ernie4_5")
    return layers


def _experts(f: Fields, n_layer: int) -> dict[str, Any]:
    """GPTConfig's mixture fields from ERNIE 4.5 MoE's config.json (module doc)."""
    keys = {"moe_num_experts": "num_experts", "moe_k": "num_experts_per_tok"}  # attribute_map
    values: dict[str, int] = {}
    for ours, other in keys.items():
        key = other if f.has(other) and not f.has(ours) else ours
        limit = values.get("moe_num_experts", 2**20)
        values[ours] = f.count(key, {"moe_num_experts": 64, "moe_k": 6}[ours], limit=limit)
        if f.has(other) and f.count(other, limit=limit) != values[ours]:
            raise f.refuse(other, f.hf[other], f"{key}={values[ours]} names it too; keep one")
    shared = _integer(f, "moe_num_shared_experts", 2)
    floor = f.get("moe_norm_min", 1e-12)
    if isinstance(floor, bool) or not isinstance(floor, int | float) or not (
            math.isfinite(floor) and floor >= 0):
        raise f.refuse("moe_norm_min", floor, "expected a finite number >= 0")
    if shared < 0:
        raise f.refuse("moe_num_shared_experts", shared, "expected 0 or more")
    width = f.count("moe_intermediate_size", 1536)
    layers = mixture_layers_from(f, n_layer)
    # every layer from one on: said as dense_layers, as GLM-4.5's are
    suffix = layers == list(range(layers[0], n_layer))
    return dict(
        n_experts=values["moe_num_experts"], experts_per_token=values["moe_k"],
        experts_normalized=True, expert_weights_in_float32=False,
        router_scoring="softmax_corrected", router_norm_min=float(floor),
        shared_expert_size=width * shared or None, shared_expert_gated=False, d_ff=width,
        dense_layers=layers[0] if suffix else 0, mixture_layers=None if suffix else layers,
        dense_d_ff=f.count("intermediate_size"))


def _config(f: Fields) -> dict[str, Any]:
    f.setdefaults(DEFAULTS)
    for key in ("use_rmsnorm", "is_quantized"):  # Baidu's configs state both
        if f.flag(key, key == "use_rmsnorm") != (key == "use_rmsnorm"):
            raise f.refuse(key, f.hf[key], "transformers' ERNIE 4.5 MoE runs RMSNorm on float "
                           f"weights; expected {str(key == 'use_rmsnorm').lower()}")
    if f.flag("use_bias", False):
        raise f.refuse("use_bias", True, "it biases the attention, the dense and shared MLPs "
                       "and the output head but not the routed experts, which attnlab cannot "
                       "say (its `bias` biases every MLP alike); expected false")
    return llama_like_config(
        f, max_positions=131072, rope=dict(default_theta=500000.0), bias=False,
        qkv_bias=False, out_bias=False, norm_eps=f.number("rms_norm_eps", 1e-5),
        rope_interleaved=True, rope_in_float32=True,
        tie_weights=f.flag("tie_word_embeddings", True),
        **_experts(f, f.count("num_hidden_layers")))


def mixture_layers_to_hf(c: GPTConfig) -> dict[str, int]:
    """`mixture_layers_from` the other way: the first and last mixture and the interval
    that gives the layers between; where none does, interval 1 (which `misfits` names)."""
    layers = [i for i in range(c.n_layer) if c.has_mixture(i)] or list(range(c.n_layer))
    first, last = layers[0], layers[-1]
    interval = next((n for n in range(1, c.n_layer + 1) if layers == [
        i for i in range(first, last + 1) if (i + 1) % n == 0]), 1)
    return dict(moe_layer_start_index=first, moe_layer_end_index=last,
                moe_layer_interval=interval)


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(
        c, ERNIE4_5_MOE, use_bias=False, intermediate_size=c.dense_d_ff or c.ff_size,
        moe_intermediate_size=c.ff_size, moe_num_experts=c.n_experts or c.experts_per_token,
        moe_k=c.experts_per_token, moe_num_shared_experts=(c.shared_expert_size or 0)
        // c.ff_size, moe_norm_min=c.router_norm_min, **mixture_layers_to_hf(c))


def _from_memory(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A transformers model's state dict under its files' names: the experts split
    (`split_experts`), the correction bias out of the router (mlp.gate.moe_statics.*)."""
    return {k.replace(".mlp.gate.moe_statics.", ".mlp.moe_statics."): v
            for k, v in split_experts(state, weights=WEIGHTS).items()}


ERNIE4_5_MOE = Family(
    name="ernie4_5_moe", model_type="ernie4_5_moe", architecture="Ernie4_5_MoeForCausalLM",
    base_architecture="Ernie4_5_MoeModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, from_memory=_from_memory,
    # moe_capacity: the tokens an expert takes in Baidu's training; no forward drops any
    irrelevant=ROUTER_TRAINING | {"moe_capacity"} | BAIDU_ONLY,
)
