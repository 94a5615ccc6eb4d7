"""Logit lens and direct logit attribution: read the residual stream in the vocabulary.

Logit lens (nostalgebraist, 2020): the residual stream after each layer (with `mid`, also
between each layer's attention and MLP), put through the model's final norm and unembedding
as if it were the last layer, gives a next-token distribution per layer and position: which
layer already "knows" the answer. A model that caps its logits (Gemma 2's
final_logit_softcapping) has every layer's lens logits capped as the model caps its own.
`residual_parts` splits the stream itself into what wrote it (TransformerLens's
`decompose_resid`). The norm's statistics are recomputed for each layer's residual, as
TransformerLens 4.3's `cache.accumulated_resid(apply_ln=True)` then `model.unembed` does
(equal within 1e-5 on tiny random GPT-2, Llama, Qwen3 and GPT-NeoX directories:
docs/performance.md#logit-lens-against-transformerlens); on weights processed with its
`center_unembed`, TransformerLens's logits are shifted by a constant per position.

Direct logit attribution: the final residual is a sum of parts (the embedding, each head's
output through its slice of the output projection, each output-projection bias, each MLP),
and the final LayerNorm is linear once its scale is fixed, so a target logit splits into one
term per part: (part - mean(part)) / sigma * gamma @ W_U[target], with sigma the final
residual's own norm scale, as TransformerLens's `ActivationCache.logit_attrs` does. The terms
sum to the logit exactly (up to float rounding); `bias` holds the norm's and unembedding's
constant terms. A head's term includes its value bias (b_V reaches the head's output through
its attention weights); `attn_bias` is the output projection's bias alone. With a logit cap
(final_logit_softcapping) the terms split the logit before the cap, cap * tanh(logit / cap)
being no sum of parts: `logit` is then that uncapped logit (the cap keeps its order among
tokens). With sandwich norms (Gemma 2 / 3) each branch is normed before the residual adds
it: a head's output then goes through its layer's post-norm with that norm's scale frozen at
the whole attention output, in the same way, and the terms still sum to the logit (a
post-norm's bias joins the layer's `attn_bias`). Only the *direct* path is measured: what a
head does through later layers is patching's question (`patching.py`).

Against TransformerLens 4.3 (same directories): `heads` equals
`cache.logit_attrs(cache.stack_head_results(pos_slice=-1), tokens, pos_slice=-1)` within 1e-6
on a bridge with only the final norm's scale folded into W_U,
`enable_compatibility_mode(center_writing_weights=False, center_unembed=False,
fold_value_biases=False)`. Its defaults (HookedTransformer's processing) differ by
definition: `center_unembed` subtracts each unembedding column's mean over the vocabulary,
which shifts every single-token term (a difference of two tokens' terms is unchanged), and
`fold_value_biases` moves b_V W_O out of each head's term; on raw weights `logit_attrs`
leaves the final norm's scale out.

This module reads traces, and writes the lens of one sequence as text once (`lens_table`)
for `attnlab lens` and the viewer's /api/lens; drawing is `viz/heads.py`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..model.block import Block
from ..model.gpt import check_position, per_row_ids, require_eval, unembed_scaled
from ..model.layers import GemmaRMSNorm, RMSNorm, UnitLayerNorm, branch_scaled, soft_cap
from ..model.names import absent_names
from ..model.packed import weight_of
from ..model.runtime import wide
from ..model.trace import EditSource, Trace
from ..tokenizers import token_text


def lens_labels(model: Any, mid: bool = False) -> list[str]:
    """The logit lens's rows: "emb" (the residual entering layer 0), then per layer "layer
    i" (after it), with `mid` "layer i attn" before that (after its attention, before its
    MLP: the residual `resid_mid`, TransformerLens's accumulated_resid(incl_mid=True))."""
    why = absent_names(model.config).get("resid_mid")
    if mid and why:
        raise ValueError(f"the lens between attention and MLP (mid=True) reads resid_mid, and "
                         f"this model never computes it, as {why}; read the lens after each "
                         "layer (mid=False)")
    each = [(f"layer {i} attn", f"layer {i}") if mid else (f"layer {i}",)
            for i in range(model.config.n_layer)]
    return ["emb"] + [label for labels in each for label in labels]


