"""The layer x head grid: every chosen head's (T, S) attention weights in one figure, on
one Axes.

Each head is an image in its own place on the one Axes (white gaps between them, a frame
around each, the hatching of hidden cells behind them as one collection), with token
labels on the left column and the bottom row and the layer and head of each row and
column beside them. An Axes per head cost a layout, ticks and spines per head: 16 layers x
32 heads (a 1B Llama) took ~35 s of CPU to draw and save, one Axes ~2.5 s
(docs/performance.md#figures). An image per head, not one mosaic: matplotlib copies an
image's data when given it and twice more while drawing it, so one image of every head
would hold three copies of them all at once.

`figures.py` draws one head's figures; `core.py` holds the cell values written in small
panels, `visible.py` the colour scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .core import (
    ANNOTATE_MAX,
    MASKED_COLOR,
    ArrayLike,
    as_bool,
    as_floats,
    colorbar,
    pyplot,
    sideways,
    tick_labels,
    write_values,
)
from .figures import DPI, MAX_INCHES
from .visible import may_attend_mask, visible_vmax, visible_weights

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: a name ("layer 12", "head 31" at 9 pt) is written beside a panel this wide or wider (in
#: points); narrower panels get their numbers alone, under one "layer" / "head" caption
NAME_POINTS = 40


def plot_grid(
    weights: ArrayLike | Sequence[ArrayLike],
    tokens: Sequence[str],
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    title: str = "attention weights by layer and head",
    may_attend: ArrayLike | None = None,
) -> Figure:
    """(L, nh, T, S) weights as a grid: one row per layer, one column per head.

    `weights` may also be a sequence of L (nh, T, S) arrays, a trace's layers as they are:
    no stacked copy of them all. `layers`/`heads` name the rows and columns (default
    0..L-1, 0..nh-1). Token labels appear on the left column and bottom row only, thinned to
    fit the panel size. Cells where `may_attend` is False are hatched: (T, S) for every
    layer or (L, T, S) one per layer (layers' sliding windows differ), default the causal
    future. The figure's one Axes holds an image per layer, head j's cells at its columns
    j * (S + gap) (`grid_gap`).
    """
    values, mays = _checked(weights, may_attend)
    L, (H, T, S) = len(values), values[0].shape
    layers = list(range(L)) if layers is None else list(layers)
    heads = list(range(H)) if heads is None else list(heads)
    panel = min(2.6, MAX_INCHES / max(L, H))  # inches a side
    fig, ax = pyplot().subplots(figsize=(panel * H + 1.6, panel * L + 1.0), dpi=DPI,
                                layout="constrained")
    vmax = 1.0 if S <= ANNOTATE_MAX else visible_vmax(visible_weights(values, mays), S)
    _frame_panels(ax, L, H, T, S, thin=panel < 1.0)  # the hatching first: images go on top
    image = _draw_layers(ax, values, mays, vmax, annotate=T <= 6 and panel >= 2.0)
    ticks = max(2, int(panel * 7))  # about 7 labels per inch of panel (7 pt text)
    _label_panels(fig, ax, tokens, layers, heads, (T, S), ticks, panel * 72)
    colorbar(fig, image, ax, label="weight", shrink=0.6)
    fig.suptitle(f"{title}  (rows: queries, columns: keys)", fontsize=10)
    return fig


def _checked(weights: ArrayLike | Sequence[ArrayLike], may_attend: ArrayLike | None
             ) -> tuple[list[np.ndarray], np.ndarray]:
    """The weights as L (nh, T, S) arrays and the mask as (L, T, S), their shapes checked."""
    if isinstance(weights, ArrayLike) and weights.ndim != 4:
        raise ValueError(f"plot_grid needs (layers, heads, T, S) weights, got "
                         f"{tuple(weights.shape)}")
    values = [as_floats(layer) for layer in weights]  # (nh, T, S) each: a float32 tensor's view
    shapes = sorted({v.shape for v in values})
    if len(shapes) != 1 or len(shapes[0]) != 3:
        raise ValueError(f"plot_grid needs one (heads, T, S) array per layer, all of one "
                         f"shape, got shapes {shapes}")
    L, (_, T, S) = len(values), values[0].shape
    if may_attend is None or as_bool(may_attend).ndim == 2:
        return values, np.stack([may_attend_mask((T, S), may_attend)] * L)  # (L, T, S)
    mays = as_bool(may_attend)
    if mays.shape != (L, T, S):
        raise ValueError(f"may_attend of shape {mays.shape} for {L} layers of ({T}, {S}) "
                         f"weights; pass one (T, S) mask or ({L}, {T}, {S}), one per layer")
    return values, mays


def grid_gap(T: int, S: int) -> int:
    """Cells between two panels of the mosaic: about a twelfth of a panel, at least one."""
    return max(1, -(-max(T, S) // 12))


def _draw_layers(ax: Axes, values: list[np.ndarray], mays: np.ndarray, vmax: float,
                 annotate: bool) -> Any:
    """Head j of layer i as an image at rows i * (T + gap) and columns j * (S + gap) of
    `ax`'s data, over the hatching `_frame_panels` laid (shown where a query may not
    attend). The image holding the largest weight, for the colorbar (all share one
    scale)."""
    from matplotlib.colors import Normalize
    from matplotlib.image import AxesImage

    L, (H, T, S) = len(values), values[0].shape
    gap = grid_gap(T, S)
    norm = Normalize(0.0, vmax)
    largest, top_image = -np.inf, None
    for i in range(L):
        for j in range(H):
            hidden = ~mays[i] | ~np.isfinite(values[i][j])  # (T, S)
            shown = np.ma.masked_array(np.where(hidden, 0, values[i][j]), mask=hidden)
            top, left = i * (T + gap), j * (S + gap)
            # drawn as heatmap draws: colours after sampling the cells a pixel shows; added
            # as it is (imshow would rescale the axes' limits 512 times for a 1B model)
            image = AxesImage(ax, cmap="viridis", norm=norm, interpolation="nearest",
                              interpolation_stage="data",
                              extent=(left - 0.5, left + S - 0.5, top + T - 0.5, top - 0.5))
            image.set_data(shown)
            ax.add_image(image)
            if not hidden.all() and shown.max() > largest:
                largest, top_image = shown.max(), image
            if annotate:
                write_values(ax, values[i][j], hidden, image, at=(top, left))
    ax.set_xlim(-0.5, H * (S + gap) - gap - 0.5)
    ax.set_ylim(L * (T + gap) - gap - 0.5, -0.5)
    return top_image or image


def _frame_panels(ax: Axes, L: int, H: int, T: int, S: int, thin: bool) -> None:
    """Behind each panel the hatching its hidden cells show (added before the images, so
    drawn under them), around it a frame (the Axes' own spines would frame the whole
    grid)."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    gap = grid_gap(T, S)
    panels = [((j * (S + gap) - 0.5, i * (T + gap) - 0.5), S, T)
              for i in range(L) for j in range(H)]
    ax.add_collection(PatchCollection([Rectangle(*p) for p in panels], facecolor=MASKED_COLOR,
                                      edgecolor="#9a9a9a", hatch="///", linewidth=0, zorder=0),
                      autolim=False)
    # over the images, and not clipped: the outer frames lie on the Axes' edges
    ax.add_collection(PatchCollection([Rectangle(*p) for p in panels], facecolor="none",
                                      edgecolor="black", linewidth=0.5 if thin else 0.8,
                                      zorder=2, clip_on=False), autolim=False)
    for spine in ax.spines.values():
        spine.set_visible(False)


