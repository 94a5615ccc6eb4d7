"""`attnlab.show(..., summary=True)`: the heads overview of one text as a self-contained view.

The numbers are the summaries' means over a text's real query rows (`interp.heads`:
entropy, weight on the first token, distance back, largest weight), from a trace holding
them or a model run here on the text; a trace of summaries is computed in tiles, never from
(T, T) weights, so a text as long as the model reads shows as fast as the forward runs.
They go out as `payloads.overview_payload` writes them, the part of /api/heads's answer the
page's heads panel draws, and the page's own `web/overview.js` draws them (`fragment.py`
inlines it): one renderer for the page and a notebook. `notebook.py` checks show's other
arguments first; this module checks what only the overview reads (the source's summaries,
the row and its mask).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..interp.heads import SUMMARY_MEANS, real_queries, summary_means
from ..model.gpt import require_eval
from ..model.masks import padding_of_row
from ..model.trace import Trace
from .fragment import OVERVIEW, View, fragment
from .payloads import overview_payload


def _summary_trace(model: Any, ids: list[int] | None, row: int,
                   attention_mask: Tensor | None) -> tuple[Trace, Tensor | None]:
    """(a trace of the summaries of `model` run once on `ids`, the (1, T) mask it ran with):
    row `row`'s padding of `attention_mask` ((B, S), or the row's own (S,))."""
    require_eval(model, "the heads overview")
    assert ids, "show() checks a model's ids"
    device = next(model.parameters()).device
    mask = None if attention_mask is None else padding_of_row(
        attention_mask, row, len(ids))[None].to(device)  # (1, T)
    trace = Trace(names=list(SUMMARY_MEANS)).run(
        model, torch.tensor([ids], device=device), mask)  # (1, T)
    return trace, mask


def summary_view(source: Any, ids: list[int] | None, row: int,
                 attention_mask: Tensor | None, title: str | None) -> View:
    """The heads overview of batch row `row` of a `Trace` holding the summaries of its
    layers, or of a model run on `ids` (with row `row`'s padding of `attention_mask`, (B, S)
    or the row's own (S,)); `title` heads it (default: "attnlab · heads overview of T
    tokens")."""
    if isinstance(source, torch.nn.Module) and hasattr(source, "config"):
        trace, attention_mask = _summary_trace(source, ids, row, attention_mask)
        row = 0
    elif isinstance(source, Trace):
        trace = source
    else:
        raise TypeError(f"show() takes a Trace or a GPT model, got {type(source).__name__}")
    held = [(lay, name) for lay, name in trace if name in SUMMARY_MEANS and lay is not None]
    layers = sorted({lay for lay, _ in held})
    means = summary_means(trace, layers, attention_mask, row)
    if not means:
        why = "no summary in every layer it traced" if held else "no summaries"
        raise ValueError(f"the trace holds {why}; trace with names including "
                         f"{list(SUMMARY_MEANS)} (or no names filter)")
    B, nh, T = trace.get(next(iter(means)), layers[0]).shape  # (B, heads, T)
    mask = attention_mask if attention_mask is not None else trace.attention_mask
    rows = int(real_queries(mask, B, T, row).sum())
    heads = list(trace.heads) if trace.heads is not None else list(range(nh))
    data = overview_payload(means, layers, heads, rows=rows, padded=rows < T)
    title = title or f"attnlab · heads overview of {T} token{'s' * (T != 1)}"
    return View(fragment(OVERVIEW, data, title), title)