def _streams(model: Any, ids: Tensor, attention_mask: Tensor | None,
             edits: EditSource | None, mid: bool = False) -> list[Tensor]:
    """The residual stream (B, T, C) at each of `lens_labels(model, mid)`."""
    require_eval(model, "the logit lens")
    lens_labels(model, mid)  # refuses mid where there is no resid_mid
    between = ["resid_mid"] if mid else []
    trace = Trace(names=["emb", *between, "block_out"]).run(model, ids, attention_mask,
                                                            edits=edits)
    return [trace.get("emb")] + [trace.get(name, i) for i in range(model.config.n_layer)
                                 for name in (*between, "block_out")]


@torch.no_grad()
def residual_parts(model: Any, ids: Tensor, attention_mask: Tensor | None = None, *,
                   layer: int | None = None, edits: EditSource | None = None
                   ) -> tuple[list[str], Tensor]:
    """The residual stream entering block `layer` (default None: after the last block, what
    the final norm reads) split into what wrote it, TransformerLens's `decompose_resid`:
    (labels, parts (n, B, T, C)) whose sum over n is that stream. The parts: "tok_emb",
    "pos_emb" (learned positions only), then each earlier block's "i attn" (its attention
    output, the output projection's bias included; the heads concatenated without one) and
    "i mlp" (its MLP's output, where it has one); with sandwich norms (Gemma 2 / 3) each
    branch's output after its post-norm, which is what the stream adds. edits: of the model
    so edited."""
    c = model.config
    if not c.residual:
        raise ValueError("the residual stream is a sum of parts only with residual "
                         "connections (config.residual)")
    require_eval(model, "the residual parts")
    end = c.n_layer if layer is None else layer
    if not 0 <= end <= c.n_layer:
        raise ValueError(f"layer={layer}: the residual stream enters blocks 0 to "
                         f"{c.n_layer - 1} (None: after the last)")
    absent = absent_names(c)
    attn = "context" if "attn_out" in absent else "attn_out"
    mlp = "mlp_out"
    if c.sandwich_norm:  # the post-norms' outputs are what the stream adds
        attn, mlp = "attn_out_normed", "mlp_out_normed"
    names = [n for n in ("tok_emb", "pos_emb") if n not in absent]
    kept = [*names, attn, mlp] if end else names  # the MLP's may be absent: skipped
    trace = Trace(layers=range(end) if end else None, names=kept)
    trace.run(model, ids, attention_mask, edits=edits)
    labels, parts = list(names), [trace.get(n) for n in names]  # (B, T, C) each
    scale = c.residual_multiplier  # each branch as the stream adds it (Granite's)
    for i in range(end):
        out = trace.get(attn, i)  # (B, T, C), or (B, nh, T, hs) heads
        labels.append(f"{i} attn")
        # (B, T, C), or heads (B, nh, T, hs) -> (B, T, nh*hs) side by side
        parts.append(branch_scaled(out if attn != "context" else out.transpose(1, 2).flatten(2),
                                   scale))
        if (i, mlp) in trace:
            labels.append(f"{i} mlp")
            parts.append(branch_scaled(trace.get(mlp, i), scale))
    return labels, torch.stack(parts)  # (n, B, T, C)


def _read(model: Any, x: Tensor) -> Tensor:
    """(B, T, C) residual -> (B, T, V) logits through the final norm, the model's own head
    product (unembed, scaled as its logits are) and its logit cap (final_logit_softcapping,
    as the model caps), so the last layer's are bit-equal to the model's logits."""
    logits = unembed_scaled(model, model.ln_f(x))  # (B, T, V)
    return soft_cap(logits, model.config.final_logit_softcapping, inplace=True)  # (B, T, V)


