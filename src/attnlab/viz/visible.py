"""Which cells of attention a figure shows, and the colour scale's top over them: a query's
keys it may attend (`may_attend_mask`: a given (T, S) mask, or the causal past) and
`weight_vmax`, the scale's top for weights (1, or a high percentile of the visible weights
of a long text). The figures (figures.py) draw with them; nothing here draws.
"""

from __future__ import annotations

import numpy as np

from .core import ANNOTATE_MAX, ArrayLike, as_bool, as_numpy


def weight_vmax(weights: ArrayLike, may_attend: ArrayLike | None = None) -> float:
    """Top of the colour scale for attention weights: 1 for short texts.

    Over hundreds of keys typical weights are ~1/T and would all be one dark colour on a
    0..1 scale, so long texts use the 99.5th percentile of the visible weights instead (the
    colorbar then ends in an arrow: brighter cells are clipped, not hidden). Visible: where
    `may_attend` (broadcast to the weights' shape (..., T, S)) is True, default the causal
    past; the 0s of masked cells (a window, padding) would pull the percentile down.
    """
    values = as_numpy(weights)
    if values.shape[-1] <= ANNOTATE_MAX:
        return 1.0
    T, S = values.shape[-2:]
    may = may_attend_mask((T, S), None) if may_attend is None else as_bool(may_attend)
    try:
        visible = values[np.broadcast_to(may, values.shape)]
    except ValueError:
        raise ValueError(f"may_attend of shape {may.shape} does not broadcast to weights of "
                         f"shape {values.shape}; give one (T, S) = ({T}, {S}) mask, or one "
                         "per leading dimension") from None
    return visible_vmax(visible, S)


def visible_vmax(visible: np.ndarray, S: int) -> float:
    """weight_vmax of the visible weights `visible` (1-d, a copy: partitioned in place)."""
    if not visible.size:  # every cell masked (a row of pads): any scale
        return 1.0
    return float(min(1.0, max(np.quantile(visible, 0.995, overwrite_input=True), 2.0 / S)))


def visible_weights(values: list[np.ndarray], mays: np.ndarray) -> np.ndarray:
    """The weights of every layer's (nh, T, S) `values` where its (T, S) `mays` is True, in
    one 1-d array filled layer by layer (one layer's selection at a time beside it): what
    weight_vmax reads of the stacked (L, nh, T, S) weights."""
    counts = [int(may.sum()) * v.shape[0] for v, may in zip(values, mays, strict=True)]
    visible = np.empty(sum(counts), dtype=values[0].dtype)
    at = 0
    for v, may, n in zip(values, mays, counts, strict=True):
        visible[at:at + n] = v[:, may].ravel()  # (nh, visible cells)
        at += n
    return visible


def may_attend_mask(shape: tuple[int, ...], may_attend: ArrayLike | None) -> np.ndarray:
    """(T, S) bool: `may_attend` checked against a (T, S) matrix, or by default the causal
    past (queries being the last T of S positions)."""
    T, S = shape
    if may_attend is None:
        return np.arange(S)[None, :] <= np.arange(S - T, S)[:, None]  # (T, S)
    may = as_bool(may_attend)
    if may.shape != (T, S):
        raise ValueError(f"may_attend of shape {may.shape} for a ({T}, {S}) matrix; pass the "
                         "(T, S) mask of the layer and row drawn, e.g. "
                         "trace.may_attend(layer, row)")
    return may
