"""`LatentAttention`: DeepSeek-V2 / V3's multi-head latent attention (MLA).

Each token's keys and values come from one small latent: x is projected down to a
kv_latent-wide vector (plus a rope_head_dim-wide key part every head shares), RMS-normed, and
projected up to every head's k (without RoPE) and v; q comes the same way from a q_latent-wide
latent (or straight from x). Each head's q and k are head_size wide: head_size - rd dims
without RoPE, then rd = rope_head_dim dims turned by RoPE (k's the shared part). The values
may be narrower (v_head_dim).

A trace holds the normed latent as kv_latent (B, T, kv_latent). Past the projections it is
`CausalSelfAttention`: the same `attend` (fused, explicit, traced with weights and summaries),
the same trace names (q_pre_rope, k_pre_rope, q, k, v, context, attn_out; q and k laid out as
transformers' query_states and key_states, but that transformers' DeepSeek-V3 lays the
turned pairs out as halves, a permutation of the last rd dims of both: the same scores) and
the same KV cache.

`model.new_cache` makes a `LatentLayerCache` per layer: the latents and RoPE parts alone, MLA's
own small cache (DeepSeek's and transformers'). Each call expands what it holds into every
head's k and v, or, for a few new tokens over many cached ones, attends in the latent space
(DeepSeek-V2's absorbed form, `LatentAttention._absorbed`: the same numbers in another order of
products). A per-head cache (`new_cache(..., per_head=True)`) holds each head's k and v, v
padded with zeros to head_size (exact: the padded columns of the context are zeros, dropped),
as every other attention's: the one that keeps an edit of a head's keys (k_pre_rope).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import LayerCache, LayerTrace, attend
from .kv_cache import LatentLayerCache
from .layers import Linear, RMSNorm
from .masks import Mask, build_mask
from .packed import PackedLinear
from .rope import apply_rotary

# the latents' RMSNorm epsilon: transformers' and DeepSeek's, whatever rms_norm_eps says
LATENT_NORM_EPS = 1e-6


class LatentAttention(nn.Module):
    """x (B, T, C) -> (B, T, C) through multi-head latent attention (module doc).

    Modules, in transformers' order and under attnlab's names: `query` (C -> nh * hs; None
    with a q latent) or `q_down` (C -> q_latent), `q_latent_norm`, `q_up` (q_latent -> nh * hs);
    `kv_down` (C -> kv_latent + rd), `kv_latent_norm`, `kv_up` (kv_latent -> nh * (hs - rd + vs));
    `out_proj` (nh * vs -> C). `bias` puts a bias on the down projections, `out_bias` on
    out_proj (transformers' attention_bias: both). rope_in_float32, rope_tables_rounded,
    rope_pairs, scores_in_float32, scale, softcap and dropout as `CausalSelfAttention`'s.
    """

    def __init__(self, d_in: int, n_head: int, head_size: int, *, kv_latent: int,
                 q_latent: int | None, rope_head_dim: int, v_head_dim: int | None = None,
                 bias: bool = False, out_bias: bool = False, dropout: float = 0.0,
                 scale: float | None = None, softcap: float | None = None,
                 rope_in_float32: bool = False, rope_tables_rounded: bool = False,
                 rope_pairs: bool = False, scores_in_float32: bool = False) -> None:
        super().__init__()
        self.n_head, self.head_size, self.rope_dims = n_head, head_size, rope_head_dim
        self.n_kv_head = n_head  # every head has its own k and v (`CausalSelfAttention`'s)
        self.kv_latent, self.v_size = kv_latent, v_head_dim or head_size
        self.scale, self.dropout, self.softcap = scale, dropout, softcap
        self.rope_how = rope_in_float32, rope_pairs, rope_tables_rounded
        self.scores_in_float32 = scores_in_float32
        self.absorb: bool | None = None  # with a latent cache: None, by cost (`absorbs`)
        nope = head_size - rope_head_dim
        self.query = Linear(d_in, n_head * head_size, bias=False) if q_latent is None else None
        self.q_down = None if q_latent is None else Linear(d_in, q_latent, bias=bias)
        self.q_latent_norm = None if q_latent is None else RMSNorm(q_latent, LATENT_NORM_EPS)
        self.q_up = None if q_latent is None else Linear(q_latent, n_head * head_size,
                                                         bias=False)
        self.kv_down = Linear(d_in, kv_latent + rope_head_dim, bias=bias)
        self.kv_latent_norm = RMSNorm(kv_latent, LATENT_NORM_EPS)
        self.kv_up = Linear(kv_latent, n_head * (nope + self.v_size), bias=False)
        self.out_proj = Linear(n_head * self.v_size, d_in, bias=out_bias)
        self.out_dropout = nn.Dropout(dropout)

    def _queries(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> q (B, nh, T, hs), RoPE's dims last and not yet turned."""
        B, T, _ = x.shape
        if self.query is not None:
            q = self.query(x)  # (B, T, nh * hs)
        else:
            down, norm, up = self.q_down, self.q_latent_norm, self.q_up
            assert down is not None and norm is not None and up is not None
            q = up(norm(down(x)))  # (B, T, q_latent) -> (B, T, nh * hs)
        return q.view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, nh, T, hs)

    def _latent(self, x: Tensor, trace: LayerTrace | None) -> tuple[Tensor, Tensor]:
        """x (B, T, C) -> the normed latent (B, T, kv_latent), which `trace` records (and may
        replace) as "kv_latent", and the key part RoPE turns, every head's (B, 1, T, rd)."""
        B, T, _ = x.shape
        latent, shared = self.kv_down(x).split([self.kv_latent, self.rope_dims], dim=-1)
        latent = self.kv_latent_norm(latent)  # (B, T, kv_latent)
        if trace is not None:
            latent = trace.record("kv_latent", latent)
        return latent, shared.view(B, 1, T, self.rope_dims)

    def _expanded(self, latent: Tensor) -> tuple[Tensor, Tensor]:
        """latent (B, S, kv_latent) -> each head's k without RoPE (B, nh, S, hs - rd) and v
        (B, nh, S, vs)."""
        B, S, _ = latent.shape
        kv = self.kv_up(latent)  # (B, S, nh * (hs - rd + vs))
        kv = kv.view(B, S, self.n_head, -1).transpose(1, 2)  # (B, nh, S, hs - rd + vs)
        k_nope, v = kv.split([self.head_size - self.rope_dims, self.v_size], dim=-1)
        return k_nope, v

    def _joined(self, k_nope: Tensor, k_rot: Tensor) -> Tensor:
        """Each head's k (B, nh, T, hs): its own dims, then the RoPE part (B, 1 or nh, T, rd),
        one every head shares or each head's."""
        return torch.cat((k_nope, k_rot.expand(-1, self.n_head, -1, -1)), dim=-1)

    def _padded(self, v: Tensor) -> Tensor:
        """v (B, nh, S, vs) -> (B, nh, S, hs), zeros after the vs dims (module doc)."""
        return v if self.v_size == self.head_size else F.pad(v, (0, self.head_size - self.v_size))

    def forward(
        self,
        x: Tensor,
        attention_mask: Tensor | None = None,
        *,
        mask: Mask | None = None,
        kv_cache: LayerCache | LatentLayerCache | None = None,
        pos: int = 0,
        trace: LayerTrace | None = None,
        fused: bool | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """x (B, T, C) -> (B, T, C); the arguments are `CausalSelfAttention.forward`'s (no
        cross-attention: latent attention is self-attention). A `LatentLayerCache` keeps the
        latents: each call expands the cached ones into every head's k and v, or, where that
        costs more (a few new tokens over a long cache, `absorbs`), attends in the latent
        space (`_absorbed`), never under a trace, whose names are the heads' k and v."""
        if x.dim() != 3:
            raise ValueError(f"x must be (B, T, C), got shape {tuple(x.shape)}")
        T = x.shape[1]
        latent, k_rot = self._latent(x, trace)  # (B, T, kv_latent), (B, 1, T, rd)
        q = self._queries(x)  # (B, nh, T, hs)
        rd = self.rope_dims
        k_nope = v = None
        if trace is not None:
            q = trace.record("q_pre_rope", q)
            k_nope, v = self._expanded(latent)  # (B, nh, T, hs - rd), (B, nh, T, vs)
            joined = self._joined(k_nope, k_rot)  # (B, nh, T, hs)
            k = trace.record("k_pre_rope", joined)
            if k is not joined:  # edited: each head may now have its own RoPE part
                if isinstance(kv_cache, LatentLayerCache):
                    raise ValueError(
                        "an edit of k_pre_rope changes each head's keys, which a latent cache "
                        "(the latents alone) cannot keep: make the cache per head, "
                        "model.new_cache(B, max_len, per_head=True)")
                k_nope, k_rot = k[..., :-rd], k[..., -rd:]  # (B, nh, T, hs - rd), (.., rd)
        if rope is not None:
            q_nope, q_rot = q.split([self.head_size - rd, rd], dim=-1)
            q = torch.cat((q_nope, apply_rotary(q_rot, *rope, *self.rope_how)), dim=-1)
            k_rot = apply_rotary(k_rot, *rope, *self.rope_how)  # (B, 1 or nh, T, rd)
        if isinstance(kv_cache, LatentLayerCache):
            cached = kv_cache.write(pos, latent, k_rot[:, 0])  # (B, S, kv_latent + rd)
            if mask is None:
                mask = build_mask(T, cached.shape[1], attention_mask, device=x.device)
            if trace is None and self.absorbs(T, cached.shape[1]):
                return self._out(self._absorbed(q, cached, mask, fused), None)
            latent, shared = cached.split([self.kv_latent, rd], dim=-1)
            k_nope, v = self._expanded(latent)  # (B, nh, S, hs - rd), (B, nh, S, vs)
            k_rot = shared[:, None]  # (B, 1, S, rd)
        elif k_nope is None or v is None:
            k_nope, v = self._expanded(latent)  # (B, nh, T, hs - rd), (B, nh, T, vs)
        k = self._joined(k_nope, k_rot)  # (B, nh, T or S, hs)
        padded = self._padded(v)  # (B, nh, T or S, hs)
        if kv_cache is not None and not isinstance(kv_cache, LatentLayerCache):
            k, padded = kv_cache.update(pos, k, padded)  # (B, nh, S, hs) each
        if trace is not None:
            q = trace.record("q", q)
            k = trace.record("k", k)
            padded = self._padded(trace.record("v", padded[..., :self.v_size]))  # (B, nh, S, hs)
        if mask is None:
            mask = build_mask(T, k.shape[2], attention_mask, device=x.device)
        context = attend(
            q, k, padded, mask, scale=self._scale(), dropout_p=self.dropout,
            training=self.training, fused=True if fused is None else fused, trace=trace,
            softcap=self.softcap, wide=self.scores_in_float32,
        )[..., :self.v_size]  # (B, nh, T, vs)
        return self._out(context, trace)

    def _scale(self) -> float:
        return 1.0 / math.sqrt(self.head_size) if self.scale is None else self.scale

    def _out(self, context: Tensor, trace: LayerTrace | None) -> Tensor:
        """The heads' contexts (B, nh, T, vs) -> (B, T, C) through out_proj."""
        B, _, T, _ = context.shape
        if trace is not None:
            context = trace.record("context", context)
        y = context.transpose(1, 2).reshape(B, T, -1)  # (B, nh, T, vs) -> (B, T, nh * vs)
        y = self.out_dropout(self.out_proj(y))  # (B, T, C)
        if trace is not None:
            y = trace.record("attn_out", y)
        return y

    def absorbs(self, new: int, keys: int) -> bool:
        """Whether `new` queries over `keys` cached latents cost fewer multiply-adds attending
        in the latent space than expanding every key and value (true when decoding a few
        tokens over a long cache; never for a packed `kv_up`, whose matrix `_absorbed`
        reads). `absorb` (None: by cost) decides instead where set."""
        if isinstance(self.kv_up, PackedLinear):  # no matrix to read
            return False
        if self.absorb is not None:
            return self.absorb
        nh, wide, rd, vs = self.n_head, self.kv_latent, self.rope_dims, self.v_size
        nope = self.head_size - rd
        absorbed = nh * new * (nope * wide + keys * (2 * wide + rd) + wide * vs)
        expanded = nh * keys * (wide * (nope + vs) + new * (self.head_size + vs))
        return absorbed < expanded

    def _absorbed(self, q: Tensor, cached: Tensor, mask: Mask, fused: bool | None) -> Tensor:
        """Attention in the latent space (DeepSeek-V2's absorbed form): each head's q without
        RoPE taken through that head's key matrix to the latent's width, beside its RoPE
        part, attends to the cached latents and RoPE parts as one key every head shares;
        the weighted latents go through each head's value matrix. The same scores and
        contexts as the expanded heads', in another order of products. q (B, nh, T, hs),
        cached (B, S, kv_latent + rd) -> the contexts (B, nh, T, vs)."""
        B, nh, T, _ = q.shape
        wide, nope = self.kv_latent, self.head_size - self.rope_dims
        up = self.kv_up.weight.view(nh, nope + self.v_size, wide)  # (nh, hs - rd + vs, L)
        q_nope, q_rot = q.split([nope, self.rope_dims], dim=-1)
        q_latent = torch.matmul(q_nope, up[:, :nope])  # (B, nh, T, L)
        # every head reads one key: the heads fold into the rows of one query "head"
        folded = torch.cat((q_latent, q_rot), -1).reshape(B, 1, nh * T, -1)  # (B, 1, nh*T, L+rd)
        keys = cached[:, None]  # (B, 1, S, L + rd): the latent, then the RoPE part
        context = attend(
            folded, keys, keys, _folded(mask, nh), scale=self._scale(),
            dropout_p=self.dropout, training=self.training,
            fused=True if fused is None else fused, softcap=self.softcap,
            wide=self.scores_in_float32,
        )  # (B, 1, nh * T, L + rd): the weighted latents, then RoPE parts (unread)
        weighted = context[..., :wide].reshape(B, nh, T, wide)  # (B, nh, T, L)
        return torch.matmul(weighted, up[:, nope:].transpose(1, 2))  # (B, nh, T, vs)


def _folded(mask: Mask, n_head: int) -> Mask:
    """`mask` over (B, 1, T, S) for queries folded head by head into (B, 1, nh * T, S) (no
    may_attend: every query sees every key, folded or not)."""

    def fold(rows: Tensor | None) -> Tensor | None:  # (B, 1, T, S) -> (B, 1, nh * T, S)
        return None if rows is None else rows.unsqueeze(2).expand(
            -1, -1, n_head, -1, -1).flatten(2, 3)

    return Mask(fold(mask.may_attend), empty_rows=fold(mask.empty_rows), window=mask.window)
