"""`attend`'s explicit path under a trace: scores, weights and summaries, in blocks of queries.

`attention.py` owns the attention math and calls `traced_attend` when a trace or an edit
reads scores, weights or summaries; this module owns how that work is split. Each block of
query rows gets its scores over the keys those queries may attend, scaled, capped (`attend`'s
softcap) and masked as the reference path does, its softmax, and then either a place in the
one (B, nh, T, S) weights tensor a trace keeps or, when only summaries are wanted, its
reductions (`summaries.Summaries`) and its share of the context, after which it is
discarded: a trace of summaries alone never holds a (B, nh, T, S) tensor. On a GPU with
triton it runs no explicit path: SDPA gives the context and `summary_kernels.py` the
summaries from q and k (`kernel_mask`: masks `build_mask` made), but where scores are
capped or softmaxed with sinks, which neither can do. Summaries mean what `summaries.py`
says; `trace.py` stores them.

Blocks by device: a CPU runs `BLOCK_ROWS` queries at a time (its scores stay in cache); CUDA
(`ONE_BLOCK`) all as one, since small products leave a GPU waiting on launches
(docs/performance-gpu.md#trace-on-a-gpu); summaries stream in tiles of `summaries.TILE_BYTES`.
The split changes speed, never a result (tests compare each split's weights on the CPU).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from . import summary_kernels, tf32x3
from .layers import sink_softmax, soft_cap
from .runtime import kept_empty, kept_out, wide
from .sdpa import fused_attend
from .summaries import LEARNED_SINK, SUMMARY_NAMES, Summaries, tile_elements

if TYPE_CHECKING:
    from .attention import LayerTrace
    from .masks import Mask

#: Query rows per block of a traced CPU pass: a block's (B, nh, rows, S) scores stay in cache
#: (at GPT-2 small's nh = 12, S = 1024: 6 MiB), where one (B, nh, T, S) temporary per step
#: went through fresh pages of memory.
BLOCK_ROWS = 128
#: Device types whose traced pass computes all query rows as one block (few large kernels).
ONE_BLOCK = {"cuda"}
Span = tuple[int, int, int]


def key_spans(may_attend: Tensor | None, T: int, S: int, rows: int) -> list[Span]:
    """For each block of `rows` queries: the keys [start, end) any of them may attend (all
    others get weight exactly 0; a causal block reads keys up to its last query only), and
    the first key of that span one of them may not attend (end if none): masking starts
    there (a causal block's last `rows` keys)."""
    starts = range(0, T, rows)
    if may_attend is None:
        return [(0, S, S) for _ in starts]
    seen = may_attend.any(dim=1).any(dim=0)  # (B or 1, 1, T, S) -> (T, S)
    hidden = ~may_attend.all(dim=1).all(dim=0)  # (T, S) some row's query may not see the key
    spans = []
    for i0 in starts:
        cols = seen[i0:i0 + rows].any(dim=0).nonzero()  # (n, 1) keys some query here may see
        k0, k1 = (int(cols[0]), int(cols[-1]) + 1) if len(cols) else (0, S)
        masked = hidden[i0:i0 + rows, k0:k1].any(dim=0).nonzero()  # (m, 1)
        spans.append((k0, k1, k0 + int(masked[0]) if len(masked) else k1))
    return spans


def block_rows(q: Tensor) -> int:
    """Query rows per block of the weights for q (B, nh, T, hs): `BLOCK_ROWS` on a CPU,
    every row on a device in `ONE_BLOCK`."""
    T = q.shape[2]
    return T if q.device.type in ONE_BLOCK else min(T, BLOCK_ROWS)


def stream_tile(q: Tensor, S: int) -> tuple[int, int]:
    """(rows, heads) of one streamed tile for q (B, nh, T, hs) over S keys: every head and as
    many rows as `summaries.TILE_BYTES` holds, but no fewer than `BLOCK_ROWS` while heads
    can be split off instead (a matrix product of fewer rows runs far below the BLAS's
    speed, docs/performance.md#summary-tiles)."""
    B, nh, T, _ = q.shape
    budget, per_row = tile_elements(q.device), B * S
    least = min(T, BLOCK_ROWS)
    rows = budget // (per_row * nh)
    if rows >= least:
        return min(T, rows), nh
    if per_row * least <= budget:
        return least, min(nh, budget // (per_row * least))
    return max(1, budget // per_row), 1


def _spans(mask: Mask, may_attend: Tensor | None, T: int, S: int, rows: int) -> list[Span]:
    """`key_spans`, worked out once per mask (every layer it serves shares them)."""
    spans = mask.spans.get((T, S, rows))
    if spans is None:
        spans = mask.spans[T, S, rows] = key_spans(may_attend, T, S, rows)
    return spans


def _block_weights(q: Tensor, key_t: Tensor, scores: Tensor | None, mask: Mask,
                   may_attend: Tensor | None, scale: float, i0: int, i1: int, span: Span,
                   dtype: torch.dtype | None = None, masked_add: Tensor | None = None,
                   picked: Tensor | None = None, out: Tensor | None = None,
                   softcap: float | None = None, sinks: Tensor | None = None) -> Tensor:
    """Weights (B, heads, i1 - i0, k1 - k0) of queries i0..i1 over the span's keys, from q
    (B, heads, T, hs) and key_t (B, heads, hs, S), or from the raw `scores` when given;
    softmax in `dtype` (None: q's). masked_add: `_masked_add` over the block's masked keys,
    when the caller made it already. picked: the query rows to take (an index into the T, in
    any order) in place of i0..i1. out: memory of at least the block's size (`kept_out`)
    for its scores, and for its weights too where the softmax keeps their dtype (a softmax
    in place: no fresh block per step). softcap, sinks (heads,): `attend`'s (the cap before
    the mask, the sinks in the softmax). Rows with nothing to attend to come out 0."""
    k0, k1, m0 = span
    empty = mask.empty_rows
    in_product = False  # whether the product wrote the mask's -inf itself
    if scores is None:
        q_block, key_block = _rows_of(q, i0, i1, picked), key_t[..., k0:k1]
        if tf32x3.wanted(q_block, key_block, q_block.shape[2]):
            # picked rows need not be consecutive: no one diagonal bounds them; a cap would
            # turn the product's -inf into -softcap: then the mask is added after the cap
            diagonal = None if picked is not None or softcap is not None else _causal_diagonal(
                mask, may_attend, q.shape[2], key_t.shape[-1], i0, k0)
            in_product = diagonal is not None
            block = tf32x3.matmul(q_block, key_block, scale, diagonal)  # (B, heads, rows, keys)
        else:
            block = scaled_scores(q_block, key_block, scale, out)  # (B, heads, rows, keys)
    else:
        raw = _rows_of(scores, i0, i1, picked)[..., k0:k1]  # (B, heads, rows, keys)
        block = torch.mul(raw, scale, out=_leading(out, raw.shape))  # (B, heads, rows, keys)
    if softcap is not None:
        block = soft_cap(block, softcap, inplace=True)  # (B, heads, rows, keys)
        if scores is not None:  # masked (or edited) scores: their -inf stays -inf, as if
            block.masked_fill_(raw.isneginf(), float("-inf"))  # masked after the cap
    if empty is not None:
        empty = _rows_of(empty, i0, i1, picked)  # (B, 1, rows, 1)
        # a row with no key to attend to: finite everywhere, zeroed below
        block.masked_fill_(empty, 0.0)
    if may_attend is not None and scores is None and m0 < k1 and not in_product:  # -inf
        if masked_add is None:
            masked_add = _masked_add(may_attend, i0, i1, picked, m0, k1, block.dtype)
        block[..., m0 - k0:].add_(masked_add)  # (B, heads, rows, masked keys)
    if sinks is not None:
        weights = sink_softmax(block, sinks, dtype)  # (B, heads, rows, keys)
    elif out is not None and dtype in (None, block.dtype):
        weights = torch.softmax(block, dim=-1, out=block)  # (B, heads, rows, keys)
    else:
        weights = torch.softmax(block, dim=-1, dtype=dtype)  # (B, heads, rows, keys)
    if empty is not None and weights.requires_grad:  # softmax's backward reads its output
        weights = weights.masked_fill(empty, 0.0)
    elif empty is not None:
        weights.masked_fill_(empty, 0.0)
    return weights


def _masked_add(may_attend: Tensor, i0: int, i1: int, picked: Tensor | None, m0: int, k1: int,
                dtype: torch.dtype) -> Tensor:
    """0 where query i0 + r (or picked[r]) may attend key m0 + c, -inf where not:
    (B or 1, 1, rows, k1 - m0). Added to the scores it masks them as the reference path
    does (`explicit._whole`), in one pass that costs a fraction of a masked_fill_'s with
    the mask broadcast over the heads (docs/performance.md#trace-on-an-intel-xeon)."""
    allowed = _rows_of(may_attend, i0, i1, picked)[..., m0:k1]  # (B or 1, 1, rows, keys)
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, float("-inf"))


def _for_blocks(x: Tensor) -> Tensor:
    """q or k (B, heads, len, hs) as the block products read it: contiguous once (its blocks
    are read many times), but one sequence's on a CPU, whose blocks the BLAS reads where they
    lie (the copy cost more: docs/performance.md#trace-on-an-intel-xeon)."""
    if x.shape[0] == 1 and x.device.type == "cpu" and x.stride(-1) == 1 and 0 not in x.stride():
        return x
    return x.contiguous()


def _rows_of(t: Tensor, i0: int, i1: int, picked: Tensor | None) -> Tensor:
    """Query rows i0..i1 of t (B, heads, T, ...), or the `picked` ones: (B, heads, rows, ...)."""
    return t[:, :, i0:i1] if picked is None else t.index_select(2, picked)


def _causal_diagonal(mask: Mask, may_attend: Tensor | None, T: int, S: int, i0: int,
                     k0: int) -> int | None:
    """Where may_attend is the causal mask alone (cached keys allowed; no window, no
    padding): d such that query i0 + r may attend key k0 + c iff c <= r + d. Else None."""
    if (may_attend is None or mask.causal is not True or mask.window is not None
            or mask.padding is not None):
        return None
    return i0 + S - T - k0


def scaled_scores(q: Tensor, key_t: Tensor, scale: float, out: Tensor | None = None) -> Tensor:
    """scale * (q @ key_t): q (B, heads, rows, hs), key_t (B, heads, hs, keys) -> (B, heads,
    rows, keys), written to the start of `out` when given (contiguous, at least that
    size). The BLAS applies the scale inside the product, one pass over the scores fewer
    than a `mul_` after it. A power-of-two scale (head size 4, 16, 64, 256) is exact either
    way, so those weights are bit for bit product-then-scale's; with other scales the BLAS
    may scale an operand before it sums, which rounds within float32's bound for the sum."""
    B, heads, rows, hs = q.shape
    keys = key_t.shape[-1]
    # beta=0: the (unread) input adds nothing, not even a nan
    q_3d = q.reshape(B * heads, rows, hs)  # (B, heads, rows, hs) -> (B * heads, rows, hs)
    key_t_3d = key_t.reshape(B * heads, hs, keys)  # (B, heads, hs, keys) -> (B * heads, hs, keys)
    # (B * heads, rows, hs) @ (B * heads, hs, keys) -> (B * heads, rows, keys)
    into = _leading(out, (B * heads, rows, keys))  # (B * heads, rows, keys)
    scores = torch.baddbmm(q.new_empty(()), q_3d, key_t_3d, beta=0.0, alpha=scale, out=into)
    return scores.view(B, heads, rows, keys)  # (B * heads, rows, keys) -> (B, heads, rows, keys)


def _leading(out: Tensor | None, shape: tuple[int, ...]) -> Tensor | None:
    """The first prod(shape) elements of `out` (contiguous) as a tensor of `shape`; None
    without `out`."""
    return None if out is None else out.view(-1)[:math.prod(shape)].view(shape)


def _product(weights: Tensor, v: Tensor, diagonal: int | None = None) -> Tensor:
    """weights (B, nh, rows, keys) @ v (B, nh, keys, hs) -> (B, nh, rows, hs), as 3xTF32
    where `tf32x3.wanted` says so; diagonal: the weights are 0 past it (`_causal_diagonal`),
    so 3xTF32 does not read them."""
    if tf32x3.wanted(weights, v, weights.shape[-2]):
        return tf32x3.matmul(weights, v, diagonal=diagonal, past="zero")
    return weights @ v  # (B, nh, rows, keys) @ (B, nh, keys, hs) -> (B, nh, rows, hs)


def _scores(q: Tensor, key_t: Tensor, mask: Mask, trace: LayerTrace
            ) -> tuple[Tensor | None, bool]:
    """The masked raw scores (B, nh, T, S) when the trace wants the scores (None when not),
    and whether `mask` still says what is masked (not when an edit changed the scores)."""
    if not (trace.wants("attn_scores") or trace.wants("masked_scores")):
        return None, True
    B, nh, T, _ = q.shape
    shape = (B, nh, T, key_t.shape[-1])
    # kept tensors of many MiB: in reused buffers where autograd allows out=
    # (B, nh, T, hs) @ (B, nh, hs, S) -> (B, nh, T, S)
    raw = torch.matmul(q, key_t, out=kept_out(shape, q, key_t))
    attn_scores = trace.record("attn_scores", raw)  # (B, nh, T, S)
    scores = attn_scores
    if mask.may_attend is not None:
        scores = torch.where(mask.may_attend, attn_scores, q.new_tensor(float("-inf")),
                             out=kept_out(shape, q, key_t))  # (B, nh, T, S)
    made = scores
    scores = trace.record("masked_scores", scores)
    return scores, scores is made  # edited: its -inf cells, not the mask's, say what is masked


def _summaries(trace: LayerTrace, q: Tensor, S: int, mask: Mask, sinks: bool = False
               ) -> Summaries | None:
    """The summaries (empty) the trace wants of the layer, or None; the sinks' if `sinks`."""
    names = [name for name in (*SUMMARY_NAMES, *[LEARNED_SINK] * sinks) if trace.wants(name)]
    if mask.cross and not trace.named("attn_distance"):  # none in cross-attention (NAMES)
        names = [name for name in names if name != "attn_distance"]
    if not names:
        return None
    B, nh, T, _ = q.shape
    return Summaries(names, (B, nh, T, S), mask.padding, dtype=q.dtype, device=q.device,
                     cross=mask.cross)


def traced_attend(q: Tensor, k: Tensor, v: Tensor, mask: Mask, may_attend: Tensor | None,
                  scale: float, dropout_p: float, trace: LayerTrace,
                  softcap: float | None = None, sinks: Tensor | None = None) -> Tensor:
    """`attend`'s explicit path with a trace: q (B, nh, T, hs), k and v (B, nh, S, hs) with
    the key/value heads already expanded; may_attend: the mask with empty rows let through.

    The raw and masked scores are computed whole, and only when the trace wants them. The
    weights are computed block by block: into the one (B, nh, T, S) tensor the trace keeps
    (or an edit or dropout reads), or, for a trace of summaries alone, streamed. Whatever
    `trace.record` returns is what the computation goes on with. softcap and sinks (nh,):
    `attend`'s, which the GPU kernels lack: such a trace never takes them."""
    T, S = q.shape[2], k.shape[2]
    if (softcap is None and sinks is None and dropout_p == 0.0 and T <= S and kernel_mask(mask)
            and summary_kernels.available(q)
            and not (trace.wants("attn_scores") or trace.wants("masked_scores"))):
        summarised = any(trace.wants(name) for name in SUMMARY_NAMES)
        if summarised and not trace.wants("attn_weights"):  # summaries alone
            return _kernel_summaries(trace, q, k, v, mask, may_attend, scale)
        if q.dtype in summary_kernels.WEIGHTS_FROM_LSE and not summarised:  # weights alone
            return _kernel_weights(trace, q, k, v, mask, scale)
    q = _for_blocks(q)  # (B, nh, T, hs)
    key_t = _for_blocks(k).transpose(-2, -1)  # (B, nh, S, hs) -> (B, nh, hs, S)
    scores, masked_by_mask = _scores(q, key_t, mask, trace)
    if not masked_by_mask:
        may_attend = None
    summaries = _summaries(trace, q, S, mask, sinks is not None)
    if (summaries is not None and scores is None and dropout_p == 0.0
            and not trace.wants("attn_weights")):  # summaries alone: streamed
        context = _streamed(q, key_t, v, mask, may_attend, scale, summaries, softcap, sinks)
        _record_summaries(trace, summaries)
        return context
    rows = block_rows(q)
    spans = (_spans(mask, may_attend, T, S, rows) if masked_by_mask
             else key_spans(None, T, S, rows))
    attn_weights = _whole_weights(q, key_t, scores, mask, may_attend, scale, spans, rows,
                                  summaries, softcap, sinks)
    made = attn_weights
    attn_weights = trace.record("attn_weights", attn_weights)
    if summaries is not None and attn_weights is not made:  # edited: what the model uses
        summaries = _summaries(trace, q, S, mask, sinks is not None)
        assert summaries is not None
        summaries.add(attn_weights, 0, 0)
    if dropout_p > 0.0:
        attn_weights = F.dropout(attn_weights, p=dropout_p, training=True)  # (B, nh, T, S)
        attn_weights = trace.record("attn_weights_dropped", attn_weights)
    if summaries is not None:
        _record_summaries(trace, summaries)
    if attn_weights is not made or spans == [(0, S, spans[0][2])]:  # dropped, edited, one block
        # made under a plain causal mask: 0 past the diagonal, which the product may skip
        diagonal = _causal_diagonal(mask, may_attend, T, S, 0, 0) if attn_weights is made else None
        # (B, nh, T, S) @ (B, nh, S, hs) -> (B, nh, T, hs)
        return _product(attn_weights, v, diagonal)
    return torch.cat([
        _product(attn_weights[:, :, i0:i0 + rows, k0:k1], v[:, :, k0:k1])  # (B, nh, rows, hs)
        for i0, (k0, k1, _) in zip(range(0, T, rows), spans, strict=True)
    ], dim=2)  # (B, nh, T, hs)


def traced_rows(q: Tensor, k: Tensor, v: Tensor, mask: Mask, may_attend: Tensor | None,
                scale: float, rows: list[int], trace: LayerTrace,
                softcap: float | None = None, sinks: Tensor | None = None) -> None:
    """The weights of the query `rows` alone, (B, heads, len(rows), S), recorded as
    "attn_weights"; and, when the trace wants summaries, every row's (`traced_attend` with
    the weights hidden from it). q (B, heads, T, hs), k and v (B, heads, S, hs) as
    `traced_attend` takes them; the caller computes the context."""
    key_t = k.contiguous().transpose(-2, -1)  # (B, heads, hs, S)
    S = key_t.shape[-1]
    picked = torch.tensor(rows, device=q.device)  # (rows,)
    weights = _block_weights(q, key_t, None, mask, may_attend, scale, 0, len(rows), (0, S, 0),
                             picked=picked, softcap=softcap,
                             sinks=sinks)  # (B, heads, rows, S)
    trace.record("attn_weights", weights)
    if any(trace.wants(name) for name in (*SUMMARY_NAMES, LEARNED_SINK)):
        traced_attend(q, k, v, mask, may_attend, scale, 0.0, _WithoutWeights(trace), softcap,
                      sinks)


class _WithoutWeights:
    """A sink as `traced_rows` hands it on: its rows' weights are made, so it wants no
    weights, only its summaries (which `traced_attend` then streams)."""

    def __init__(self, trace: LayerTrace) -> None:
        self.trace, self.needs_weights, self.heads = trace, True, trace.heads
        self.rows: tuple[int, ...] | None = None

    def wants(self, name: str) -> bool:
        return name != "attn_weights" and self.trace.wants(name)

    def record(self, name: str, value: Tensor) -> Tensor:
        return self.trace.record(name, value)

    def note_mask(self, mask: Mask) -> None:
        self.trace.note_mask(mask)

    def named(self, name: str) -> bool:
        return self.trace.named(name)


def _whole_weights(q: Tensor, key_t: Tensor, scores: Tensor | None, mask: Mask,
                   may_attend: Tensor | None, scale: float, spans: list[Span], rows: int,
                   summaries: Summaries | None, softcap: float | None = None,
                   sinks: Tensor | None = None) -> Tensor:
    """The (B, nh, T, S) weights, block by block (the summaries reduced from each block):
    one block over every key is the softmax's own result, else a kept buffer filled in."""
    B, nh, T, _ = q.shape
    S = key_t.shape[-1]
    # with summaries, the softmax runs in their dtype and the weights are rounded from it
    dtype = None if summaries is None else wide(q.dtype)
    if len(spans) == 1 and spans[0][:2] == (0, S):
        weights = _block_weights(q, key_t, scores, mask, may_attend, scale, 0, T, spans[0],
                                 dtype, softcap=softcap, sinks=sinks)  # (B, nh, T, S)
        if summaries is not None:
            summaries.add(weights, 0, 0)
        return weights.to(q.dtype)
    attn_weights = kept_empty((B, nh, T, S), q)  # (B, nh, T, S)
    # one block's memory for every block's scores and softmax: no fresh block per step
    scratch = kept_out((B, nh, rows, S), q, key_t,
                       *([] if scores is None else [scores]))  # (B, nh, rows, S)
    for i0, (k0, k1, m0) in zip(range(0, T, rows), spans, strict=True):
        i1 = min(i0 + rows, T)
        block = _block_weights(q, key_t, scores, mask, may_attend, scale, i0, i1,
                               (k0, k1, m0), dtype, out=scratch,
                               softcap=softcap, sinks=sinks)  # (B, nh, rows, keys)
        if summaries is not None:
            summaries.add(block, i0, k0)
        out = attn_weights[:, :, i0:i1]  # (B, nh, rows, S)
        out[..., k0:k1] = block
        out[..., :k0].zero_()
        out[..., k1:].zero_()
    return attn_weights


def tiled_attend(q: Tensor, k: Tensor, v: Tensor, mask: Mask, may_attend: Tensor | None,
                 scale: float, softcap: float | None = None,
                 sinks: Tensor | None = None) -> Tensor:
    """`attend`'s explicit steps a tile of queries and heads at a time (`stream_tile`), over
    each tile's keys alone (none past a causal diagonal), the weights discarded: no (B, nh,
    T, S) tensor. For a forward without autograd with a soft cap or sinks, which SDPA cannot
    compute (docs/models.md#soft-capping). q, k, v as `traced_attend` takes them; returns
    the context (B, nh, T, hs)."""
    key_t = _for_blocks(k).transpose(-2, -1)  # (B, nh, S, hs) -> (B, nh, hs, S)
    return _streamed(_for_blocks(q), key_t, v, mask, may_attend, scale, None, softcap, sinks)


def _streamed(q: Tensor, key_t: Tensor, v: Tensor, mask: Mask, may_attend: Tensor | None,
              scale: float, summaries: Summaries | None, softcap: float | None = None,
              sinks: Tensor | None = None) -> Tensor:
    """A trace of summaries alone: each tile's weights (`stream_tile`) reduced into
    `summaries` (None: none kept), its context kept, the weights discarded. Returns the
    context (B, nh, T, hs)."""
    B, nh, T, _ = q.shape
    S = key_t.shape[-1]
    rows, heads = stream_tile(q, S)
    spans = _spans(mask, may_attend, T, S, rows)
    context = v.new_empty((B, nh, T, v.shape[-1]))  # (B, nh, T, hs)
    dtype = None if summaries is None else summaries.dtype  # the softmax's
    for i0, (k0, k1, m0) in zip(range(0, T, rows), spans, strict=True):
        i1 = min(i0 + rows, T)
        masked_add = (None if may_attend is None or m0 == k1
                      else _masked_add(may_attend, i0, i1, None, m0, k1, q.dtype))
        for h0 in range(0, nh, heads):
            h = slice(h0, h0 + heads)
            weights = _block_weights(q[:, h], key_t[:, h], None, mask, may_attend, scale, i0, i1,
                                     (k0, k1, m0), dtype, masked_add, softcap=softcap,
                                     sinks=None if sinks is None else sinks[h]
                                     )  # (B, heads, rows, keys)
            if summaries is not None:
                summaries.add(weights, i0, k0, h0)
            # (B, heads, rows, keys) @ (B, heads, keys, hs) -> (B, heads, rows, hs)
            context[:, h, i0:i1] = weights.to(v.dtype) @ v[:, h, k0:k1]
    return context


def kernel_mask(mask: Mask) -> bool:
    """Whether `summary_kernels` rebuild mask from indices: one `build_mask` made (causal
    with cached keys, a window, key padding), or no mask at all, and not cross-attention (the
    kernels read the queries as the last T keys, so they also need T <= S)."""
    if mask.cross:
        return False
    return mask.causal is not None or (mask.may_attend is None and mask.padding is None)


def _forward_lse(q: Tensor, k: Tensor, v: Tensor, mask: Mask, scale: float
                 ) -> tuple[Tensor, Tensor] | None:
    """SDPA's context (B, nh, T, hs) and each row's lse (B, nh, T) (`attend_with_lse`) where
    `summary_kernels.LSE_FROM_FORWARD` asks for them and the mask is the plain causal one;
    else None."""
    # SDPA's kernels called by name skip its padding of head sizes to a multiple of 8
    if summary_kernels.LSE_FROM_FORWARD and mask.square_causal and q.shape[-1] % 8 == 0:
        return summary_kernels.attend_with_lse(q, k, v, scale)
    return None


def _kernel_summaries(trace: LayerTrace, q: Tensor, k: Tensor, v: Tensor, mask: Mask,
                      may_attend: Tensor | None, scale: float) -> Tensor:
    """A trace of summaries alone on a GPU: the context from the fused path (or, with
    `summary_kernels.ROWS_MAKE_CONTEXT`, from the summaries' rows pass; with
    `LSE_FROM_FORWARD` and the plain causal mask, from SDPA's kernel with each row's lse),
    the summaries from `summary_kernels` (no weight tile in memory), recorded as
    `_streamed`'s are."""
    names = [name for name in SUMMARY_NAMES if trace.wants(name)]
    causal, window, padding = bool(mask.causal), mask.window, mask.padding
    attended = _forward_lse(q, k, v, mask, scale)
    if attended is not None:
        context, lse = attended
        values = summary_kernels.layer_summaries(names, q, k, scale, causal=True, lse=lse)
    elif summary_kernels.ROWS_MAKE_CONTEXT:
        context, values = summary_kernels.attend_and_summarise(
            names, q, k, v, scale, causal=causal, window=window, padding=padding)
    else:
        context = fused_attend(q, k, v, mask, may_attend, scale, 0.0)  # (B, nh, T, hs)
        values = summary_kernels.layer_summaries(names, q, k, scale, causal=causal,
                                                 window=window, padding=padding)
    for name, value in values.items():  # (B, nh, T) or (B, nh, S) float32
        trace.record(name, value)
    return context


def _kernel_weights(trace: LayerTrace, q: Tensor, k: Tensor, v: Tensor, mask: Mask,
                    scale: float) -> Tensor:
    """A trace of the weights alone on a GPU (`summary_kernels.WEIGHTS_FROM_LSE`): each row's
    lse and the context from SDPA's kernel (`LSE_FROM_FORWARD`, the plain causal mask) or from
    the rows pass, then the weights pass. Returns the context, the product of the recorded
    weights with v where an edit changed them."""
    causal, window, padding = bool(mask.causal), mask.window, mask.padding
    attended = _forward_lse(q, k, v, mask, scale)
    if attended is not None:
        context, lse = attended
        weights, _ = summary_kernels.attention_weights(q, k, None, scale, causal=True, lse=lse)
    else:
        weights, made = summary_kernels.attention_weights(q, k, v, scale, causal=causal,
                                                          window=window, padding=padding)
        assert made is not None
        context = made
    recorded = trace.record("attn_weights", weights)  # (B, nh, T, S)
    if recorded is not weights:  # edited: the context of what the model uses
        return _product(recorded, v)  # (B, nh, T, S) @ (B, nh, S, hs) -> (B, nh, T, hs)
    return context


def _record_summaries(trace: LayerTrace, summaries: Summaries) -> None:
    for name, value in summaries.values.items():
        trace.record(name, value)
