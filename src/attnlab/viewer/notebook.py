"""`attnlab.show()`: attention as one self-contained HTML view, inline in a notebook or saved.

`show(trace)` or `show(model, tokenizer, text)` returns a `View`; a notebook displays it
through `_repr_html_`, and `View.save("x.html")` writes the same view as a page. The HTML
carries the viewer's own script and styles (`web/draw.js`, `web/chips.js`,
`web/view_data.js` and `web/view.js`, and `web/view.css`), inlined by `fragment.py`: no
CDN, no server, no require.js, no network request.

Views (tabs): head view (one layer; one head or all; hover or click a token to see what it
attends to), model view (every layer x head, click to open), steps (one head's raw scores
-> masked -> softmax), text (tokens coloured by a query's attention), and, for a mixture of
experts, routing (a token x expert grid per layer and each expert's share of the tokens,
`web/routing.js`, as the served page's routing panel draws it). Masked cells are
drawn and labelled as masked, never as weight 0. `show(..., summary=True)` gives the heads
overview instead (`summary_view.py`, drawn by the page's `web/overview.js`): per-head
summaries, no weights, any text length.

Size: weights go as one byte per cell (the weight as a fraction of its row's largest, so
the error is at most 1/508 of that row's largest weight), lower triangle only, zlib
compressed and base64'd; the model view gets every head max-pooled to at most `THUMB`
cells a side. Layers are embedded at full resolution while they fit `max_cells` (the
layer on show first); the others appear in the model view only. This module checks show's
arguments, encodes and assembles; drawing is the JavaScript's, capture is
`model/trace.py`'s, the fragment `fragment.py`'s.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..model.gpt import require_eval
from ..model.masks import causal_mask, padding_of_row
from ..model.trace import Trace
from ..tokenizers import check_fits
from .fragment import ATTENTION, View, fragment
from .payloads import routing_payload
from .summary_view import summary_view

MAX_CELLS = 1 << 23  # weights embedded at full resolution: about 8 MB before compression
THUMB = 96  # model view: each head max-pooled to at most this many cells a side
STEPS_CELLS = 256 * 256  # the steps view is included up to this many cells (T x S)
VIEWS = ("head", "model", "steps", "text", "routing")
PAD_LABEL = "<pad>"  # the label of a padding position (its key column and query row masked)


# ----------------------------------------------------------------------------- capture


class _ViewTrace(Trace):
    """A trace that keeps only what a view needs: every layer's weights and mask, the raw
    scores of the steps layer (a full trace of GPT-2 small at 1024 tokens is GBs), and a
    mixture of experts' routing (`routing`: the model has n_experts)."""

    def __init__(self, steps_layer: int | None, routing: bool = False) -> None:
        super().__init__(names=["attn_weights"] + (["attn_scores"] if steps_layer is not None
                                                   else []) + (["expert_weights"] if routing
                                                               else []))
        self.steps_layer = steps_layer
        self.masks: dict[int | None, Tensor] = {}

    def wants(self, name: str) -> bool:
        # masked_scores: attention computes them only for a sink that wants them, and the
        # mask (sliding windows, padding) comes from them; only the mask is kept
        return name == "masked_scores" or super().wants(name)

    def record(self, name: str, value: Tensor, layer: int | None = None) -> Tensor:
        if name == "masked_scores":
            self.masks[layer] = ~value[:, 0].isneginf()  # (B, T, S): one mask for all heads
        elif name in ("attn_weights", "expert_weights") or (
                name == "attn_scores" and layer == self.steps_layer):
            super().record(name, value, layer)
        return value  # the seam's protocol: the model continues with the value

    def may_attend(self, layer: int | None, row: int = 0, *,
                   attention_mask: Tensor | None = None) -> Tensor:
        if layer in self.masks:
            return self.masks[layer][row].cpu()  # (T, S)
        return super().may_attend(layer, row, attention_mask=attention_mask)


def _labels(tokenizer: Any, ids: Sequence[int] | None, tokens: Sequence[str] | None,
            S: int, padding: Tensor | None) -> list[str]:
    """One label per key position: `tokens` as given, else the ids' pieces (or ids, or #j)
    with PAD_LABEL where `padding` (S,) is 0 (the pad id's own text, often <|endoftext|>,
    read as a token the row holds)."""
    if tokens is not None:
        labels = [str(t) for t in tokens]
    elif ids is not None and tokenizer is not None:
        pieces = getattr(tokenizer, "pieces", None)
        labels = pieces(list(ids)) if pieces else [tokenizer.decode([i]) for i in ids]
    elif ids is not None:
        labels = [str(int(i)) for i in ids]  # no tokenizer: tokens are labelled by id
    else:
        labels = [f"#{j}" for j in range(S)]
    if len(labels) != S:
        raise ValueError(f"{len(labels)} token labels for {S} key positions; pass ids or tokens "
                         "for every position the trace attends over (padding included)")
    if tokens is None and padding is not None:
        labels = [label if real else PAD_LABEL
                  for label, real in zip(labels, padding.tolist(), strict=True)]
    return labels


