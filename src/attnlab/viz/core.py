"""What every figure module shares: the lazy matplotlib import, token tick labels, `heatmap`
and colorbars (`save_figure` is `save.py`'s).

`figures.py` draws attention and `heads.py` interventions, both with these pieces; this
module knows nothing of attention. Readable at any length: small matrices (up to
`ANNOTATE_MAX` rows and columns) get their values written in the cells; larger ones get
none, and tick labels are thinned to about `MAX_TICKS` per axis (labelled "position
token"). Cells a query may not attend to are hatched grey, never drawn
as a 0 or a colour.

Cheap to write many of: `heatmap` refills an axes that already holds one (new values, same
ticks, not set again when they are the same), so a figure can be refilled and saved for
head after head (`attnlab inspect` does) instead of being built and laid out anew; a
refilled figure's save pastes its unchanged tick labels (`save.py`).

matplotlib is the `viz` extra and is imported inside `pyplot()`, with the Agg backend (no
display needed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import Tensor

from ..tokenizers.token_bytes import visible_controls

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ANNOTATE_MAX = 12  # write values in cells when both sides are at most this long
MAX_TICKS = 32  # at most this many tick labels per axis
MASKED_COLOR = "#d9d9d9"

ArrayLike = Tensor | np.ndarray


def pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError("figures need matplotlib: pip install 'attnlab[viz]'") from err
    return plt


def as_numpy(x: ArrayLike) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def as_floats(x: ArrayLike) -> np.ndarray:
    """Values to draw: `as_numpy`'s, but a float32 array as it is, not copied to float64 (a
    figure holds what it draws until it is closed: the grid, a trace's worth)."""
    if isinstance(x, np.ndarray) and x.dtype == np.float32:
        return x
    return as_numpy(x)


def as_bool(x: ArrayLike) -> np.ndarray:
    """A mask as a numpy bool array (nonzero: True), without a float copy on the way."""
    if isinstance(x, Tensor):
        return x.detach().cpu().bool().numpy()
    return np.asarray(x).astype(bool, copy=False)


def token_label(token: str, width: int = 12) -> str:
    """A token as a tick label: control characters escaped (\\n, <1b>), a token of spaces
    shown as "␣", long tokens cut with an ellipsis."""
    if token and token.strip(" ") == "":
        return "␣" * min(len(token), 3)
    text = visible_controls(token)  # a missing-glyph box and a warning each, drawn as they are
    text = text.replace("$", r"\$")  # matplotlib would start mathtext
    return text if len(text) <= width else text[: width - 1] + "…"


def _tick_positions(n: int, max_ticks: int = MAX_TICKS) -> list[int]:
    step = max(1, math.ceil(n / max_ticks))
    return list(range(0, n, step))


def tick_labels(labels: Sequence[str] | None, n: int, max_ticks: int = MAX_TICKS
                ) -> tuple[list[int], list[str], int]:
    """(positions, texts, font size) of one axis of `n` cells: every cell labelled when
    they fit, else every k-th as "position token"."""
    where = _tick_positions(n, max_ticks)
    if labels is None:
        text = [str(i) for i in where]
    elif len(where) == n:
        text = [token_label(labels[i]) for i in where]
    else:
        text = [f"{i} {token_label(labels[i], 8)}" for i in where]
    return where, text, 9 if n <= ANNOTATE_MAX else 7 if n <= 64 else 6


def sideways(text: Sequence[str]) -> bool:
    """Whether x tick labels turn sideways: once words would collide (single characters
    and numbers fit)."""
    return (len(text) > 4 and max(map(len, text), default=0) > 2) or len(text) > 16


def set_ticks(ax: Axes, axis: str, labels: Sequence[str] | None, n: int,
              max_ticks: int = MAX_TICKS) -> None:
    """Label every cell when they fit, else every k-th as "position token"."""
    where, text, size = tick_labels(labels, n, max_ticks)
    held = ax.__dict__.setdefault("_attnlab_ticks", {})
    if held.get(axis) == (where, text, size):
        return  # a refill with the same labels: setting them again costs more than a draw
    held[axis] = (where, text, size)
    if axis == "x":
        ax.set_xticks(where, text, rotation=90 if sideways(text) else 0, fontsize=size)
    else:
        ax.set_yticks(where, text, fontsize=size)


def _fmt(value: float) -> str:
    if value == float("-inf"):
        return "-inf"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}"


