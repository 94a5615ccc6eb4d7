"""Figures of attention: heatmaps with token labels, layer x head grids, one query's row.

Every function takes plain tensors or arrays (what a `Trace` holds, already indexed to one
sequence and head) and returns a matplotlib `Figure`; `save_figure` writes it as PNG and/or
SVG and closes it. This module draws; `model/trace.py` captures and the CLI decides what to
draw. The shared pieces (`heatmap`, tick labels, colorbars) are `core.py`'s, the cells shown
and the weights' colour scale (`weight_vmax`) `visible.py`'s, `save_figure` `save.py`'s.

Cells a query may not attend (the causal future, keys outside a sliding window, pad keys)
are hatched, never drawn as weight 0: the figures of weights and masked scores take
`may_attend=`, the mask `Trace.may_attend` gives, and default to the causal future.

Readable at any length: figure sizes are capped and tick labels thinned to the panel size
(see `core.py`). The per-head figures (`plot_attention`, `plot_attention_steps`,
`plot_qkv`, `plot_row`) take `into=`, a figure they returned before for the same tokens:
it is refilled with the new head's values and titles instead of built anew, which is
how `attnlab inspect` draws every head at the cost of one figure's ticks and axes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .core import (
    ANNOTATE_MAX,
    MAX_TICKS,
    ArrayLike,
    as_numpy,
    colorbar,
    hatch_columns,
    heatmap,
    pyplot,
    set_ticks,
    token_label,
)
from .visible import may_attend_mask, weight_vmax

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_INCHES = 14.0  # no side of a figure is longer than this
DPI = 130


def _layout(
    rows: int, cols: int, panels: int = 1, extra: float = 1.6
) -> tuple[tuple[float, float], int]:
    """(figure size, tick labels per axis) for `panels` heatmaps side by side.

    ~0.55 in per cell while values are written in the cells; past that the panels shrink
    to fit MAX_INCHES and carry about 6 tick labels per inch (6-7 pt text does not touch).
    """
    cell = 0.55 if max(rows, cols) <= ANNOTATE_MAX else 9.0 / max(rows, cols)
    cell = min(cell, (MAX_INCHES - 0.5 - panels * extra) / (panels * cols))
    w = panels * (cols * cell + extra) + 0.5
    h = rows * cell + extra
    ticks = max(4, min(MAX_TICKS, int(min(rows, cols) * cell * 6)))
    return (max(w, 3.5), max(h, 2.8)), ticks


# ------------------------------------------------------------------------- attention


def plot_attention(
    weights: ArrayLike,
    tokens: Sequence[str],
    *,
    title: str = "attention weights",
    kind: str = "weights",
    keys: Sequence[str] | None = None,
    may_attend: ArrayLike | None = None,
    into: Figure | None = None,
) -> Figure:
    """One (T, S) matrix: kind "weights" (0..1), "scores" (raw) or "masked" (-inf cells).

    Rows are queries (tokens), columns keys (`keys`, default the same tokens). Cells a
    query may not attend are hatched for weights and masked scores: those where
    `may_attend` (T, S) bool is False (`Trace.may_attend`: a sliding window and padding
    too), default the causal future; raw scores exist for every cell and are all drawn.
    into: a figure this function returned for a (T, S) matrix, refilled and returned
    instead of a new one.
    """
    values = as_numpy(weights)
    if values.ndim != 2:
        raise ValueError(f"plot_attention draws one (T, S) matrix, got shape {values.shape}; "
                         "pick one row and head, e.g. weights[0, head]")
    T, S = values.shape
    keys = tokens if keys is None else keys
    if (len(tokens), len(keys)) != (T, S):
        raise ValueError(f"{len(tokens)} query and {len(keys)} key labels for a ({T}, {S}) "
                         "matrix; give one label per row and column")
    size, ticks = _layout(T, S)
    if into is None:
        fig, ax = pyplot().subplots(figsize=size, dpi=DPI, layout="tight")
    else:
        fig, (ax,) = into, _panels(into, 1, "plot_attention")
    _draw_kind(fig, ax, values, tokens, keys, kind, ticks, may_attend)
    ax.set_title(title, fontsize=10)
    return fig


def _panels(into: Figure, n: int, maker: str) -> list[Axes]:
    """The `n` heatmap axes of a figure to refill (its colorbars' axes hold no image)."""
    panels = [ax for ax in into.axes if ax.images]
    if len(panels) != n:
        raise ValueError(f"into= holds {len(panels)} heatmaps where {maker} draws {n}; pass "
                         f"a figure {maker} returned, or into=None for a new one")
    return panels


def _draw_kind(fig: Figure, ax: Axes, values: np.ndarray, rows: Sequence[str],
               cols: Sequence[str], kind: str, ticks: int = MAX_TICKS,
               may_attend: ArrayLike | None = None) -> Any:
    if kind == "weights":
        may = may_attend_mask(values.shape, may_attend)  # (T, S)
        image = heatmap(ax, values, row_labels=rows, col_labels=cols, masked=~may,
                        vmin=0.0, vmax=weight_vmax(values, may), max_ticks=ticks)
    elif kind in ("scores", "masked"):
        finite = values[np.isfinite(values)]
        lim = float(np.abs(finite).max()) if finite.size else 0.0
        lim = lim or 1.0  # all zeros (equal scores: a running mean): any symmetric scale
        # masked scores are -inf where masked; a may_attend given says so for other scores
        masked = None if kind == "scores" or may_attend is None else ~may_attend_mask(
            values.shape, may_attend)  # (T, S)
        image = heatmap(ax, values, row_labels=rows, col_labels=cols, cmap="RdBu_r",
                        vmin=-lim, vmax=lim, masked=masked,
                        masked_text="-inf" if kind == "masked" else "", max_ticks=ticks)
    else:
        raise ValueError(f"unknown kind {kind!r}; choose weights, scores or masked")
    ax.set_xlabel("key (attended to)", fontsize=8)
    ax.set_ylabel("query", fontsize=8)
    colorbar(fig, image, ax, fraction=0.035, pad=0.03)
    return image


def plot_attention_steps(
    scores: ArrayLike,
    masked_scores: ArrayLike,
    weights: ArrayLike,
    tokens: Sequence[str],
    *,
    scale: float | None = None,
    title: str = "",
    names: Sequence[str] | None = None,
    may_attend: ArrayLike | None = None,
    into: Figure | None = None,
    softcap: float | None = None,
    sinks: bool = False,
) -> Figure:
    """Attention's three steps side by side: raw scores q @ k^T, masked, scaled softmax
    (of the scores capped at `softcap`, cap * tanh(x / cap), where the model caps them, and
    with the head's learned sink beside the keys where `sinks`: its title says so).

    The masked scores and the weights hatch the cells where `may_attend` (T, S) is False,
    default where the masked scores are -inf (the causal future, a window, padding).
    `names` replaces the three panel titles. into: a figure this function returned for
    (T, S) matrices, refilled and returned (an empty `title` keeps its title).
    """
    values = [as_numpy(scores), as_numpy(masked_scores), as_numpy(weights)]
    T, S = values[0].shape
    may = np.isfinite(values[1]) if may_attend is None else may_attend_mask((T, S), may_attend)
    size, ticks = _layout(T, S, panels=3)
    if into is None:
        fig, axes = pyplot().subplots(1, 3, figsize=size, dpi=DPI, layout="tight")
    else:
        fig, axes = into, _panels(into, 3, "plot_attention_steps")
    scaled = "masked × scale" if scale is None else f"masked × {scale:.3g}"
    if softcap is not None:
        scaled = f"{softcap:g}·tanh({scaled} / {softcap:g})"
    softmax = f"softmax([{scaled}, sink])" if sinks else f"softmax({scaled})"
    names = names or ("raw scores  q @ kᵀ", "masked  (-inf above the diagonal)", softmax)
    for ax, v, kind, name in zip(axes, values, ("scores", "masked", "weights"), names,
                                 strict=True):
        _draw_kind(fig, ax, v, tokens, tokens, kind, ticks, may)
        ax.set_title(name, fontsize=9)
    _suptitle(fig, title, refill=into is not None)
    return fig


def _suptitle(fig: Figure, title: str, refill: bool) -> None:
    """The figure's title; an empty one leaves the figure as it is.

    A refill sets the text only: constrained layout moved the title to the room it made,
    and Figure.suptitle would put it back at its default height.
    """
    if not title:
        return
    if refill and fig.texts:  # Figure.suptitle's Text, the only figure text here
        fig.texts[0].set_text(title)
    else:
        fig.suptitle(title, fontsize=11)


def plot_row(
    weights_row: ArrayLike,
    tokens: Sequence[str],
    query: int,
    *,
    title: str | None = None,
    may_attend: ArrayLike | None = None,
    into: Figure | None = None,
) -> Figure:
    """One query's weights as bars over the keys up to it; keys it may not attend are
    hatched (they get exactly 0): the later keys, and those where `may_attend` (S,) is False
    (`Trace.may_attend(layer, row)[query]`: a sliding window, padding). `query` indexes
    `tokens` (= the keys).

    into: a figure this function returned for the same query and number of tokens,
    refilled (bar heights, values, masked keys, scale, title) and returned instead of a
    new one.
    """
    row = as_numpy(weights_row)
    S = row.shape[0]
    if not 0 <= query < S:
        raise ValueError(f"query {query} out of range for {S} tokens; use 0..{S - 1}")
    may = np.arange(S) <= query  # (S,): causal; the later keys get no bar
    if may_attend is not None:
        given = as_numpy(may_attend).astype(bool)
        if given.shape != (S,):
            raise ValueError(f"may_attend of shape {given.shape} for a row of {S} keys; pass "
                             "the query's (S,) row, e.g. trace.may_attend(layer, row)[query]")
        may &= given
    visible = np.flatnonzero(may[: query + 1])  # keys drawn with their weight
    shown = np.where(may, row, 0.0)[: query + 1]  # (query + 1,)
    if into is None:
        width = min(MAX_INCHES, max(4.0, 0.45 * S + 1.5)) if S <= 64 else MAX_INCHES
        fig, ax = pyplot().subplots(figsize=(width, 3.4), dpi=DPI, layout="tight")
        bars = ax.bar(np.arange(query + 1), shown, width=0.8 if S <= 64 else 1.0)
        ax.set_xlim(-0.5, S - 0.5)
        ax.set_ylabel("attention weight", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
    else:
        fig, ax = into, into.axes[0]
        bars = ax.containers[0]
        if len(bars) != query + 1 or ax.get_xlim() != (-0.5, S - 0.5):
            raise ValueError(f"into= holds a row of {len(bars)} bars over "
                             f"{ax.get_xlim()[1] + 0.5:.0f} tokens, not query {query} of "
                             f"{S}; pass into=None for a new figure")
        for bar, height in zip(bars, shown, strict=True):
            bar.set_height(height)
        for text in list(ax.texts):
            text.remove()  # the previous row's values
    hatch_columns(ax, ~may, "future: weight exactly 0" if may[: query + 1].all()
                   else "masked (future, window, padding): weight exactly 0")
    for bar in bars:
        bar.set_color("#3b6fb6")
    best = int(np.argmax(shown))
    bars[best].set_color("#d9822b")
    if S <= ANNOTATE_MAX * 2:
        for x in visible:
            ax.text(x, row[x], f"{row[x]:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, max(float(shown.max()), 1e-3) * 1.15)
    set_ticks(ax, "x", tokens, S, MAX_TICKS * 2 if S > 64 else MAX_TICKS)
    where = token_label(tokens[query])
    ax.set_title(title or f"query {query} {where!r}: weight on each key "
                 f"(largest: {best} {token_label(tokens[best])!r})", fontsize=10)
    return fig


# ------------------------------------------------------------------------- vectors


def plot_matrices(
    matrices: Sequence[ArrayLike],
    names: Sequence[str],
    tokens: Sequence[str],
    *,
    title: str = "",
    row_names: Sequence[Sequence[str]] | None = None,
    into: Figure | None = None,
) -> Figure:
    """(T, d) matrices side by side, one row per token, one column per dimension, on one
    shared diverging colour scale (the demos' q/k/v and embedding figures).

    into: a figure this function returned for as many (T, d) matrices, refilled and
    returned (an empty `title` keeps its title).
    """
    values = [as_numpy(m) for m in matrices]
    T, d = values[0].shape
    lim = max(float(np.abs(v).max()) for v in values) or 1.0
    n = len(values)
    cell = 0.5 if T <= ANNOTATE_MAX and d <= ANNOTATE_MAX else None
    if cell is not None:
        size = (min(MAX_INCHES, n * (d * cell + 1.6) + 1.2), T * cell + 1.8)
    else:
        size = (min(MAX_INCHES, n * max(2.5, d * 0.06 + 1.2) + 1.2),
                min(MAX_INCHES * 0.75, max(3.0, T * 0.04 + 1.8)))
    if into is None:
        fig, axes = pyplot().subplots(1, n, figsize=size, dpi=DPI, squeeze=False,
                                    layout="constrained")
        panels = list(axes[0])
    else:
        fig, panels = into, _panels(into, n, "plot_matrices")
    image = None
    for i, (ax, v, name) in enumerate(zip(panels, values, names, strict=True)):
        rows = tokens if row_names is None else row_names[i]
        image = heatmap(ax, v, row_labels=rows, col_labels=None, cmap="RdBu_r",
                        vmin=-lim, vmax=lim, max_ticks=MAX_TICKS if d <= ANNOTATE_MAX else 8)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("dimension", fontsize=8)
        if i > 0 and row_names is None:
            ax.set_yticklabels([])
    colorbar(fig, image, panels, shrink=0.8)  # never rebuilt: -lim..lim clips nothing
    _suptitle(fig, title, refill=into is not None)
    return fig


def plot_qkv(
    q: ArrayLike, k: ArrayLike, v: ArrayLike, tokens: Sequence[str], *,
    context: ArrayLike | None = None, title: str = "", into: Figure | None = None,
) -> Figure:
    """Queries, keys, values (T, hs) of one head, and the weighted values if given.

    into: a figure this function returned, refilled with this head (see plot_matrices).
    """
    mats, names = [q, k, v], ["queries q", "keys k", "values v"]
    if context is not None:
        mats.append(context)
        names.append("weighted values\nweights @ v")
    return plot_matrices(mats, names, tokens, title=title, into=into)


def plot_embeddings(
    tok_emb: ArrayLike, pos_emb: ArrayLike, emb: ArrayLike, tokens: Sequence[str], *,
    title: str = "",
) -> Figure:
    """Token embeddings, position embeddings (rows labelled by position) and their sum."""
    T = len(tokens)
    positions = [f"pos {i}" for i in range(T)]
    return plot_matrices(
        [tok_emb, pos_emb, emb], ["token embedding", "position embedding", "sum"], tokens,
        title=title, row_names=[tokens, positions, tokens],
    )


def plot_panels(
    matrices: Sequence[ArrayLike],
    token_lists: Sequence[Sequence[str]],
    titles: Sequence[str],
    *,
    ncols: int = 3,
    title: str = "",
    highlight: tuple[int, int] | None = None,
    may_attend: Sequence[ArrayLike] | None = None,
) -> Figure:
    """Several (T, T) weight matrices of different texts, each with its own tokens.

    highlight: a (query, key) cell outlined in every panel, e.g. the one a check is about.
    may_attend: one (T, T) bool mask per matrix, hatched where False (default: the causal
    future of each).
    """
    from matplotlib.patches import Rectangle

    plt = pyplot()
    n = len(matrices)
    if may_attend is not None and len(may_attend) != n:
        raise ValueError(f"{len(may_attend)} may_attend masks for {n} matrices; give one "
                         "(T, T) mask per matrix")
    nrows = math.ceil(n / ncols)
    T = max(as_numpy(m).shape[0] for m in matrices)
    (w, h), _ = _layout(T, T, panels=ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w, min(MAX_INCHES, h * nrows)),
                             dpi=DPI, squeeze=False, layout="constrained")
    for ax in axes.flat[n:]:
        ax.axis("off")
    image = None
    for i, (ax, m, toks, name) in enumerate(zip(axes.flat, matrices, token_lists, titles,
                                                strict=False)):
        v = as_numpy(m)
        may = may_attend_mask(v.shape, None if may_attend is None else may_attend[i])  # (T, T)
        image = heatmap(ax, v, row_labels=toks, col_labels=toks, masked=~may, vmin=0.0,
                        vmax=1.0)
        ax.set_title(name, fontsize=9)
        if highlight is not None:
            row, col = highlight
            ax.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False,
                                   edgecolor="#e8453c", linewidth=2.5))
    colorbar(fig, image, axes, label="weight", shrink=0.6)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig


def plot_loss(history: Sequence[dict[str, Any]]) -> Figure:
    """Train loss per step and val loss per evaluation (rows of `train()`'s history)."""
    train_rows = [r for r in history if "loss" in r]
    val_rows = [r for r in history if "val_loss" in r]
    fig, ax = pyplot().subplots(figsize=(6, 3.5), dpi=120, layout="tight")
    ax.plot([r["step"] for r in train_rows], [r["loss"] for r in train_rows], lw=1,
            alpha=0.7, label="train (batch)")
    if val_rows:
        ax.plot([r["step"] for r in val_rows], [r["val_loss"] for r in val_rows], "o-",
                label="val")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig
