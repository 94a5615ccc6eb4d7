"""Figures of interventions: detector scores, per-head attention summaries and patching effects
per layer and head, the residual stream's patching effects per position, the logit lens's
top tokens, and a mixture of experts' routing.

`figures.py` draws attention and `core.py` / `save.py` own the shared pieces (`heatmap`,
the lazy matplotlib import, `save_figure`); this module draws what `interp`'s `heads.py`,
`patching.py` and `lens.py` return, as plain tensors in, a matplotlib `Figure` out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from torch import Tensor

from ..model.names import HEAD_INPUTS
from .core import colorbar, heatmap, pyplot, token_label
from .figures import MAX_INCHES

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _layer_head_axes(ax: object, n_layer: int, n_head: int, layers: Sequence[int] | None = None,
                     heads: Sequence[int] | None = None) -> None:
    """Label rows as layers and columns as heads (`layers`, `heads`: their indices in the
    model, default 0..n-1)."""
    heads = range(n_head) if heads is None else heads
    layers = range(n_layer) if layers is None else layers
    ax.set_xticks(range(n_head), [str(h) for h in heads])  # type: ignore[attr-defined]
    ax.set_yticks(range(n_layer), [str(la) for la in layers])  # type: ignore[attr-defined]
    ax.set_xlabel("head")  # type: ignore[attr-defined]
    ax.set_ylabel("layer")  # type: ignore[attr-defined]


def plot_head_scores(scores: dict[str, Tensor], title: str = "head detector scores") -> Figure:
    """One layer x head heatmap per detector ((n_layer, nh) scores in [0, 1])."""
    plt = pyplot()
    n = len(scores)
    L, H = next(iter(scores.values())).shape
    panel = min(3.2, max(1.6, 0.45 * H + 0.8))
    fig, axes = plt.subplots(1, n, figsize=(panel * n + 1.0, 0.45 * L + 1.6), dpi=100,
                             squeeze=False, layout="constrained")
    image = None
    for ax, (kind, values) in zip(axes[0], scores.items(), strict=True):
        image = heatmap(ax, values, vmin=0.0, vmax=1.0, annotate=L * H <= 12 * 12)
        _layer_head_axes(ax, L, H)
        ax.set_title(kind.replace("_", " "), fontsize=10)
    colorbar(fig, image, axes, label="share of attention on target cells", shrink=0.8)
    fig.suptitle(title, fontsize=11)
    return fig


def plot_head_summaries(means: dict[str, Tensor], labels: dict[str, str] | None = None,
                        title: str = "per-head attention summaries", *,
                        layers: Sequence[int] | None = None,
                        heads: Sequence[int] | None = None) -> Figure:
    """One layer x head heatmap per summary ((n_layer, nh) means, `interp.heads.head_summaries`),
    each on its own scale and colorbar (entropy in nats and distance in tokens are not
    shares); labels: each panel's title (default: the summary's name); layers, heads: the
    model's indices of the rows and columns (default 0..n-1)."""
    plt = pyplot()
    n = len(means)
    L, H = next(iter(means.values())).shape
    panel = min(3.6, max(2.0, 0.45 * H + 1.4))
    fig, axes = plt.subplots(1, n, figsize=(panel * n + 0.5, 0.45 * L + 1.8), dpi=100,
                             squeeze=False, layout="constrained")
    for ax, (name, values) in zip(axes[0], means.items(), strict=True):
        share = name in ("attn_sink", "attn_max")  # weights: in [0, 1]
        image = heatmap(ax, values, cmap="viridis", vmin=0.0,
                        vmax=1.0 if share else None, annotate=L * H <= 8 * 8)
        _layer_head_axes(ax, L, H, layers, heads)
        label = (labels or {}).get(name, name)
        ax.set_title(label, fontsize=10)
        colorbar(fig, image, ax, shrink=0.8)
    fig.suptitle(title, fontsize=11)
    return fig