def heatmap(
    ax: Axes,
    matrix: ArrayLike,
    *,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    masked: ArrayLike | None = None,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    annotate: bool | None = None,
    masked_text: str = "",
    max_ticks: int = MAX_TICKS,
) -> Any:
    """Draw a (rows, cols) matrix on `ax`; returns the image (for a colorbar).

    masked: bool (rows, cols), True where the cell is masked (a query may not attend):
    drawn hatched grey, with `masked_text` (e.g. "-inf") written in it when annotated.
    Non-finite values (-inf scores) count as masked too. annotate: None writes values
    when the matrix is at most ANNOTATE_MAX on both sides.

    On an axes that already holds a heatmap of the same shape, the image is refilled: its
    values, colours and written values are replaced, its Tick objects are kept (building
    them is most of the cost of a new axes).
    """
    values = as_floats(matrix)
    if values.ndim != 2:
        raise ValueError(f"heatmap needs a 2-d matrix, got shape {values.shape}; index the "
                         "batch and head first, e.g. weights[0, head]")
    hide = ~np.isfinite(values)
    if masked is not None:
        hide |= as_bool(masked)
    # in the values' dtype: a float32 matrix drawn as float64 would double what the image
    # keeps until the figure is closed (imshow keeps a copy of what it is given)
    shown = np.ma.masked_array(np.where(hide, values.dtype.type(0), values), mask=hide)
    rows, cols = values.shape
    if ax.images:
        image = ax.images[0]
        held = image.get_size()  # (rows, cols)
        if held != values.shape:
            raise ValueError(f"this axes holds a {held} heatmap, got a {values.shape} matrix; "
                             "draw a matrix of another shape on a new figure")
        for text in list(ax.texts):
            text.remove()  # the values written for the previous matrix
        image.set_data(shown)
        if image.get_cmap().name != cmap:
            image.set_cmap(cmap)
        # imshow's None: scale to the data
        image.set_clim(shown.min() if vmin is None else vmin,
                       shown.max() if vmax is None else vmax)
    else:
        ax.add_patch(_hatch_patch(values.shape))
        # colours after sampling the cells a pixel shows: the same pixels as matplotlib's
        # "auto" (colours of every cell, then sampled, past 3 cells a pixel), drawn with a
        # tenth of the memory (9 against 98 bytes a cell: docs/performance.md#inspect-memory)
        image = ax.imshow(shown, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest",
                          interpolation_stage="data", aspect="auto")
        ax.set_xlim(-0.5, cols - 0.5)
        ax.set_ylim(rows - 0.5, -0.5)
    set_ticks(ax, "x", col_labels, cols, max_ticks)
    set_ticks(ax, "y", row_labels, rows, max_ticks)
    if annotate is None:
        annotate = rows <= ANNOTATE_MAX and cols <= ANNOTATE_MAX
    if annotate:
        write_values(ax, values, hide, image, masked_text)
    return image


def write_values(ax: Axes, values: np.ndarray, hide: np.ndarray, image: Any,
                 masked_text: str = "", at: tuple[int, int] = (0, 0)) -> None:
    """Each cell's value written in it, white on dark colours and black on light ones
    (`image`'s colours); `masked_text` in the cells `hide` marks. at: the (row, column) of
    the matrix's first cell in `ax`'s data (a panel of a mosaic: `grid.py`)."""
    colours = np.asarray(image.cmap(image.norm(values)))  # (rows, cols, 4) RGBA per cell
    luminance = colours[..., :3] @ np.array([0.299, 0.587, 0.114])  # (rows, cols)
    top, left = at
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if hide[i, j]:
                if masked_text:
                    ax.text(left + j, top + i, masked_text, ha="center", va="center",
                            fontsize=8, color="#555555")
                continue
            ax.text(left + j, top + i, _fmt(values[i, j]), ha="center", va="center",
                    fontsize=8, color="white" if luminance[i, j] < 0.5 else "black")


def _hatch_patch(shape: tuple[int, ...]) -> Any:
    from matplotlib.patches import Rectangle

    rows, cols = shape
    return Rectangle((-0.5, -0.5), cols, rows, facecolor=MASKED_COLOR, edgecolor="#9a9a9a",
                     hatch="///", linewidth=0, zorder=0)


def hatch_columns(ax: Axes, masked: np.ndarray, label: str) -> None:
    """A hatched band over each run of masked columns (n,) of a bar chart, with `label` in a
    legend while there is one; the bands of an earlier call on `ax` go (a refill)."""
    for patch in [p for p in ax.patches if p.get_gid() == "masked"]:
        patch.remove()
    edges = np.flatnonzero(np.diff(np.concatenate([[0], masked.astype(np.int8), [0]])))
    for first, end in zip(edges[::2], edges[1::2], strict=True):  # columns first..end - 1
        ax.axvspan(first - 0.5, end - 0.5, facecolor=MASKED_COLOR, hatch="///",
                   edgecolor="#9a9a9a", linewidth=0, gid="masked",
                   label=label if first == edges[0] else None)
    legend = ax.get_legend()
    if masked.any():
        ax.legend(fontsize=8, loc="upper right")
    elif legend is not None:
        legend.remove()


def colorbar(fig: Figure, image: Any, ax: Any, label: str = "", **kwargs: Any) -> None:
    """A colorbar; an arrow at the top when the scale clips larger values.

    A refilled image keeps its bar, which follows the image's new scale by itself; the bar
    is built anew only when the arrow comes or goes, in the gridspec slot the old one
    leaves beside its panel (plot_matrices' bar, shared by its panels, never clips).
    """
    values = image.get_array()
    top = image.norm.vmax
    clipped = values is not None and values.size and float(np.ma.max(values)) > top + 1e-9
    extend = "max" if clipped else "neither"
    if image.colorbar is not None:
        if image.colorbar.extend == extend:
            return
        image.colorbar.remove()  # gives its room back to `ax`, so the new bar sits the same
    bar = fig.colorbar(image, ax=ax, extend=extend, label=label, **kwargs)
    bar.ax.tick_params(labelsize=7)


def to_list(x: ArrayLike, decimals: int = 5) -> Any:
    """A tensor as nested lists of rounded floats, for JSON."""
    return np.round(as_numpy(x), decimals).tolist()
