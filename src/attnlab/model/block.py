"""One transformer block: norm -> attention -> residual add, norm -> MLP -> residual add, in
the variants `GPTConfig` switches on (GPT-NeoX's parallel residual, Phi's and GPT-J's with one
norm for both branches, Gemma's sandwich norms, OLMo 2's norms on the branches' outputs alone).
`gpt.py` stacks the blocks; `decode.py` runs the same wiring for one token at a time.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .attention import CausalSelfAttention
from .config import GPTConfig
from .latent import LatentAttention
from .layers import GATED, MLP, branch_scaled, make_norm
from .masks import Mask
from .moe import MoE


def norm_of(config: GPTConfig) -> nn.Module:
    """The norm `config.norm` names, over the residual stream's n_embd."""
    return make_norm(config.norm, config.n_embd, eps=config.norm_eps, bias=config.norm_biased)


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int = 0) -> None:
        """layer: the block's index, which decides a dense MLP or a mixture (has_mixture)."""
        super().__init__()
        c = config
        self.residual, self.parallel = c.residual, c.parallel_residual
        self.branch_scale = c.residual_multiplier  # Granite's; 1.0: none
        # OLMo 2 norms no branch's input (pre_norm=False): the identity stands in
        self.ln_1 = norm_of(c) if c.pre_norm else nn.Identity()
        has_mlp = c.mlp != "none"
        # Gemma 2 / 3: each branch's output normed again before its residual add
        self.ln_attn_post = norm_of(c) if c.sandwich_norm else None
        self.ln_mlp_post = norm_of(c) if c.sandwich_norm and has_mlp else None
        self.attn: CausalSelfAttention | LatentAttention = CausalSelfAttention(
            c.n_embd, c.n_head * c.head_size, c.n_head, c.n_kv_head,
            bias=c.qkv_biased,
            out_bias=c.out_biased,
            out_proj=c.attn_out_proj, dropout=c.dropout, scale=c.attn_scale,
            qk_norm=c.qk_norm, qk_norm_whole=c.qk_norm_whole, norm_eps=c.norm_eps,
            rope_in_float32=c.rope_in_float32, rope_names=c.pos == "rope",
            rope_tables_rounded=c.rope_tables_rounded,
            rope_pairs=c.rope_interleaved, scores_in_float32=c.scores_in_float32,
            qk_norm_kind=f"heads_{c.qk_norm_heads}" if c.qk_norm_heads else c.norm if c.norm in (
                "gemma_rmsnorm", "olmo_rmsnorm") else "rmsnorm",
            softcap=c.attn_logit_softcapping, sinks=c.attn_sinks,
            l2_eps=c.norm_eps if c.qk_l2_norm and c.rotates(layer) else None,
            clip=c.qkv_clip, norm_after_rope=c.qk_norm_after_rope,
        ) if c.kv_latent is None else LatentAttention(
            c.n_embd, c.n_head, c.head_size, kv_latent=c.kv_latent, q_latent=c.q_latent,
            rope_head_dim=c.rope_head_dim, v_head_dim=c.v_head_dim, bias=c.qkv_biased,
            out_bias=c.out_biased, dropout=c.dropout, scale=c.attn_scale,
            softcap=c.attn_logit_softcapping, rope_in_float32=c.rope_in_float32,
            rope_tables_rounded=c.rope_tables_rounded, rope_pairs=c.rope_interleaved,
            scores_in_float32=c.scores_in_float32)
        # None without an MLP, and where the MLP reads ln_1's output (shared_norm)
        self.ln_2 = (norm_of(c) if c.pre_norm else nn.Identity()) if (
            has_mlp and not c.shared_norm) else None
        act, gate_act = c.mlp_activations

        def mlp(width: int | None = None) -> MLP:
            return MLP(
                c.n_embd, width or c.ff_size, gated=c.mlp in GATED, gelu=c.gelu,
                bias=c.bias, dropout=c.dropout, gate_act=gate_act, act=act,
                clamp=c.swiglu_clamp,
            )

        self.mlp: MLP | MoE | None = None
        if has_mlp and not c.has_mixture(layer):  # a mixture model's dense layers: their own width
            self.mlp = mlp(c.dense_d_ff if c.n_experts is not None else None)
        elif has_mlp and c.n_experts is not None:
            self.mlp = MoE(
                c.n_embd, c.n_experts, c.experts_per_token, c.experts_normalized, mlp,
                wide=c.expert_weights_in_float32, top_logits=c.experts_from_top_logits,
                shared_size=c.shared_expert_size, router_bias=c.router_bias,
                keep_routing=c.router_aux_loss_coef > 0,  # for GPT's balance loss
                scoring=c.router_scoring, groups=c.expert_groups,
                groups_chosen=c.expert_groups_chosen, scaling=c.routed_scaling,
                shared_gated=c.shared_expert_gated, norm_min=c.router_norm_min)

    def forward(
        self,
        x: Tensor,
        mask: Mask,
        kv_cache: Any = None,
        pos: int = 0,
        trace: Any = None,
        fused: bool | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        temperature: Tensor | None = None,
    ) -> Tensor:
        """rope, temperature: the attention's (`CausalSelfAttention.forward`)."""
        h = self.ln_1(x)  # (B, T, C)
        a = self.attn(h, mask=mask, kv_cache=kv_cache, pos=pos, trace=trace, fused=fused,
                      rope=rope, **({} if temperature is None else {"temperature": temperature})
                      )  # (B, T, C)
        if self.parallel:  # GPT-NeoX: both branches read x; its order of the sum
            a = branch_scaled(a, self.branch_scale)  # (B, T, C)
            if self.mlp is None:
                return a + x if self.residual else a
            m = self.mlp(h if self.ln_2 is None else self.ln_2(x), trace)  # (B, T, C)
            if trace is not None:
                m = trace.record("mlp_out", m)
            m = branch_scaled(m, self.branch_scale)  # (B, T, C)
            return m + a + x if self.residual else m + a  # (B, T, C)
        if self.ln_attn_post is not None:
            a = self.ln_attn_post(a)  # (B, T, C)
            if trace is not None:
                a = trace.record("attn_out_normed", a)
        a = branch_scaled(a, self.branch_scale)  # (B, T, C)
        x = x + a if self.residual else a
        if self.mlp is not None and self.ln_2 is not None:
            if trace is not None:
                x = trace.record("resid_mid", x)
            m = self.mlp(self.ln_2(x), trace)  # (B, T, C)
            if trace is not None:
                m = trace.record("mlp_out", m)
            if self.ln_mlp_post is not None:
                m = self.ln_mlp_post(m)  # (B, T, C)
                if trace is not None:
                    m = trace.record("mlp_out_normed", m)
            m = branch_scaled(m, self.branch_scale)  # (B, T, C)
            x = x + m if self.residual else m
        return x