def plot_patching(heads: Tensor, resid: Tensor, tokens: Sequence[str],
                  title: str = "activation patching (1 = restores the clean run)", *,
                  attn_out: Tensor | None = None, mlp_out: Tensor | None = None,
                  inputs: Mapping[str, Tensor] | None = None) -> Figure:
    """Heads (n_layer, nh) and residual (n_layer, T) normalized patching effects; attn_out
    and mlp_out (n_layer, T), each layer's attention and MLP outputs at one position, are
    drawn under the residual's where given, and `inputs` ({"q": (n_layer, nh), "k":
    (n_layer, nkv), ...}: each head's inputs at every position; or path patching's senders,
    NaN drawn hatched) under the heads'."""
    plt = pyplot()
    L, H = heads.shape
    T = resid.shape[1]
    grids = {"resid": (resid, "residual stream (one position)", "layer (residual stream "
                       "entering it)")}
    for key, grid, what in (("attn", attn_out, "attention output"), ("mlp", mlp_out, "MLP output")):
        if grid is not None:
            grids[key] = (grid, f"{what} (one position)", "layer")
    per_head = {"heads": (heads, "head outputs (every position)")}
    for name, grid in (inputs or {}).items():
        shared = " of key-value heads" if grid.shape[1] != H else ""  # grouped queries
        per_head[name] = (grid, f"{HEAD_INPUTS.get(name, name)}{shared} (every position)")
    # 0.45 in a position, shrunk to fit MAX_INCHES (4 heads, 1000 tokens: 456 in wide)
    width = min(0.45 * T, max(2.0, MAX_INCHES - 4.0 - 0.5 * H))
    left, right = list(per_head), list(grids)
    rows = max(len(left), len(right))
    layout = [[left[i] if i < len(left) else ".", right[i] if i < len(right) else "."]
              for i in range(rows)]  # "." leaves a cell empty
    fig, axes = plt.subplot_mosaic(
        layout, figsize=(2.0 + 0.5 * H + 2.0 + width, (0.5 * L + 1.2) * rows + 1.0),
        dpi=100, layout="constrained", width_ratios=[max(H, 2), max(T, 2)])
    every = [v for v, _ in per_head.values()] + [v for v, _, _ in grids.values()]
    lim = max(1.0, *(float(g.nan_to_num().abs().max()) for g in every))  # NaN: no path
    for key, (grid, label) in per_head.items():
        heatmap(axes[key], grid, cmap="RdBu", vmin=-lim, vmax=lim)
        _layer_head_axes(axes[key], L, grid.shape[1])
        axes[key].set_title(label, fontsize=10)
    image = None
    for i, (key, (grid, label, ylabel)) in enumerate(grids.items()):
        last = i == len(grids) - 1
        image = heatmap(axes[key], grid, cmap="RdBu", vmin=-lim, vmax=lim,
                        col_labels=[f"{j} {token_label(t)}" for j, t in enumerate(tokens)],
                        row_labels=[str(la) for la in range(L)])
        if last:
            axes[key].set_xlabel("position")
        axes[key].set_ylabel(ylabel)
        axes[key].set_title(label, fontsize=10)
    colorbar(fig, image, list(axes.values()), label="normalized effect", shrink=0.8)
    fig.suptitle(title, fontsize=11)
    return fig


def plot_lens(top_probs: Tensor, top_tokens: Sequence[Sequence[str]], tokens: Sequence[str],
              title: str = "logit lens: most likely next token after each layer",
              rows: Sequence[str] | None = None) -> Figure:
    """(R, T) top-1 probabilities, with each cell's token written in it (up to 42
    positions; longer texts get the colours and thinned position labels). rows: the R row
    labels (`interp.lens.lens_labels`); default "emb", then "layer i"."""
    plt = pyplot()
    labels = list(rows) if rows is not None else (
        ["emb"] + [f"layer {i}" for i in range(top_probs.shape[0] - 1)])
    rows_n, T = top_probs.shape
    if len(labels) != rows_n:
        raise ValueError(f"{len(labels)} row labels for {rows_n} rows of lens probabilities; "
                         "give one label per row, or rows=None for emb, layer 0, ...")
    # 0.6 in a position, shrunk to fit MAX_INCHES: a long text would otherwise make a PNG
    # tens of thousands of pixels wide and slow to save (docs/performance.md#figures); the
    # tokens are written in the cells while a cell holds one
    width = min(1.2 + 0.6 * T, MAX_INCHES)
    cell = (width - 1.2) / T  # inches a position
    fig, ax = plt.subplots(figsize=(width, 0.5 * rows_n + 1.6), dpi=100,
                           layout="constrained")
    image = heatmap(ax, top_probs, vmin=0.0, vmax=1.0, annotate=False,
                    col_labels=[token_label(t) for t in tokens],
                    row_labels=labels)
    for i in range(rows_n if cell >= 0.3 else 0):
        for j in range(T):
            ax.text(j, i, token_label(top_tokens[i][j], 6), ha="center", va="center",
                    fontsize=8, color="white" if float(top_probs[i, j]) < 0.5 else "black")
    ax.set_xlabel("input token (the prediction is for the next one)")
    colorbar(fig, image, ax, label="probability of the token shown")
    fig.suptitle(title, fontsize=11)
    return fig


def plot_experts(weights: Sequence[Tensor], tokens: Sequence[str], layers: Sequence[int],
                 title: str = "expert weights") -> Figure:
    """A mixture of experts' routing: one token x expert heatmap per layer (each (T, E), a
    trace's "expert_weights" of one row), the weight each expert has in each token's output;
    an expert the token skipped is hatched. Four layers a row of panels."""
    plt = pyplot()
    T, E = weights[0].shape
    columns = min(len(weights), 4)
    rows = -(-len(weights) // columns)
    panel = (min(0.3 * E + 1.2, MAX_INCHES / columns), min(0.25 * T + 1.0, 12.0))
    fig, axes = plt.subplots(rows, columns, figsize=(panel[0] * columns + 1.0, panel[1] * rows
                                                      + 0.8), dpi=100, squeeze=False,
                             layout="constrained")
    image = None
    # a router that scales its weights (DeepSeek-V3's routed_scaling) goes past 1
    top = max(1.0, *(float(w.max()) for w in weights))
    for ax, la, w in zip(axes.flat, layers, weights, strict=False):
        image = heatmap(ax, w, vmin=0.0, vmax=top, masked=w == 0, annotate=T * E <= 16 * 8,
                        row_labels=[token_label(t) for t in tokens],
                        col_labels=[str(e) for e in range(E)])
        ax.set_title(f"layer {la}", fontsize=10)
        ax.set_xlabel("expert")
    for ax in list(axes.flat)[len(weights):]:
        ax.set_visible(False)
    colorbar(fig, image, axes, label="weight in the token's output (hatched: not chosen)",
             shrink=0.8)
    fig.suptitle(title, fontsize=11)
    return fig