@torch.no_grad()
def logit_lens(model: Any, ids: Tensor, attention_mask: Tensor | None = None, *,
               edits: EditSource | None = None, mid: bool = False) -> Tensor:
    """ids (B, T) -> (n_layer + 1, B, T, V) logits: row 0 reads the embeddings, row l + 1 the
    residual after layer l (the last row equals the model's logits). mid: also read each
    layer between its attention and its MLP, (2 n_layer + 1, B, T, V) in `lens_labels`'
    order. For the top tokens alone, `lens_top` holds one row's logits at a time. edits: the
    lens of the model so edited (`interp.edits`)."""
    streams = _streams(model, ids, attention_mask, edits, mid)
    return torch.stack([_read(model, x) for x in streams])


@torch.no_grad()
def lens_top(model: Any, ids: Tensor, attention_mask: Tensor | None = None, *, k: int = 5,
             vocab: int | None = None, edits: EditSource | None = None, mid: bool = False,
             progress: Callable[[int, int], None] | None = None) -> tuple[Tensor, Tensor]:
    """`top_tokens(logit_lens(...), k)` one layer at a time: (probabilities, ids), each
    (n_layer + 1, B, T, k), without the (n_layer + 1, B, T, V) logits (12 layers, a 50,257
    vocabulary, 1,000 tokens: 2.6 GB). vocab: read the first `vocab` logits only (a
    tokenizer with fewer ids than the model's vocabulary). The arguments before `*`, edits
    and mid are `logit_lens`'s. progress: called as (rows read, rows) after each row's
    logits (a large vocabulary over a long text: seconds a row on a CPU)."""
    if isinstance(attention_mask, int):  # the order before attention_mask came third
        raise TypeError(f"lens_top(model, ids, {attention_mask}): the third argument is "
                        f"attention_mask; pass k by name (k={attention_mask})")
    if k < 1 or (vocab is not None and vocab < 1):
        raise ValueError(f"lens_top(k={k}, vocab={vocab}): both must be >= 1 (vocab None: "
                         "every logit), else there is no token to return")
    streams = _streams(model, ids, attention_mask, edits, mid)
    tops = []
    for x in streams:
        tops.append(top_tokens(_read(model, x)[..., :vocab], k))
        if progress is not None:
            progress(len(tops), len(streams))
    return torch.stack([p for p, _ in tops]), torch.stack([i for _, i in tops])


@dataclass(frozen=True)
class LensTable:
    """The logit lens of one sequence as a reader sees it: what `attnlab lens` prints and
    writes and the viewer's /api/lens sends."""

    layers: list[str]  # (R,) the rows, `lens_labels`: "emb", then "layer i" (R = L + 1)
    probs: Tensor  # (R, T, k) the top-k probabilities, most likely first
    texts: list[list[list[str]]]  # (R, T, k) their tokens' texts


def lens_table(model: Any, tokenizer: Any, ids: Sequence[int], k: int, *,
               mid: bool = False, progress: Callable[[int, int], None] | None = None
               ) -> LensTable:
    """`lens_top` of one sequence `ids` (T,), its top tokens as text (`token_text`); mid:
    rows between attention and MLP too (`logit_lens`); progress: `lens_top`'s."""
    idx = torch.tensor([list(ids)], device=model.wte.weight.device)  # (1, T)
    probs, top_ids = lens_top(model, idx, k=k, vocab=tokenizer.vocab_size, mid=mid,
                              progress=progress)  # (R, 1, T, k) each
    probs, top_ids = probs[:, 0], top_ids[:, 0]  # (R, T, k)
    texts = [[[token_text(tokenizer, i) for i in cell] for cell in row]
             for row in top_ids.tolist()]
    return LensTable(lens_labels(model, mid), probs, texts)


def top_tokens(lens_logits: Tensor, k: int = 5) -> tuple[Tensor, Tensor]:
    """(..., V) logits -> (probabilities, ids), each (..., k), most likely first."""
    # float32 would round a float64 model's probability near 1 to 1 and could reorder two
    # logits closer than 1e-7
    probs = torch.softmax(lens_logits.to(wide(lens_logits.dtype)), dim=-1)  # (..., V)
    top = torch.topk(probs, min(k, probs.shape[-1]), dim=-1)
    return top.values, top.indices


