"""`MoE`: a sparse mixture of experts in place of a block's MLP (Mixtral, OLMoE, Qwen3-MoE,
GraniteMoE, gpt-oss).

A router (one Linear; gpt-oss's with a bias) scores each token against `n_experts` MLPs;
the token goes through the `top_k` most probable, whose outputs are summed weighted by their softmax
probabilities (computed in float32), renormalised over the chosen ones where `normalized`
(Mixtral; GraniteMoE as a softmax of the chosen logits alone: `top_logits`) or left as they
are (OLMoE), and multiplied in float32 (`wide`: Mixtral) or first rounded to the model's
dtype (OLMoE, Qwen3-MoE, GraniteMoE). The weights live in one dense (B, T, n_experts) tensor,
zero for the experts a token skips, which a trace reads as "expert_weights" and an edit may
replace: zero an expert's column to ablate it, or give a token experts the router did not
choose. Each expert then runs once on the rows that give it a weight, in expert order, its
output scaled and added into the rows it came from: Hugging Face's eager loop, so its
numbers are transformers'.

DeepSeek-V3's router (GLM-4.5, dots.llm1: `scoring="sigmoid"`) scores each expert by the
sigmoid of its float32 logit instead (the router's weight kept float32 whatever the model's
dtype, as transformers keeps it), picks the top k by score plus a correction bias (a float32
buffer, kept so too), among the best `groups_chosen` of `groups` groups, and weighs them by
their unbiased scores,
renormalised where `normalized`; every scheme's weights are then times `scaling`. Its
shared expert is added ungated (`shared_gated=False`). ERNIE 4.5's (`scoring=
"softmax_corrected"`) is the same router with softmax probabilities for scores, without
groups, its renormalising sum clamped at `norm_min`. DeepSeek-V2's (`scoring=
"softmax_float32"`) is the same router with softmax probabilities, no correction bias, and
groups scored by their best expert. Llama 4's (`scoring="sigmoid_input"`) picks the top k
logits in the model's dtype, weighs each by its sigmoid (in float32, rounded to that dtype)
and scales the token by it on its way into the expert, whose output is added as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .layers import GATED, MLP, KeepsFloat32, Linear

#: the router's buffer of "sigmoid" and "softmax_corrected" scoring, which stays float32 in
#: a 16-bit model
CORRECTION_BIAS = "e_score_correction_bias"

if TYPE_CHECKING:
    from .config import GPTConfig


class MoE(KeepsFloat32):
    """x (B, T, C) -> (B, T, C) through each token's top-k experts (see module doc)."""

    def __init__(self, n_embd: int, n_experts: int, top_k: int, normalized: bool,
                 expert: Callable[[int | None], MLP], wide: bool = True,
                 top_logits: bool = False, shared_size: int | None = None,
                 keep_routing: bool = False, router_bias: bool = False,
                 scoring: str = "softmax", groups: int = 1, groups_chosen: int = 1,
                 scaling: float = 1.0, shared_gated: bool = True,
                 norm_min: float = 0.0) -> None:
        """expert(width): a new MLP, `width` wide (None: the config's d_ff)."""
        super().__init__()
        self.top_k, self.normalized, self.wide = top_k, normalized, wide
        self.top_logits = top_logits  # the chosen weights: a softmax of their logits alone
        self.sigmoid, self.scaling = scoring == "sigmoid", scaling
        # picks by score + the correction bias: DeepSeek-V3's sigmoid, ERNIE 4.5's softmax
        self.corrected = scoring in ("sigmoid", "softmax_corrected")
        self.float32 = self.corrected or scoring == "softmax_float32"  # DeepSeek-V2's too
        self.norm_min = norm_min  # the floor of a softmax's renormalising sum; 0: none
        # Llama 4's: the weights scale each token on its way into the expert, not its output
        self.scales_input = scoring == "sigmoid_input"
        self.groups, self.groups_chosen = groups, groups_chosen
        self.router = Linear(n_embd, n_experts, bias=router_bias)  # gpt-oss's has a bias
        if self.corrected:  # on the router, so that it maps to the files' mlp.gate's buffer
            self.router.register_buffer(CORRECTION_BIAS, torch.zeros(n_experts))  # (E,)
        self.experts = nn.ModuleList(expert(None) for _ in range(n_experts))
        # an expert every token goes through: scaled by sigmoid(its gate's score) where
        # `shared_gated` (Qwen2-MoE), added as it is otherwise (DeepSeek-V3)
        self.shared = None if shared_size is None else expert(shared_size)
        self.shared_gate = None if shared_size is None or not shared_gated else Linear(
            n_embd, 1, bias=False)
        # the last training forward's router probabilities (N, E) and picks (N, k), kept for
        # the load-balancing loss (`balance_loss`) when `keep_routing`; None otherwise
        self.keep_routing = keep_routing
        self.routing: tuple[Tensor, Tensor] | None = None

    def weights(self, x: Tensor, trace: Any = None) -> Tensor:
        """x (B, T, C) -> each expert's weight in each token's output (B, T, n_experts),
        float32, zero off the token's top-k; `trace` records (and may replace) the router's
        logits as "router_logits" and the weights as "expert_weights"."""
        if self.float32:
            return self._float32_weights(x, trace)
        logits = self.router(x)  # (B, T, E)
        if trace is not None:
            logits = trace.record("router_logits", logits)
        wide = logits.float()  # (B, T, E)
        probs = wide.softmax(dim=-1)  # (B, T, E)
        if self.scales_input:  # Llama 4: the top logits, each weight its sigmoid, rounded
            top, chosen = logits.topk(self.top_k, dim=-1)  # (B, T, k) each
            top = top.float().sigmoid().to(logits.dtype).float()  # (B, T, k)
        elif self.top_logits:  # GraniteMoE: the top logits, then a softmax over them alone
            top, chosen = wide.topk(self.top_k, dim=-1)  # (B, T, k) each
            top = top.softmax(dim=-1)  # (B, T, k)
        else:
            top, chosen = probs.topk(self.top_k, dim=-1)  # (B, T, k) each
            if self.normalized:
                top = top / self._floored(top.sum(dim=-1, keepdim=True))  # (B, T, k)
        if self.keep_routing and self.training:
            self.routing = probs.flatten(0, 1), chosen.flatten(0, 1)  # (N, E), (N, k)
        if self.scaling != 1.0:
            top = top * self.scaling  # (B, T, k)
        weights = torch.zeros_like(probs).scatter_(-1, chosen, top)  # (B, T, E)
        return weights if trace is None else trace.record("expert_weights", weights)

    def _floored(self, total: Tensor) -> Tensor:
        """A renormalising sum (..., 1) clamped at norm_min (ERNIE 4.5's), where it has one."""
        return total.clamp(min=self.norm_min) if self.norm_min else total

    def _float32_weights(self, x: Tensor, trace: Any) -> Tensor:
        """`weights` for a router in float32 (module doc), its steps and order transformers'
        (`DeepseekV3TopkRouter`, `Ernie4_5_MoeTopKRouter`, `DeepseekV2TopkRouter`), on the
        (N, E) rows it sees: the same picks among ties and the same float32 sums.
        "router_logits" are the float32 logits."""
        B, T = x.shape[:2]
        w = self.router.weight  # (E, C)
        logits = F.linear(x.float(), w.float()).view(B * T, -1)  # (N, E)
        if trace is not None:
            logits = trace.record("router_logits", logits.view(B, T, -1)).view(B * T, -1)
        scores = logits.sigmoid() if self.sigmoid else logits.softmax(dim=-1)  # (N, E)
        biased = scores + getattr(self.router, CORRECTION_BIAS) if self.corrected else (
            scores)  # (N, E)
        if self.groups > 1:
            biased = self._in_groups(biased)  # (N, E)
        # DeepSeek takes its picks unsorted, ERNIE 4.5 sorted: the order their sum adds in
        chosen = biased.topk(self.top_k, dim=-1, sorted=self.corrected and not self.sigmoid
                             )[1]  # (N, k)
        if self.keep_routing and self.training:
            # DeepSeek-V3's balance loss's affinities and picks; ERNIE 4.5's and DeepSeek-V2's
            # are Mixtral's: the probabilities and their own top k, without bias or groups
            self.routing = (scores / scores.sum(dim=-1, keepdim=True), chosen) if (
                self.sigmoid) else (scores, scores.topk(self.top_k, dim=-1)[1])  # (N, E), (N, k)
        top = scores.gather(1, chosen)  # (N, k)
        if self.normalized and self.sigmoid:  # transformers' + 1e-20 keeps a zero row finite
            top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)  # (N, k)
        elif self.normalized:
            top = top / self._floored(top.sum(dim=-1, keepdim=True))  # (N, k)
        top = top * self.scaling  # (N, k)
        weights = torch.zeros_like(scores).scatter_(-1, chosen, top).view(B, T, -1)  # (B, T, E)
        return weights if trace is None else trace.record("expert_weights", weights)

    def _in_groups(self, scores: Tensor) -> Tensor:
        """scores (N, E) with the experts outside each row's groups_chosen best groups put
        out of reach: -inf where a group scores as its two best (DeepSeek-V3), 0 where as its
        best (DeepSeek-V2), as transformers does."""
        grouped = scores.view(scores.shape[0], self.groups, -1)  # (N, G, E / G)
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1) if self.corrected else (
            grouped.max(dim=-1).values)  # (N, G)
        kept = group_scores.topk(self.groups_chosen, dim=-1, sorted=False)[1]  # (N, g)
        mask = torch.zeros_like(group_scores).scatter_(1, kept, 1)  # (N, G)
        mask = mask[:, :, None].expand_as(grouped).reshape(scores.shape[0], -1)  # (N, E)
        return scores.masked_fill(~mask.bool(), float("-inf") if self.corrected else 0.0)

    def float32_names(self) -> tuple[str, ...]:
        """The correction bias and a float32 router's weight stay float32 in a 16-bit model
        (`KeepsFloat32`), as transformers keeps both (`_keep_in_fp32_modules_strict`):
        rounded to bfloat16 they would pick other experts."""
        return ((f"router.{CORRECTION_BIAS}",) if self.corrected else ()) + (
            ("router.weight",) if self.float32 else ())

    def forward(self, x: Tensor, trace: Any = None) -> Tensor:
        B, T, C = x.shape
        weights = self.weights(x, trace).view(B * T, -1)  # (N, E)
        flat = x.reshape(B * T, C)  # (N, C)
        out = self.combine(flat, weights, lambda e, rows: self.experts[e](rows[None])[0])
        return self.plus_shared(out, flat).view(B, T, C)

    def plus_shared(self, out: Tensor, x: Tensor) -> Tensor:
        """The routed experts' output (N, C) plus the shared expert's of x (N, C), scaled by
        sigmoid of its gate's score where it has a gate (Qwen2-MoE's order); `out` itself
        without one."""
        if self.shared is None:
            return out
        shared = self.shared(x[None])[0]  # (N, C)
        if self.shared_gate is None:  # DeepSeek-V3's: ungated
            return out + shared  # (N, C)
        return out + torch.sigmoid(self.shared_gate(x)) * shared  # (N, C)

    def combine(self, x: Tensor, weights: Tensor, expert: Callable[[int, Tensor], Tensor]
                ) -> Tensor:
        """x (N, C) and weights (N, E) -> (N, C): `expert(e, rows)` (n, C) -> (n, C) run once on
        the rows that give expert e a weight, in expert order, scaled and added up (the decode
        step passes its own layout of the experts' matrices)."""
        out = torch.zeros_like(x)  # (N, C)
        used = (weights != 0).any(dim=0).nonzero()[:, 0].tolist()  # experts some row uses
        for e in used:
            rows = weights[:, e].nonzero()[:, 0]  # (n,)
            w = weights[rows, e, None]  # (n, 1)
            if self.scales_input:  # Llama 4's order: the weight times the expert's input
                out.index_add_(0, rows, expert(e, x[rows] * w.to(x.dtype)).to(out.dtype))
                continue
            y = expert(e, x[rows])  # (n, C)
            out.index_add_(0, rows, (y * (w if self.wide else w.to(y.dtype))).to(out.dtype))
        return out


