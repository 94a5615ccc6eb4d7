"""Causal attention, done exactly: "may attend" masks, `attend()`, `CausalSelfAttention`.

This module owns all attention math in attnlab, with `traced_attention.py`, which runs the
explicit path under a trace in blocks of queries (and streams per-head summaries,
`summaries.py`). Every other module calls them; none re-implements a softmax over scores.
It leaves caching policy to `kv_cache.py` (it only calls `cache.update(pos, k, v)`) and
storage or editing of intermediates to `trace.py` and `interp/edits.py` (it only calls
`tensor = trace.record(name, tensor)` and continues with what comes back).

Shape vocabulary, used in every shape comment in attnlab:
    B   batch size
    T   query length (tokens processed in this call)
    S   key length (keys visible to the queries: cached + new, or a context sequence)
    nh  query heads            nkv  key/value heads (grouped-query attention: nh % nkv == 0)
    hs  head size              C    channels (embedding width)
    V   vocabulary size

Masks are boolean "may attend" tensors (`masks.py`): True where a query may look at a key.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import Tensor, nn

from .explicit import explicit_attend
from .layers import HeadsLayerNorm, Linear, make_norm, rms_norm
from .masks import Mask, build_mask, query_rows
from .rope import apply_rotary
from .sdpa import expand_kv, fused_attend
from .traced_attention import traced_attend, traced_rows


class LayerTrace(Protocol):
    """What attention needs from a trace or an edit: a named seam for intermediate tensors.

    `record` returns the value to continue with: a trace returns it unchanged, an edit a
    replacement. `needs_weights`: True when the sink reads or edits scores or weights or
    reads their summaries, which only the explicit path computes; otherwise the fused path
    runs. `wants(name)`: whether the sink keeps or edits `name`; the (B, nh, T, S) raw and
    masked scores are computed only when it wants them, the weights whole only when it
    wants them (a sink of summaries alone gets them streamed). `heads`: the query heads whose
    weights and summaries the sink keeps (None: all, or an edit reads every head's); the
    values of those names may then come with only these heads, in this order, on dim 1.
    `rows`: the query rows whose scores and weights it keeps (`query_rows` of this pass;
    None: all, or an edit reads every row's); the weights may then come with only these
    rows on dim 2. `note_mask(mask)`: told the `Mask` of each call, so that a trace can say
    later which cells were masked (`Trace.may_attend`), which the weights cannot.
    `named(name)`: whether the sink asked for `name` itself, not among every name by default
    (cross-attention then refuses attn_distance, which it has no meaning for, where a default
    trace goes without it).
    """

    needs_weights: bool
    heads: list[int] | None
    rows: tuple[int, ...] | None

    def wants(self, name: str) -> bool: ...

    def record(self, name: str, value: Tensor) -> Tensor: ...

    def note_mask(self, mask: Mask) -> None: ...

    def named(self, name: str) -> bool: ...


class LayerCache(Protocol):
    """What attention needs from a KV cache: write new keys/values, get all of them back."""

    def update(self, pos: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    fused: bool = True,
    trace: LayerTrace | None = None,
    softcap: float | None = None,
    wide: bool = False,
    sinks: Tensor | None = None,
) -> Tensor:
    """Scaled dot-product attention. q (B, nh, T, hs), k/v (B, nkv, S, hs) -> (B, nh, T, hs).

    fused=False is the reference path, written out step by step (and the only one a trace
    can see into): scores = q @ k^T, masked_fill(-inf), softmax(scores * scale),
    dropout on the weights (training only), weights @ v. fused=True calls
    `F.scaled_dot_product_attention` on the same inputs, unless `trace.needs_weights`.
    Both give zeros, never NaN, for a query row with no key to attend to. The fused path
    hands SDPA grouped-query k/v as they are (where it takes them, `SDPA_GQA`); the explicit
    path copies them out to every query head (`expand_kv`).

    softcap: scaled scores become softcap * tanh(scores / softcap) before the mask (Gemma
    2's attn_logit_softcapping; None: no cap). SDPA computes its scores inside its kernels
    and has no step between product and softmax to cap them, so a capped call always takes
    the explicit path (exact): whole, holding the (B, nh, T, S) scores, or without autograd
    on a CPU in tiles (`explicit.explicit_attend`, docs/models.md#soft-capping).

    wide: in 16 bits, the explicit and traced paths multiply q and k in float32 (GPT-J's and
    GPT-Neo's scores, which float16's range may not hold); SDPA sums in float32 already.

    sinks: (nh,) a logit per query head that each row's softmax counts beside the keys and
    then drops (gpt-oss's attention sinks, `layers.sink_softmax`): the weights sum to less
    than 1. SDPA has no such column, so a call with sinks takes the explicit path, as a
    capped one does; None: no sink.
    """
    _check_inputs(q, k, v, softcap, sinks)
    mask = mask or Mask(None)
    if trace is not None:
        trace.note_mask(mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dropout_p = dropout_p if training else 0.0
    may_attend = mask.may_attend
    if may_attend is not None and mask.empty_rows is not None:
        # A row with nothing to attend to would softmax to NaN (and NaN gradients). Let it
        # attend everywhere, which is finite, and zero its output below.
        may_attend = may_attend | mask.empty_rows  # (B, 1, T, S)

    if fused and softcap is None and sinks is None and (
            trace is None or not trace.needs_weights):
        return fused_attend(q, k, v, mask, may_attend, scale, dropout_p)
    if wide and q.dtype in (torch.float16, torch.bfloat16):
        if trace is None:  # transformers' steps: the weights back in v's dtype for the product
            return explicit_attend(q.float(), k.float(), v, mask, may_attend, scale, dropout_p,
                                   softcap, sinks)
        # traced, every step in float32 (the weights and summaries too)
        return attend(q.float(), k.float(), v.float(), mask, scale=scale, dropout_p=dropout_p,
                      training=training, fused=fused, trace=trace, softcap=softcap,
                      sinks=sinks).to(v.dtype)
    if trace is None:
        return explicit_attend(q, k, v, mask, may_attend, scale, dropout_p, softcap, sinks)
    return _traced(q, k, v, mask, may_attend, scale, dropout_p, trace, softcap, sinks)


def _traced(q: Tensor, k: Tensor, v: Tensor, mask: Mask, may_attend: Tensor | None,
            scale: float, dropout_p: float, trace: LayerTrace, softcap: float | None,
            sinks: Tensor | None) -> Tensor:
    """`attend` under a trace: the traced path for every head and row it keeps, the context
    of the others from the fused path (explicit with a cap or sinks)."""
    nh = q.shape[1]
    # raw or masked scores are computed whole, and dropout reads every weight: then the
    # traced path runs for every head and row
    whole = dropout_p > 0.0 or trace.wants("attn_scores") or trace.wants("masked_scores")
    heads = None if whole else _heads_alone(trace, nh)
    rows = None if whole else _rows_alone(trace, q.shape[2])
    kept_sinks = sinks
    if heads is None:
        kept = (q, expand_kv(k, nh), expand_kv(v, nh))  # (B, nh, S, hs) k and v
    else:  # the key/value head each kept query head reads
        kv_heads = [h // (nh // k.shape[1]) for h in heads]
        kept = (q[:, heads], k[:, kv_heads], v[:, kv_heads])  # (B, heads, T or S, hs)
        kept_sinks = None if sinks is None else sinks[heads]  # (heads,)
    if heads is None and rows is None:
        return traced_attend(*kept, mask, may_attend, scale, dropout_p, trace, softcap, sinks)
    # the kept heads' (and rows') weights and summaries on the traced path, every head's context
    # on the fused one (explicit with a cap or sinks): no (B, nh, T, S) tensor for heads or
    # rows unkept
    if rows is None:
        traced_attend(*kept, mask, may_attend, scale, 0.0, trace, softcap, kept_sinks)
    else:
        traced_rows(*kept, mask, may_attend, scale, rows, trace, softcap, kept_sinks)
    if softcap is not None or sinks is not None:
        return explicit_attend(q, k, v, mask, may_attend, scale, dropout_p, softcap, sinks)
    return fused_attend(q, k, v, mask, may_attend, scale, dropout_p)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, softcap: float | None,
                  sinks: Tensor | None) -> None:
    """Raise unless q (B, nh, T, hs) and k, v (B, nkv, S, hs) fit `attend`, a softcap is None
    or positive and sinks None or (nh,)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"attend expects 4-d (B, heads, len, hs) tensors, got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if (k.shape != v.shape or q.shape[-1] != k.shape[-1] or q.shape[0] != k.shape[0]
            or q.shape[1] % k.shape[1]):
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not fit: "
            "need q (B, nh, T, hs) and k == v shape (B, nkv, S, hs), nh a multiple of nkv"
        )
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap={softcap} must be > 0 (None: no cap)")
    if sinks is not None and tuple(sinks.shape) != (q.shape[1],):
        raise ValueError(f"sinks of shape {tuple(sinks.shape)} for {q.shape[1]} query heads: "
                         f"pass one logit per query head, ({q.shape[1]},)")


def _heads_alone(trace: LayerTrace, n_head: int) -> list[int] | None:
    """The query heads whose weights and summaries alone the trace needs (`trace.heads`, a
    subset of the n_head), or None when there is no such head filter."""
    heads = trace.heads
    if heads is None or len(heads) >= n_head:
        return None
    if not all(0 <= h < n_head for h in heads):  # the full path names the bad heads
        return None
    return list(heads)


def _rows_alone(trace: LayerTrace, T: int) -> list[int] | None:
    """The query rows whose weights alone the trace needs (`trace.rows` of this pass's T, not
    all of them), or None when there is no such row filter or it keeps no weights
    (summaries cover every row)."""
    if trace.rows is None or not trace.wants("attn_weights"):
        return None
    rows = query_rows(trace.rows, T)
    return rows if len(rows) < T else None


# ----------------------------------------------------------------------------- module


class CausalSelfAttention(nn.Module):
    """Multi-head attention over one sequence (or, with `context`, cross-attention).

    Projections are created in the order query, key, value (then the output projection),
    so a model built after `torch.manual_seed(s)` draws the same weights as the
    `CausalAttention` of *Build a Large Language Model from Scratch* (ch. 3;
    docs/notebooks/001_causal_attention.ipynb checks its numbers). n_head=1 and
    out_proj=False give exactly its single head.

    Args:
        d_in: width C of the input x.
        d_out: total width of all query heads (nh * hs); defaults to d_in.
        n_head: query heads nh. n_kv_head: key/value heads nkv (GQA), defaults to n_head.
        bias: bias on the q/k/v (and output) projections.
        out_bias: bias on the output projection; None = `bias` (Qwen2: q/k/v only).
        qk_norm: a norm (weight (hs,), eps `norm_eps`) on each head's q and k before RoPE
            (Qwen3, Gemma 3): `qk_norm_kind` "rmsnorm", "gemma_rmsnorm" or "olmo_rmsnorm"; with
            `qk_norm_whole`, one over each token's whole q (d_out) and k (OLMo 2);
            "heads_cohere" or "heads_stablelm": a LayerNorm with a weight row per head
            (`HeadsLayerNorm`: Command R+'s, StableLM-2-12B's).
        rope_in_float32: q and k rotated in float32 and cast back (OLMo's rounding);
            rope_tables_rounded: by cos and sin rounded to their dtype first (Cohere's).
        rope_pairs: RoPE turns adjacent pairs of dims (GPT-J's layout), not halves.
        l2_eps: each head's q and k divided by their root mean square (`rms_norm` without a
            weight, this eps) after RoPE (Llama 4's layers with RoPE); None: not.
        clip: q, k and v clamped to +-clip as they leave their projections (OLMo 1's).
        norm_after_rope: the per-head QK-norm after RoPE, not before it (Hunyuan's).
        scores_in_float32: `attend`'s `wide` (GPT-J's and GPT-Neo's scores).
        rope_names: record q_pre_rope / k_pre_rope on calls without `rope` too (a RoPE
            model's layers without it, NoPE: equal to q and k).
        out_proj: add the output projection back to d_in (GPT-2's attention); False returns
            the concatenated heads of width d_out (the book's `CausalAttention`, the
            hello-world model).
        dropout: dropout on attention weights and on the output, in training only.
        causal: False gives encoder-style attention with no causal mask (every query sees
            every key).
        scale: multiplier of the scores; None means 1/sqrt(hs).
        softcap: cap of the scaled scores, softcap * tanh(scores / softcap), before the
            mask (Gemma 2); None: no cap. A capped module takes the explicit path (`attend`).
        sinks: a learned logit per query head in each row's softmax (`sinks`, (nh,), zero at
            first: gpt-oss's attention sinks); such a module takes the explicit path too.
        d_context: width of the sequence keys/values come from in cross-attention.
    """

    def __init__(
        self,
        d_in: int,
        d_out: int | None = None,
        n_head: int = 1,
        n_kv_head: int | None = None,
        *,
        bias: bool = False,
        out_proj: bool = True,
        dropout: float = 0.0,
        causal: bool = True,
        scale: float | None = None,
        d_context: int | None = None,
        out_bias: bool | None = None,
        qk_norm: bool = False,
        norm_eps: float = 1e-5,
        qk_norm_kind: str = "rmsnorm",
        softcap: float | None = None,
        qk_norm_whole: bool = False,
        rope_in_float32: bool = False,
        rope_tables_rounded: bool = False,
        rope_names: bool = False,
        rope_pairs: bool = False,
        scores_in_float32: bool = False,
        sinks: bool = False,
        l2_eps: float | None = None,
        clip: float | None = None,
        norm_after_rope: bool = False,
    ) -> None:
        super().__init__()
        d_out = d_in if d_out is None else d_out
        n_kv_head = n_head if n_kv_head is None else n_kv_head
        if d_out % n_head:
            raise ValueError(
                f"d_out={d_out} is not divisible by n_head={n_head}; "
                "pick n_head among the divisors of the attention width"
            )
        if n_head % n_kv_head:
            raise ValueError(
                f"n_head={n_head} is not a multiple of n_kv_head={n_kv_head}; "
                "each key/value head must serve a whole number of query heads"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout} must be in [0, 1)")
        self.n_head, self.n_kv_head = n_head, n_kv_head
        self.head_size = d_out // n_head
        self.causal, self.scale, self.dropout, self.softcap = causal, scale, dropout, softcap
        d_kv_in = d_in if d_context is None else d_context
        d_kv = n_kv_head * self.head_size
        self.query = Linear(d_in, d_out, bias=bias)
        self.key = Linear(d_kv_in, d_kv, bias=bias)
        self.value = Linear(d_kv_in, d_kv, bias=bias)
        out_bias = bias if out_bias is None else out_bias
        self.out_proj = Linear(d_out, d_in, bias=out_bias) if out_proj else None
        self.out_dropout = nn.Dropout(dropout)
        # over each head's hs, or (qk_norm_whole, OLMo 2) each token's whole q and k
        q_dim, k_dim = (d_out, d_kv) if qk_norm_whole else (self.head_size, self.head_size)
        self.qk_norm_whole, self.rope_in_float32 = qk_norm_whole, rope_in_float32
        self.rope_tables_rounded = rope_tables_rounded
        self.rope_pairs, self.scores_in_float32 = rope_pairs, scores_in_float32
        # a RoPE model's layer names q_pre_rope / k_pre_rope even where it turns nothing (NoPE)
        self.rope_names = rope_names
        self.l2_eps, self.clip, self.norm_after_rope = l2_eps, clip, norm_after_rope
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        if qk_norm and qk_norm_kind.startswith("heads_"):  # a weight row per head
            steps = qk_norm_kind.removeprefix("heads_")
            self.q_norm = HeadsLayerNorm(n_head, self.head_size, norm_eps, steps)
            self.k_norm = HeadsLayerNorm(n_kv_head, self.head_size, norm_eps, steps)
        elif qk_norm:
            self.q_norm = make_norm(qk_norm_kind, q_dim, eps=norm_eps)
            self.k_norm = make_norm(qk_norm_kind, k_dim, eps=norm_eps)
        self.sinks = nn.Parameter(torch.zeros(n_head)) if sinks else None  # (nh,)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_size).transpose(1, 2)  # (B, T, n, hs) -> (B, n, T, hs)

    def _project(self, x: Tensor, source: Tensor, trace: LayerTrace | None,
                 rope: tuple[Tensor, Tensor] | None, temperature: Tensor | None
                 ) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, C) and the keys' source (B, S_new, C) -> q (B, nh, T, hs), this call's k
        and v (B, nkv, S_new, hs): projected, clamped, QK-normed (before RoPE, or after it),
        turned by RoPE, L2-normed and the q tempered, each where this attention does it
        (`forward`'s arguments)."""
        q, k = self.query(x), self.key(source)  # (B, T, nh * hs), (B, S_new, nkv * hs)
        v = self.value(source)  # (B, S_new, nkv * hs)
        if self.clip is not None:
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))  # same shapes
        q_norm, k_norm = self.q_norm, self.k_norm
        if q_norm is not None and k_norm is not None and self.qk_norm_whole:
            q, k = q_norm(q), k_norm(k)  # over each token's whole q and k
        q = self._heads(q, self.n_head)  # (B, nh, T, hs)
        k = self._heads(k, self.n_kv_head)  # (B, nkv, S_new, hs)
        v = self._heads(v, self.n_kv_head)  # (B, nkv, S_new, hs)
        if q_norm is not None and k_norm is not None and not (
                self.qk_norm_whole or self.norm_after_rope):
            q, k = q_norm(q), k_norm(k)  # per head, over hs
        if trace is not None and (rope is not None or self.rope_names):
            q = trace.record("q_pre_rope", q)  # a NoPE layer's: q itself
            k = trace.record("k_pre_rope", k)
        if rope is not None:
            how = self.rope_in_float32, self.rope_pairs, self.rope_tables_rounded
            q, k = apply_rotary(q, *rope, *how), apply_rotary(k, *rope, *how)  # same shapes
        if q_norm is not None and k_norm is not None and self.norm_after_rope:
            q, k = q_norm(q), k_norm(k)  # per head, after RoPE: Hunyuan's order
        if self.l2_eps is not None:
            q, k = rms_norm(q, None, self.l2_eps), rms_norm(k, None, self.l2_eps)  # same shapes
        if temperature is not None:
            q = (q * temperature).to(q.dtype)  # (B, nh, T, hs), multiplied in float32
        return q, k, v

    def forward(
        self,
        x: Tensor,
        attention_mask: Tensor | None = None,
        *,
        mask: Mask | None = None,
        context: Tensor | None = None,
        kv_cache: LayerCache | None = None,
        pos: int = 0,
        trace: LayerTrace | None = None,
        fused: bool | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        temperature: Tensor | None = None,
    ) -> Tensor:
        """x (B, T, C) -> (B, T, C) (or (B, T, d_out) without out_proj).

        attention_mask: (B, S) 1/0 over the keys (cached + new, or the context). `mask`
        passes a prebuilt `Mask` instead (the model builds one for all layers).
        kv_cache/pos: write this call's keys/values at position `pos` of a cache and attend
        over everything it holds. fused: None picks fused unless the trace needs weights
        (as True does: `attend` decides); False the explicit path.
        rope: cos, sin (B or 1, 1, T, rd) of this call's positions (`rope.Rotary`): q and
        the new k are rotated before k is cached. temperature: (B or 1, 1, T, 1) float32
        factors of q's rows (Llama 4's NoPE layers: `rope.nope_temperatures`).
        """
        if x.dim() != 3:
            raise ValueError(f"x must be (B, T, C), got shape {tuple(x.shape)}")
        source = x if context is None else context
        B, T, _ = x.shape
        q, k, v = self._project(x, source, trace, rope, temperature)  # (B, heads, T, hs)
        if kv_cache is not None:
            k, v = kv_cache.update(pos, k, v)  # (B, nkv, S, hs) with S = pos + S_new
        if trace is not None:
            q = trace.record("q", q)
            k = trace.record("k", k)  # an edit here is not written back to the cache: it
            v = trace.record("v", v)  # applies again, to every position, at each call
        if mask is None:
            cross = context is not None
            mask = build_mask(T, k.shape[2], attention_mask, causal=self.causal and not cross,
                              device=x.device, cross=cross)
        context_vec = attend(
            q, k, v, mask,
            scale=self.scale,
            dropout_p=self.dropout,
            training=self.training,
            fused=True if fused is None else fused,  # attend keeps weights off the fused path
            trace=trace,
            softcap=self.softcap,
            wide=self.scores_in_float32,
            sinks=self.sinks,
        )  # (B, nh, T, hs)
        if trace is not None:
            context_vec = trace.record("context", context_vec)
        y = context_vec.transpose(1, 2).reshape(B, T, -1)  # (B, nh, T, hs) -> (B, T, nh * hs)
        if self.out_proj is None:
            return y
        y = self.out_dropout(self.out_proj(y))  # (B, T, C)
        if trace is not None:
            y = trace.record("attn_out", y)
        return y