def _fitting(tokens: Sequence[str], n: int, ticks: int, points: float
             ) -> tuple[list[int], list[str], int]:
    """`tick_labels` of a panel `points` a side, thinned from `ticks` until a line of text
    (~1.4 em with its leading) fits between two labels: the next panel's follow at the
    same spacing."""
    while True:
        where, text, size = tick_labels(tokens, n, ticks)
        step = where[1] - where[0] if len(where) > 1 else n
        if ticks <= 2 or points * step / n >= 1.4 * size:
            return where, text, size
        ticks -= 1


def _label_panels(fig: Figure, ax: Axes, tokens: Sequence[str], layers: list[int],
                  heads: list[int], shape: tuple[int, int], ticks: int, points: float) -> None:
    """Token labels on the left column and bottom row (each panel's, thinned to `ticks`),
    each row's layer left of them and each column's head above: "layer 3" / "head 7", or the
    numbers alone under one caption where a panel (`points` a side) is too narrow."""
    T, S = shape
    gap = grid_gap(T, S)
    ys, y_text, y_size = _fitting(tokens, T, ticks, points)
    xs, x_text, x_size = _fitting(tokens, S, ticks, points)
    ax.set_yticks([i * (T + gap) + y for i in range(len(layers)) for y in ys],
                  y_text * len(layers), fontsize=y_size)
    # sideways too where a label (~0.6 em a character) is wider than its room: the next
    # panel's labels follow at the same spacing
    room = points * (xs[1] - xs[0] if len(xs) > 1 else S) / S
    turn = sideways(x_text) or max(map(len, x_text)) * 0.6 * x_size > room
    ax.set_xticks([j * (S + gap) + x for j in range(len(heads)) for x in xs],
                  x_text * len(heads), rotation=90 if turn else 0, fontsize=x_size)
    named = points >= NAME_POINTS
    size = 9 if named else 7
    for j, head in enumerate(heads):
        ax.annotate(f"head {head}" if named else str(head), (j * (S + gap) + (S - 1) / 2, 1),
                    xycoords=("data", "axes fraction"), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=size)
    # left of the widest token label: measured, as the annotations have no axis to follow
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    widest = max((t.get_window_extent(renderer).width for t in ax.get_yticklabels()),
                 default=0.0) * 72 / fig.dpi  # points
    left = widest + 10  # the tick (3.5 pt), its pad (3.5 pt) and a little room
    for i, layer in enumerate(layers):
        ax.annotate(f"layer {layer}" if named else str(layer), (0, i * (T + gap) + (T - 1) / 2),
                    xycoords=("axes fraction", "data"), xytext=(-left, 0),
                    textcoords="offset points", ha="right", va="center", fontsize=size,
                    rotation=90 if named else 0)
    if not named:  # captions beyond the numbers: ~0.6 em a digit
        ax.set_title("head", fontsize=9, pad=3 + size + 3)
        digits = max(len(str(layer)) for layer in layers)
        ax.set_ylabel("layer", fontsize=9, labelpad=left - widest - 7 + digits * 0.6 * size + 4)