def idle_parameters(config: GPTConfig) -> int:
    """The parameters a token's forward leaves unused: in every mixture's layer (not the
    dense ones, `GPTConfig.has_mixture`), the experts outside its top k (0 without a
    mixture; a shared expert is active). Total minus this is the count active per token."""
    if config.n_experts is None:
        return 0
    C, d = config.n_embd, config.ff_size
    gated = config.mlp in GATED
    per_expert = (3 if gated else 2) * C * d + (((2 if gated else 1) * d + C) if config.bias
                                                 else 0)
    layers = sum(config.has_mixture(i) for i in range(config.n_layer))
    return layers * (config.n_experts - config.experts_per_token) * per_expert


def balance_loss(moes: list[MoE], attention_mask: Tensor | None) -> Tensor:
    """Mixtral's load-balancing term (transformers' `load_balancing_loss_func`) over the last
    training forward of each mixture in `moes`: n_experts * sum_e f_e * P_e, f_e the picks of
    expert e per token and P_e its mean router probability (a sigmoid router's: its scores
    normalised to sum 1), both over every layer's tokens together, a padded token left out
    (attention_mask (B, T), 0 at padding). Each mixture's kept routing is used up."""
    routings = [moe.routing for moe in moes if moe.routing is not None]
    if len(routings) < len(moes):
        raise ValueError("a mixture kept no routing: the load-balancing loss needs a training "
                         "forward with keep_routing set (Block sets it where "
                         "router_aux_loss_coef > 0)")
    E = moes[0].router.out_features
    picks = torch.zeros(E, device=moes[0].router.weight.device)  # (E,)
    probs_sum = torch.zeros_like(picks)  # (E,)
    rows = picks.new_zeros(())  # ()
    for moe, (probs, chosen) in zip(moes, routings, strict=True):  # (N, E), (N, k)
        moe.routing = None
        w = (torch.ones(probs.shape[0], device=probs.device) if attention_mask is None
             else attention_mask.reshape(-1).to(probs))  # (N,)
        picks = picks.scatter_add(0, chosen.reshape(-1), w.repeat_interleave(chosen.shape[1]))
        probs_sum = probs_sum + (probs * w[:, None]).sum(dim=0)  # (E,)
        rows = rows + w.sum()
    return E * ((picks / rows) * (probs_sum / rows)).sum()
