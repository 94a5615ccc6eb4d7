"""`attnlab.show(..., summary=True)`: the heads overview as one self-contained HTML fragment.

A layer x head grid per summary (`interp.heads.SUMMARY_MEANS`: the means over a text's real
query rows of its entropy, weight on the first token, distance back and largest weight),
each cell coloured on its summary's own scale and labelled with its value, and the table of
the most extreme heads (`interp.heads.extreme_heads`). The summaries come from a trace in
tiles, never from (T, T) weights, so a text as long as the model reads shows as fast as the
forward runs. Plain HTML with inline styles: no script, nothing fetched. `notebook.py`
checks show's arguments and wraps the fragment in its `View`; the numbers are `interp`'s.
"""

from __future__ import annotations

import html
import math
import uuid
from typing import Any

import torch
from torch import Tensor

from ..interp.heads import (
    SHARE_SUMMARIES,
    SUMMARY_MEANS,
    extreme_heads,
    real_queries,
    summary_means,
)
from ..model.attention import padding_of_row
from ..model.gpt import require_eval
from ..model.trace import Trace

#: viridis at five stops (matplotlib's), for the cells: low values dark, high ones light
_VIRIDIS = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))


def _rgb(fraction: float) -> tuple[int, int, int]:
    """The viridis colour of `fraction` in [0, 1] (linear between the stops)."""
    x = min(max(fraction, 0.0), 1.0) * (len(_VIRIDIS) - 1)
    i = min(int(x), len(_VIRIDIS) - 2)
    a, b = _VIRIDIS[i], _VIRIDIS[i + 1]
    r, g, bl = (round(u + (v - u) * (x - i)) for u, v in zip(a, b, strict=True))
    return r, g, bl


def summary_page(source: Any, ids: list[int] | None, row: int,
                 attention_mask: Tensor | None, title: str | None) -> tuple[str, str]:
    """(HTML fragment, title) of the heads overview of batch row `row` of a `Trace` holding
    the summaries of its layers, or of a model run on `ids` (with row `row`'s padding of
    `attention_mask`, (B, S) or the row's own (S,))."""
    if isinstance(source, torch.nn.Module) and hasattr(source, "config"):
        model: Any = source
        require_eval(model, "the heads overview")
        assert ids, "show() checks a model's ids"
        device = next(model.parameters()).device
        mask = None if attention_mask is None else padding_of_row(
            attention_mask, row, len(ids))[None].to(device)  # (1, T)
        source = Trace(names=list(SUMMARY_MEANS)).run(
            model, torch.tensor([ids], device=device), mask)  # (1, T)
        row, attention_mask = 0, mask
    elif not isinstance(source, Trace):
        raise TypeError(f"show() takes a Trace or a GPT model, got {type(source).__name__}")
    trace = source
    held = [(lay, name) for lay, name in trace if name in SUMMARY_MEANS and lay is not None]
    layers = sorted({lay for lay, _ in held})
    means = summary_means(trace, layers, attention_mask, row)
    if not means:
        why = "no summary in every layer it traced" if held else "no summaries"
        raise ValueError(f"the trace holds {why}; trace with names including "
                         f"{list(SUMMARY_MEANS)} (or no names filter)")
    B, _, T = trace.get(next(iter(means)), layers[0]).shape  # (B, heads, T)
    mask = attention_mask if attention_mask is not None else trace.attention_mask
    rows = int(real_queries(mask, B, T, row).sum())
    heads = list(trace.heads) if trace.heads is not None else list(
        range(next(iter(means.values())).shape[1]))
    title = title or f"attnlab · heads overview of {T} token{'s' * (T != 1)}"
    return _fragment(means, layers, heads, rows, title, padded=rows < T), title


def _grid(name: str, values: Tensor, layers: list[int], heads: list[int]) -> str:
    """One summary's layer x head table, each cell coloured on the summary's own scale."""
    values = values.cpu()  # one copy from a GPU, not a read per cell
    finite = [v for v in values.flatten().tolist() if math.isfinite(v)]
    top = 1.0 if name in SHARE_SUMMARIES else max(finite, default=1.0) or 1.0
    cells = []
    for i, layer in enumerate(layers):
        tds = []
        for j, head in enumerate(heads):
            v = float(values[i, j])
            r, g, b = _rgb(v / top) if math.isfinite(v) else (200, 200, 200)
            ink = "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#fff"
            tds.append(f'<td title="layer {layer}, head {head}: {v:.4g}" style="background:'
                       f'rgb({r},{g},{b});color:{ink};padding:2px 5px;text-align:right">'
                       f"{v:.2f}</td>")
        cells.append(f'<tr><th style="padding:2px 5px">{layer}</th>{"".join(tds)}</tr>')
    head_row = "".join(f'<th style="padding:2px 5px">{h}</th>' for h in heads)
    return (f'<figure style="margin:0 18px 12px 0"><figcaption style="font-weight:600">'
            f"{html.escape(SUMMARY_MEANS[name])}</figcaption>"
            f'<table style="border-collapse:collapse;font-size:12px">'
            f'<tr><th style="padding:2px 5px">layer \\ head</th>{head_row}</tr>'
            f'{"".join(cells)}</table></figure>')


def _fragment(means: dict[str, Tensor], layers: list[int], heads: list[int], rows: int,
              title: str, padded: bool) -> str:
    extremes = "".join(
        f'<tr><td style="padding:2px 8px">{html.escape(label)}</td>'
        + "".join(f'<td style="padding:2px 8px">{layers[la]}.{heads[h]} '
                  f"<b>{v:.3f}</b></td>" for la, h, v in top) + "</tr>"
        for label, top in extreme_heads(means))
    grids = "".join(_grid(name, values, layers, heads) for name, values in means.items())
    return (f'<div id="attnlab-summary-{uuid.uuid4().hex[:8]}" style="font-family:sans-serif">'
            f'<h3 style="margin:0 0 6px">{html.escape(title)}</h3>'
            f'<p style="margin:0 0 8px;font-size:12px">means over the {rows} query '
            f"row{'s' * (rows != 1)}{' (pads left out)' if padded else ''}, computed in tiles "
            "without the T × T weights; hover a cell for its value</p>"
            f'<div style="display:flex;flex-wrap:wrap">{grids}</div>'
            f'<table style="border-collapse:collapse;font-size:12px"><tr><th '
            'style="text-align:left;padding:2px 8px">most extreme heads (layer.head mean)'
            f"</th></tr>{extremes}</table></div>")
