"""The validation of `GPTConfig`'s mixture-of-experts fields (`config.py` calls it from
`__post_init__`): the counts, the router's scoring, groups and scaling, the shared expert and
the dense first layers (`moe.py` builds what they describe)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import GPTConfig

ROUTER_SCORINGS = ("softmax", "sigmoid", "softmax_corrected", "softmax_float32",
                   "sigmoid_input")
#: the scorings whose router picks by score plus a correction bias (`moe.CORRECTION_BIAS`)
CORRECTED = ("sigmoid", "softmax_corrected")
#: the scorings whose router multiplies in float32 (transformers' float32 routers)
FLOAT32_ROUTERS = (*CORRECTED, "softmax_float32")


def check_experts(c: GPTConfig) -> None:
    """ValueError naming the first mixture-of-experts field of `c` that is out of range or
    contradicts another, and the fix (GPTConfig's validation; its fields say what each is)."""
    if c.n_experts is not None and (
            isinstance(c.n_experts, bool) or not isinstance(c.n_experts, int)
            or not 1 <= c.experts_per_token <= c.n_experts or c.mlp == "none"):
        raise ValueError(
            f"n_experts={c.n_experts!r}, experts_per_token={c.experts_per_token!r}: "
            "a mixture of experts needs an MLP kind (mlp != 'none'), a positive number of "
            "experts and 1 <= experts_per_token <= n_experts")
    shared = c.shared_expert_size
    if shared is not None and (isinstance(shared, bool) or not isinstance(shared, int)
                               or shared < 1 or c.n_experts is None):
        raise ValueError(f"shared_expert_size={shared!r} is the width of a mixture's "
                         "shared expert: a positive integer beside n_experts")
    if c.experts_from_top_logits and not c.experts_normalized:
        raise ValueError("experts_from_top_logits=True weighs the chosen experts by the "
                         "softmax of their logits, which sums to 1: it needs "
                         "experts_normalized=True")
    coef = c.router_aux_loss_coef
    if isinstance(coef, bool) or not isinstance(coef, int | float) or not (
            math.isfinite(coef) and coef >= 0):
        raise ValueError(f"GPTConfig.router_aux_loss_coef={coef!r} must be a finite "
                         "number >= 0 (Mixtral trained with 0.02; 0: no balancing term)")
    _check_routing(c)


def _check_routing(c: GPTConfig) -> None:
    """check_experts' part for the router's scoring, groups, scaling, shared-expert gate and
    the dense first layers."""
    if c.router_scoring not in ROUTER_SCORINGS:
        raise ValueError(f"router_scoring={c.router_scoring!r} must be one of "
                         f"{list(ROUTER_SCORINGS)}")
    if c.router_scoring in FLOAT32_ROUTERS and (c.experts_from_top_logits or c.router_bias):
        raise ValueError(f"router_scoring={c.router_scoring!r} is DeepSeek's or ERNIE "
                         "4.5's router: no bias on its Linear, the chosen weighed by their "
                         "scores; set router_bias=False and experts_from_top_logits=False")
    if c.router_scoring == "sigmoid_input" and (
            c.experts_normalized or c.experts_from_top_logits or c.router_bias):
        raise ValueError("router_scoring='sigmoid_input' is Llama 4's router: each chosen "
                         "expert's input times the sigmoid of its logit, no bias; set "
                         "experts_normalized=False, experts_from_top_logits=False and "
                         "router_bias=False")
    _check_norm_min(c)
    groups, chosen, n = c.expert_groups, c.expert_groups_chosen, c.n_experts or 1
    for name, least in (("expert_groups", 1), ("expert_groups_chosen", 1),
                        ("dense_layers", 0)):
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"GPTConfig.{name}={value!r} must be an integer >= {least}")
    if not isinstance(c.shared_expert_gated, bool):
        raise ValueError(f"GPTConfig.shared_expert_gated={c.shared_expert_gated!r} "
                         "must be True or False")
    if groups > 1 and (c.router_scoring not in ("sigmoid", "softmax_float32") or n % groups
                       or n // groups < 2):
        raise ValueError(f"expert_groups={groups} splits the n_experts={c.n_experts} "
                         "into equal groups of at least 2 (each scored by its two best, or "
                         "its best): it needs router_scoring 'sigmoid' or 'softmax_float32' "
                         "and a divisor of n_experts at most n_experts / 2; 1 for no groups")
    if chosen > groups:
        raise ValueError(f"expert_groups_chosen={chosen} must be at most expert_groups="
                         f"{groups} (the groups a token picks among)")
    scaling = c.routed_scaling
    if isinstance(scaling, bool) or not isinstance(scaling, int | float) or not (
            math.isfinite(scaling) and scaling > 0):
        raise ValueError(f"GPTConfig.routed_scaling={scaling!r} must be a positive finite "
                         "number (GLM-4.5's: 2.5; 1.0 leaves the weights as they are)")
    if c.dense_layers and (c.n_experts is None or c.dense_layers >= c.n_layer):
        raise ValueError(f"dense_layers={c.dense_layers} keeps the first blocks dense "
                         f"before a mixture: it needs n_experts and fewer than n_layer="
                         f"{c.n_layer} (0: every block a mixture)")
    _check_mixture_layers(c)


def _check_norm_min(c: GPTConfig) -> None:
    """_check_routing's part for router_norm_min, the floor of a softmax router's sum."""
    floor = c.router_norm_min
    if isinstance(floor, bool) or not isinstance(floor, int | float) or not (
            math.isfinite(floor) and floor >= 0):
        raise ValueError(f"GPTConfig.router_norm_min={floor!r} must be a finite number >= 0 "
                         "(ERNIE 4.5's: 1e-12; 0.0: no clamp)")
    if floor and (c.router_scoring == "sigmoid" or not c.experts_normalized
                  or c.experts_from_top_logits):
        raise ValueError(f"router_norm_min={floor} floors the sum a softmax router "
                         "renormalises its chosen weights by: it needs router_scoring "
                         "'softmax' or 'softmax_corrected', experts_normalized=True and "
                         "experts_from_top_logits=False; 0.0 otherwise")


def _check_mixture_layers(c: GPTConfig) -> None:
    """_check_routing's part for mixture_layers, the blocks that hold the mixture."""
    layers = c.mixture_layers
    if layers is None:
        return
    if (not isinstance(layers, list) or not layers or c.n_experts is None or c.dense_layers
            or any(isinstance(i, bool) or not isinstance(i, int) for i in layers)
            or layers != sorted(set(layers)) or not 0 <= layers[0] <= layers[-1] < c.n_layer):
        raise ValueError(f"mixture_layers={layers!r} names the blocks that hold the mixture: "
                         f"a non-empty increasing list of layers within 0..{c.n_layer - 1}, "
                         "beside n_experts and with dense_layers=0 (None: every block from "
                         "dense_layers on)")