def _trace_model(model: Any, ids: list[int], steps_layer: int | None,
                 padding: Tensor | None) -> _ViewTrace:
    """The view's trace of `ids` (T,), with `padding` (T,) 1/0 as the model's attention mask;
    the routing too where the model is a mixture of experts."""
    device = next(model.parameters()).device
    mask = None if padding is None else padding.to(device)[None]  # (1, T)
    routing = getattr(model.config, "n_experts", None) is not None
    return _ViewTrace(steps_layer, routing).run(model, torch.tensor([ids], device=device),
                                                mask)  # ids as (1, T)


# ----------------------------------------------------------------------------- encoding


def _b64z(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 6)).decode("ascii")


def _codes(weights: Tensor, may: Tensor, tri: bool) -> tuple[np.ndarray, np.ndarray]:
    """weights (nh, T, S) -> uint8 codes of each row's largest (255 masked) and row maxima."""
    w = weights.float().masked_fill(~may, 0.0)  # (nh, T, S)
    top = w.amax(dim=-1)  # (nh, T)
    codes = torch.round(w / top.clamp_min(1e-30)[..., None] * 254).clamp(0, 254).to(torch.uint8)
    codes = codes.masked_fill(~may, 255)  # (nh, T, S)
    if tri:
        codes = codes[:, causal_mask(*may.shape)]  # (nh, cells): row i keeps keys 0..off+i
    return codes.numpy(), top.numpy().astype(np.float32)


def _thumbs(weights: Tensor, may: Tensor, size: tuple[int, int]) -> np.ndarray:
    """weights (nh, T, S) -> (nh, t, s) uint8: block maxima * 254, 255 where all masked."""
    w = weights.float().masked_fill(~may, -1.0)  # (nh, T, S)
    pooled = F.adaptive_max_pool2d(w, size)  # (nh, t, s)
    codes = torch.round(pooled.clamp_min(0) * 254).to(torch.uint8)
    return codes.masked_fill(pooled < 0, 255).numpy()


NO_WEIGHTS = ("the trace holds no attn_weights; trace with names including 'attn_weights' "
              "(or no names filter)")