@dataclass
class Attribution:
    """Direct contributions to one target logit per row; they sum to `logit`."""

    emb: Tensor  # (B,): token + position embeddings
    heads: Tensor  # (B, n_layer, nh): each head's output through its slice of out_proj
    attn_bias: Tensor  # (B, n_layer): the output projection's bias (and a post-norm's bias)
    mlp: Tensor  # (B, n_layer): each MLP's output (zeros without MLPs)
    bias: Tensor  # (B,): the final norm's bias through W_U, plus the head's bias (Phi)
    logit: Tensor  # (B,): the model's logit for the target (before a final_logit_softcapping)

    def total(self) -> Tensor:
        return (self.emb + self.heads.sum((1, 2)) + self.attn_bias.sum(1) + self.mlp.sum(1)
                + self.bias)


def _frozen(norm: nn.Module | None, full: Tensor
            ) -> tuple[Callable[[Tensor], Tensor], Tensor | None]:
    """The norm `norm` with its scale frozen at its input `full` (B, C), so that it is linear
    in each part of that input: (the map of a part (B, C) to its share of the output (B, C),
    the norm's bias (C,) or None). The shares of parts summing to `full`, plus the bias, sum
    to norm(full). A model without the norm (None, or nn.Identity) passes parts through."""
    dtype, centre = full.dtype, True
    if isinstance(norm, nn.LayerNorm | UnitLayerNorm):
        sigma = (full.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()  # (B, 1)
        bias = getattr(norm, "bias", None)  # (C,) or None: UnitLayerNorm has none
        beta = bias.to(dtype) if bias is not None else None
    elif isinstance(norm, RMSNorm | GemmaRMSNorm):  # no mean removed, no bias
        sigma = (full.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()  # (B, 1)
        beta, centre = None, False
    else:  # no norm: the part goes on as it is
        return (lambda part: part.to(dtype)), None
    # (C,): a norm without a learned scale (unit_rmsnorm, LayerNorm's option) scales by 1
    weight = getattr(norm, "weight", None)
    gamma = weight.to(dtype) if weight is not None else torch.ones_like(full[0])
    if isinstance(norm, GemmaRMSNorm):
        gamma = 1.0 + gamma  # (C,): Gemma scales by 1 + weight

    def share(part: Tensor) -> Tensor:
        """(B, C) part of the norm's input -> (B, C) its share of the norm's output."""
        part = part.to(dtype)
        return (part - part.mean(-1, keepdim=True) if centre else part) / sigma * gamma

    return share, beta


def logit_attribution(
    model: Any,
    ids: Tensor,
    target: int | Tensor,
    position: int = -1,
    attention_mask: Tensor | None = None,
) -> Attribution:
    """Split the logit of `target` (one id, or (B,) ids) at `position` into direct terms."""
    c = model.config
    if not c.residual:
        raise ValueError("direct logit attribution needs a residual stream (config.residual)")
    require_eval(model, "the attribution")
    if ids.dim() != 2:
        raise ValueError(f"ids must be a (B, T) integer tensor, got shape {tuple(ids.shape)}; "
                         "add a batch dimension with ids[None]")
    B, T = ids.shape
    ids = ids.to(model.lm_head.weight.device)  # the caller's may be on the host
    attention_mask = None if attention_mask is None else attention_mask.to(ids.device)
    target = per_row_ids(target, B, "target", ids.device)  # (B,)
    if int(target.min()) < 0 or int(target.max()) >= c.vocab_size:
        raise ValueError(f"target {target.tolist()}: token ids are 0 to {c.vocab_size - 1} "
                         f"(vocab_size={c.vocab_size}); pass the id of the token to explain")
    check_position(position, T)
    if attention_mask is not None:
        pads = (attention_mask[:, position] == 0).nonzero().flatten().tolist()
        if pads:  # a right-padded batch's last column, say: no token there to explain
            raise ValueError(f"position {position} is padding in rows {pads} (attention_mask "
                             "0), so those rows have no logit there; pad on the left, which "
                             "puts every row's last token in the last column")
    post = "_normed" if c.sandwich_norm else ""  # with sandwich norms, what the stream adds
    trace = Trace(names=["emb", "context", *(["attn_out"] if post else []), f"mlp_out{post}",
                         "block_out"])
    trace.run(model, ids, attention_mask)  # up to the last block: the head runs below
    dtype = wide(model.lm_head.weight.dtype)  # a float64 model's terms stay float64
    w_u = model.lm_head.weight[target].to(dtype)  # (B, C): the target's unembedding rows
    final = trace.get("block_out", c.n_layer - 1)[:, position].to(dtype)  # (B, C)
    share, beta = _frozen(model.ln_f, final)

    def direct(part: Tensor) -> Tensor:
        """(B, C) part of the final residual -> (B,) its term of the target logit (scaled as
        the model scales its logits: Granite's, Cohere's)."""
        return c.scaled_logits((c.head_input(share(part)) * w_u).sum(-1))  # (B,)

    terms = [_layer_terms(block, trace, layer, position, direct)
             for layer, block in enumerate(model.blocks)]
    # each branch as the stream adds it (Granite: times residual_multiplier)
    heads, attn_bias, mlp = (torch.stack(t, 1) * c.residual_multiplier
                             for t in zip(*terms, strict=True))
    emb = direct(trace.get("emb")[:, position])
    bias = (c.head_input(beta) * w_u).sum(-1) if beta is not None else torch.zeros_like(
        emb)  # (B,)
    if model.lm_head.bias is not None:  # the head's own (Phi)
        bias = bias + model.lm_head.bias[target].to(dtype)  # (B,)
    bias = c.scaled_logits(bias)  # (B,)
    # the model's logit, the head at this position only
    last = c.head_input(model.ln_f(trace.get("block_out", c.n_layer - 1)[:, position]))
    logit = model.lm_head(last).to(dtype).gather(-1, target[:, None])[:, 0]  # (B,)
    return Attribution(emb, heads, attn_bias, mlp, bias, c.scaled_logits(logit))


def _layer_terms(block: Block, trace: Trace, layer: int, position: int,
                 direct: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """Block `layer`'s direct terms at `position`: (heads (B, nh), attn_bias (B,), mlp (B,)).
    With sandwich norms each head's output goes through the attention's post-norm frozen at
    the whole attention output, as the final norm is frozen at the final residual."""
    context = trace.get("context", layer)[:, :, position]  # (B, nh, hs)
    B, nh, hs = context.shape
    out_proj, post = block.attn.out_proj, block.ln_attn_post
    # the post-norm's input: the projected heads, or without a projection the heads
    full = (trace.get("attn_out", layer)[:, position] if (layer, "attn_out") in trace
            else context.flatten(1))  # (B, C)
    # without a post-norm (None) each part goes on as it is
    normed, constant = _frozen(post, full.to(wide(full.dtype)))
    # (C, nh * hs); a matrix kept FP8 or MXFP4 dequantized once for every head
    weight = None if out_proj is None else weight_of(out_proj, context.dtype)
    heads = []
    for h in range(nh):
        piece = context[:, h]  # (B, hs)
        if out_proj is None:  # heads are concatenated into the residual as they are
            part = torch.zeros(B, nh * hs, device=piece.device, dtype=piece.dtype)
            part[:, h * hs:(h + 1) * hs] = piece
        else:
            assert weight is not None
            w = weight[:, h * hs:(h + 1) * hs]  # (C, hs): head h's input columns
            part = piece @ w.t()  # (B, hs) @ (hs, C) -> (B, C)
        heads.append(direct(normed(part)))
    heads_t = torch.stack(heads, 1)  # (B, nh)
    attn_bias = torch.zeros_like(heads_t[:, 0])  # (B,)
    if out_proj is not None and out_proj.bias is not None:
        attn_bias += direct(normed(out_proj.bias.expand(B, -1)))
    if constant is not None:
        attn_bias += direct(constant.expand(B, -1))
    mlp = torch.zeros_like(attn_bias)  # (B,)
    for name in ("mlp_out_normed", "mlp_out"):  # the first the model computes is what it adds
        if (layer, name) in trace:
            mlp = direct(trace.get(name, layer)[:, position])
            break
    return heads_t, attn_bias, mlp