def _payload(trace: Trace, labels: list[str], *, row: int, layer: int | None,
             head: int | str | None,
             view: str, query: int | None, layers: Sequence[int] | None, max_cells: int,
             attention_mask: Tensor | None, steps: tuple[int | None, int] | None,
             scale: float | None, info: str, config: Any = None) -> dict[str, Any]:
    traced = sorted({lay for lay, n in trace if n == "attn_weights"},
                    key=lambda lay: -1 if lay is None else lay)
    if not traced:
        raise ValueError(NO_WEIGHTS)
    first = trace.get("attn_weights", traced[0])
    if not 0 <= row < first.shape[0]:
        raise ValueError(f"row={row} out of range for a batch of {first.shape[0]}")
    nh, T, S = first.shape[1:]
    head_labels = list(trace.heads) if trace.heads is not None else list(range(nh))
    if layer is None:
        layer = traced[0]
    if head is None:
        head = head_labels[0]
    if layer not in traced:
        raise ValueError(f"layer {layer} is not in the trace; traced layers: {traced}")
    if head != "all" and head not in head_labels:
        raise ValueError(f"head={head!r} is not traced; choose one of {head_labels} or 'all'")
    masks = [trace.may_attend(lay, row, attention_mask=attention_mask) for lay in traced]
    tri = all(not bool((m & ~causal_mask(T, S)).any()) for m in masks)
    per_layer = nh * (T * (2 * (S - T) + T + 1) // 2 if tri else T * S)
    if layers is None:  # the layer on show, then the rest in order, while they fit
        full = [layer]
        for lay in traced:
            if lay != layer and (len(full) + 1) * per_layer <= max_cells:
                full.append(lay)
    else:
        missing = [lay for lay in layers if lay not in traced]
        if missing:
            raise ValueError(f"layers {missing} are not in the trace; traced layers: {traced}")
        full = list(dict.fromkeys([layer, *layers]))
    full.sort(key=lambda lay: -1 if lay is None else lay)
    codes, tops = [], []
    for lay in full:
        c, t = _codes(trace.get("attn_weights", lay)[row].cpu(), masks[traced.index(lay)], tri)
        codes.append(c)
        tops.append(t)
    size = (min(T, THUMB), min(S, THUMB))
    thumbs = np.stack([_thumbs(trace.get("attn_weights", lay)[row].cpu(),
                               masks[traced.index(lay)], size) for lay in traced])
    unique: list[bytes] = []
    layer_mask = []
    for m in masks:
        bits = np.packbits(m.numpy().reshape(-1)).tobytes()  # bit i*S + j, first bit highest
        if bits not in unique:
            unique.append(bits)
        layer_mask.append(unique.index(bits))
    payload: dict[str, Any] = {
        "tokens": labels, "T": T, "S": S, "layers": traced, "heads": head_labels,
        "full": [traced.index(lay) for lay in full], "tri": tri,
        "weights": _b64z(np.concatenate([c.reshape(-1) for c in codes]).tobytes()),
        "rowmax": _b64z(np.concatenate([t.reshape(-1) for t in tops]).tobytes()),
        "masks": [_b64z(b) for b in unique], "layerMask": layer_mask,
        "thumb": {"T": size[0], "S": size[1], "codes": _b64z(thumbs.tobytes())},
        "view": view, "layer": traced.index(layer),
        "head": "all" if head == "all" else head_labels.index(int(head)),
        "query": query, "rowscale": S > 64, "info": info,
        "precision": "weights to 1/254 of each row's largest",
        "steps": _steps(trace, row, traced, head_labels, steps, scale),
    }
    if payload["steps"] is not None:  # a model's soft cap (Gemma 2) and learned sinks
        payload["steps"].update(  # (gpt-oss), named in the steps' title
            softcap=getattr(config, "attn_logit_softcapping", None),
            sinks=bool(getattr(config, "attn_sinks", False)))
    return payload


def _routing(trace: Trace, labels: list[str], row: int, padding: Tensor | None,
             max_cells: int, view: str) -> dict[str, Any]:
    """{"routing": the routing tab's data} (`payloads.routing_payload`) of batch row `row`:
    its expert_weights in each layer the trace holds them, in order while they fit
    `max_cells` (at least one), pads (`padding` (S,) 0) left out of the shares; {} without
    any (a dense model: its payload carries nothing), which view="routing" refuses."""
    layers = sorted(lay for lay, name in trace if name == "expert_weights" and lay is not None)
    if not layers and view == "routing":
        raise ValueError("view='routing' draws a mixture of experts' routing, and there is "
                         "none here: the model has one dense MLP a block (n_experts unset), or "
                         "the trace kept no expert_weights (trace them, or no names filter)")
    if not layers:
        return {}
    T, E = trace.get("expert_weights", layers[0]).shape[1:]
    layers = layers[: max(1, max_cells // max(1, T * E))]
    off = len(labels) - T  # the routed tokens are the pass's queries: the last T keys
    return {"routing": routing_payload(
        [trace.get("expert_weights", lay)[row] for lay in layers],  # (T, E) each
        layers, labels[off:], first=off, real=None if padding is None else padding[off:].bool())}


def _query_in(query: int | None, S: int) -> int | None:
    """The token position `query` picks among S (negative counts from the end), or None."""
    if query is not None and not -S <= query < S:
        raise ValueError(f"query={query} out of range for {S} tokens")
    return None if query is None else query % S


def _steps(trace: Trace, row: int, traced: list[Any], head_labels: list[int],
           steps: tuple[int | None, int] | None, scale: float | None) -> Any:
    if steps is None:
        return None
    lay, h = steps
    if (lay, "attn_scores") not in trace or lay not in traced or h not in head_labels:
        raise ValueError(f"steps={steps}: the trace needs attn_scores and attn_weights of "
                         f"layer {lay} and head {h} (traced heads: {head_labels})")
    k = head_labels.index(h)
    scores = trace.get("attn_scores", lay)[row, k].float().cpu().numpy()  # (T, S)
    weights = trace.get("attn_weights", lay)[row, k].float().cpu().numpy()  # (T, S)
    return {"layer": lay, "head": h, "scale": scale,
            "scores": _b64z(scores.astype(np.float32).tobytes()),
            "weights": _b64z(weights.astype(np.float32).tobytes())}


# ----------------------------------------------------------------------------- show


def _ids_of_row(ids: Sequence[int] | Tensor, row: int) -> list[int]:
    """ids as a list: one sequence as given, or row `row` of a (B, T) batch."""
    if isinstance(ids, Tensor) and ids.dim() == 2:
        if not -ids.shape[0] <= row < ids.shape[0]:
            raise ValueError(f"row={row} out of range for ids of {ids.shape[0]} rows")
        ids = ids[row]
    if isinstance(ids, Tensor) and ids.dim() != 1:
        raise ValueError(f"ids of shape {tuple(ids.shape)}: pass one sequence (T,) or the "
                         "(B, T) batch the model ran on")
    return [int(i) for i in ids]


def _ids_to_show(source: Any, tokenizer: Any, text: str | None,
                 ids: Sequence[int] | Tensor | None, row: int, view: str) -> list[int] | None:
    """The token ids the view labels (and a model runs on: then at least one), from `text` or
    `ids` (one sequence, or row `row` of a batch), after the checks of show's arguments."""
    if view not in VIEWS:
        raise ValueError(f"view={view!r}; choose one of {', '.join(VIEWS)}")
    if isinstance(tokenizer, str):  # show(model, "text"): the tokenizer slot, not the text's
        raise ValueError(
            f"show's second argument is the tokenizer, and it got the str {tokenizer[:40]!r}; "
            "pass the text third, show(model, tokenizer, text), or ids=[...] without one")
    if text is not None and not isinstance(text, str):
        raise ValueError(f"text must be one str (got {type(text).__name__}): a view shows "
                         "one sequence; pass a batch as ids=(B, T) with row=")
    vocab = getattr(getattr(source, "config", None), "vocab_size", None)  # a model's
    if tokenizer is not None and vocab is not None:
        check_fits(tokenizer, vocab)
    if text is not None:
        if tokenizer is None:
            raise ValueError("text needs a tokenizer to turn it into ids; pass tokenizer=")
        if ids is not None:
            raise ValueError("pass text or ids, not both")
        ids = tokenizer.encode(text)
    ids = None if ids is None else _ids_of_row(ids, row)
    if isinstance(source, torch.nn.Module) and not ids:  # a model runs on them
        raise ValueError("show(model, ...) was given empty text; pass some text" if (
            text is not None) else "show(model, ...) needs text (with a tokenizer) or ids")
    return ids


def _run_model(model: Any, ids: list[int] | None, layer: int | None,
               attention_mask: Tensor | None, row: int,
               scale: float | None) -> tuple[_ViewTrace, float, str]:
    """(trace, softmax scale, info line) of `model` run once on `ids`, with the padding of
    `attention_mask`'s row `row`; the steps layer's raw scores kept while they are small."""
    assert ids, "show() checks a model's ids"
    require_eval(model, "the view")
    c: Any = model.config
    if len(ids) > c.block_size:
        raise ValueError(f"{len(ids)} tokens, the model reads at most block_size="
                         f"{c.block_size}; shorten the text")
    steps_layer = layer if layer is not None else 0
    small = len(ids) ** 2 <= STEPS_CELLS
    # the model runs with the row's padding: left without it, pads were read as tokens
    # and drawn as keys with weights
    padding = None if attention_mask is None else padding_of_row(attention_mask, row, len(ids))
    trace = _trace_model(model, ids, steps_layer if small else None, padding)
    if scale is None:
        scale = c.score_scale
    return trace, scale, f"{c.n_layer} layers × {c.n_head} heads"


def _default_steps(trace: Trace, traced: list[Any], layer: int | None, head: int | str | None,
                   S: int) -> tuple[int | None, int] | None:
    """The head on show for the steps view, where the trace holds its raw scores and they
    fit STEPS_CELLS; else None."""
    lay = layer if layer is not None else min(traced, key=lambda x: -1 if x is None else x)
    h = head if head not in (None, "all") else (trace.heads or [0])[0]
    T = trace.get("attn_weights", lay).shape[-2] if (lay, "attn_weights") in trace else 0
    if (lay, "attn_scores") in trace and T * S <= STEPS_CELLS:
        return (lay, int(h))
    return None


def _weight_layers(trace: Trace) -> list[int | None]:
    """The layers whose every query's weights the trace holds; raise where it has none."""
    traced = [lay for lay, n in trace if n == "attn_weights"]
    if not traced:
        raise ValueError(NO_WEIGHTS)
    if trace.rows is not None:  # its weights are some query rows: no (T, S) to draw
        raise ValueError(f"show() draws every query's weights; this trace kept query rows "
                         f"{list(trace.rows)} alone (Trace(rows=...)): trace without rows, "
                         "or pass the model")
    return traced


def show(
    source: Any,
    tokenizer: Any = None,
    text: str | None = None,
    *,
    ids: Sequence[int] | Tensor | None = None,
    tokens: Sequence[str] | None = None,
    row: int = 0,
    layer: int | None = None,
    head: int | str | None = None,
    view: str = "head",
    query: int | None = None,
    layers: Sequence[int] | None = None,
    steps: tuple[int | None, int] | None = None,
    attention_mask: Tensor | None = None,
    scale: float | None = None,
    max_cells: int = MAX_CELLS,
    title: str | None = None,
    summary: bool = False,
) -> View:
    """An attention view of a `Trace`, or of a model run on `text` (or `ids`).

    source: a `Trace` holding attn_weights (and attn_scores for the steps view), or a
        `GPT`, which is run once on the text. A trace's masks are its masked_scores' or,
        without them, the causal mask within each layer's sliding window and the padding
        (the trace notes both from the pass it saw).
    tokenizer, text, ids, tokens: label the tokens: `tokens` as given, or the tokenizer's
        pieces of `ids` (or of `tokenizer.encode(text)`); ids alone label tokens by id. ids
        may be the (B, T) batch the model ran on: row `row`'s label the tokens. A
        trace holds no ids, so `show(trace)` with none of these labels them #0, #1, ...
    row: which sequence of the batch. layer, head: what the head view opens on (head may be
        "all"; default: the first traced layer and head). view: "head", "model", "steps",
        "text" or, for a mixture of experts, "routing" (each token's experts and their weights
        per layer, from the trace's expert_weights). query: token position picked first
        (negative counts from the end). layers: layers embedded at full resolution (default: as
        many as fit `max_cells` cells, `layer` first; the routing tab's layers too,
        T x n_experts cells each). steps: (layer, head) for the steps view (default: the head
        on show when the trace has its attn_scores and T x S <= STEPS_CELLS). attention_mask:
        (B, S) 1/0 padding, for a model given a padded batch's ids (it runs the row with it),
        or for a trace (default: the padding its model ran with); pad positions are masked and
        labelled PAD_LABEL. scale: the softmax scale, written in the steps view. title: a
        heading over the view (and the saved page's title; default: none inline, "attnlab ·
        attention of T tokens" saved).
    summary: the heads overview instead, as the page draws it (`summary_view.py`): a layer
        x head grid per summary (entropy, first-token weight, distance back, largest weight:
        means over the row's real queries) and the most extreme heads, from a trace of the
        summaries or a model run on the text without any (T, T) weights.
    """
    ids = _ids_to_show(source, tokenizer, text, ids, row, view)
    if summary:
        return summary_view(source, ids, row, attention_mask, title)
    info = ""
    if isinstance(source, Trace):
        trace = source
    elif isinstance(source, torch.nn.Module) and hasattr(source, "config"):
        trace, scale, info = _run_model(source, ids, layer, attention_mask, row, scale)
        row, attention_mask = 0, None  # the one sequence run; its masks are in the trace
    else:
        raise TypeError(f"show() takes a Trace or a GPT model, got {type(source).__name__}")
    traced = _weight_layers(trace)  # before the labels, which count the weights' keys
    S = trace.get("attn_weights", traced[0]).shape[-1]
    if attention_mask is None:  # the padding the model ran with, noted by the trace
        attention_mask = trace.attention_mask
    padding = None if attention_mask is None else padding_of_row(attention_mask, row, S,
                                                                  of="keys")  # (S,)
    labels = _labels(tokenizer, ids, tokens, S, padding)
    query = _query_in(query, S)
    if steps is None:
        steps = _default_steps(trace, traced, layer, head, S)
    tokens_of = f"{S} token{'s' * (S != 1)}"
    info = ", ".join(x for x in (info, tokens_of) if x)
    payload = _payload(trace, labels, row=row, layer=layer, head=head, view=view, query=query,
                       layers=layers, max_cells=max_cells, attention_mask=attention_mask,
                       steps=steps, scale=scale, info=info, config=getattr(source, "config", None))
    if view == "steps" and payload["steps"] is None:
        raise ValueError("view='steps' needs the raw scores: trace attn_scores (at most "
                         f"{STEPS_CELLS} cells) or pass steps=(layer, head)")
    payload |= _routing(trace, labels, row, padding, max_cells, view)  # a mixture of experts
    return View(fragment(ATTENTION, payload, title), title or f"attnlab · attention of {tokens_of}")
