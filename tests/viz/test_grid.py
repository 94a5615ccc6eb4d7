"""viz/grid.py: the layer x head grid shows each head's weights in its own panel, and its
labels (tokens, layers, heads) are where they belong and do not run into each other, at
any grid size: 16 x 32 heads (a 1B Llama) were 512 Axes whose panels collapsed to slivers
and whose head names ran together ("head 10head 11")."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch

from attnlab import viz
from attnlab.viz.grid import grid_gap

pytest.importorskip("matplotlib")


def _weights(L: int, H: int, T: int) -> torch.Tensor:
    """(L, H, T, T) causal attention weights, a different pattern in every head."""
    scores = torch.randn(L, H, T, T, generator=torch.Generator().manual_seed(0))
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1)


def _panel(fig: Any, layer: int, head: int) -> np.ma.MaskedArray:
    """The drawn cells of panel (layer, head): the grid's one Axes holds an image per head,
    layer by layer, each in its own place."""
    ax = fig.axes[0]
    heads = len(ax.images) // len({image.get_extent()[2] for image in ax.images})
    return ax.images[layer * heads + head].get_array()


def _drawn(fig: Any) -> Any:
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _apart(texts: list[Any], renderer: Any, axis: int) -> bool:
    """Whether consecutive texts' boxes do not overlap along `axis` (0: x, 1: y)."""
    boxes = sorted((t.get_window_extent(renderer).extents for t in texts),
                   key=lambda e: e[axis])
    return all(a[axis + 2] <= b[axis] + 0.5 for a, b in itertools.pairwise(boxes))


def test_each_panel_shows_its_heads_weights_and_hides_the_future() -> None:
    import matplotlib.pyplot as plt

    L, H, T = 3, 4, 5
    weights = _weights(L, H, T)
    fig = viz.plot_grid(weights, list("abcde"), layers=[2, 5, 7], heads=[0, 1, 3, 6])
    future = np.triu(np.ones((T, T), dtype=bool), 1)
    gap = grid_gap(T, T)
    for i in range(L):
        for j in range(H):
            cells = _panel(fig, i, j)
            assert (np.ma.getmaskarray(cells) == future).all(), (i, j)
            np.testing.assert_allclose(cells.filled(0), weights[i, j].numpy(), rtol=1e-6)
            # at row i, column j of the grid: its cells' centres at whole numbers
            left, top = j * (T + gap) - 0.5, i * (T + gap) - 0.5
            extent = tuple(fig.axes[0].images[i * H + j].get_extent())
            assert extent == (left, left + T, top + T, top), (i, j)
    plt.close(fig)


def test_labels_name_each_layer_head_and_token_in_place() -> None:
    """Token labels down the left of each layer's row and along the bottom of each head's
    column; each layer's name left of its row, each head's name over its column."""
    import matplotlib.pyplot as plt

    L, H, T = 2, 3, 4
    tokens = ["the", "cat", "sat", "on"]
    fig = viz.plot_grid(_weights(L, H, T), tokens, layers=[4, 9], heads=[1, 2, 5])
    ax = fig.axes[0]
    renderer = _drawn(fig)
    gap = grid_gap(T, T)
    assert [t.get_text() for t in ax.get_yticklabels()] == tokens * L
    assert list(ax.get_yticks()) == [i * (T + gap) + k for i in range(L) for k in range(T)]
    assert [t.get_text() for t in ax.get_xticklabels()] == tokens * H
    names = {t.get_text(): t for t in ax.texts}
    assert {"layer 4", "layer 9", "head 1", "head 2", "head 5"} <= set(names)
    panel_box = ax.get_window_extent(renderer)
    for j, head in enumerate([1, 2, 5]):  # centred over its column, above the panels
        box = names[f"head {head}"].get_window_extent(renderer)
        centre = ax.transData.transform((j * (T + gap) + (T - 1) / 2, 0))[0]
        assert abs((box.x0 + box.x1) / 2 - centre) < 1 and box.y0 >= panel_box.y1
    ticks = max(t.get_window_extent(renderer).x1 for t in ax.get_yticklabels())
    lefts = min(t.get_window_extent(renderer).x0 for t in ax.get_yticklabels())
    for i, layer in enumerate([4, 9]):  # left of the token labels, level with its row
        box = names[f"layer {layer}"].get_window_extent(renderer)
        middle = ax.transData.transform((0, i * (T + gap) + (T - 1) / 2))[1]
        assert box.x1 < lefts < ticks and abs((box.y0 + box.y1) / 2 - middle) < 1
    plt.close(fig)


def test_a_1b_models_grid_of_512_heads_stays_readable() -> None:
    """16 layers x 32 heads: the head and layer numbers and the tokens each keep apart, and
    the captions clear them (names such as "head 10" do not fit beside a panel 0.4 in
    wide: the numbers stand alone under one caption)."""
    import matplotlib.pyplot as plt

    L, H, T = 16, 32, 6
    tokens = [f"tok{i}" for i in range(T)]
    fig = viz.plot_grid(_weights(L, H, T), tokens)
    ax = fig.axes[0]
    renderer = _drawn(fig)
    top = ax.get_window_extent(renderer).y1
    heads = [t for t in ax.texts if t.get_window_extent(renderer).y0 >= top]  # over it
    layers = [t for t in ax.texts if t not in heads]
    assert [t.get_text() for t in heads] == [str(h) for h in range(H)]
    assert [t.get_text() for t in layers] == [str(i) for i in range(L)]
    assert ax.get_title() == "head" and ax.get_ylabel() == "layer"
    assert _apart(heads, renderer, axis=0) and _apart(layers, renderer, axis=1)
    assert _apart(ax.get_xticklabels(), renderer, axis=0)
    assert _apart(ax.get_yticklabels(), renderer, axis=1)
    # the captions clear the numbers they name
    title = ax.title.get_window_extent(renderer)
    assert all(t.get_window_extent(renderer).y1 <= title.y0 for t in heads)
    label = ax.yaxis.label.get_window_extent(renderer)
    assert all(label.x1 <= t.get_window_extent(renderer).x0 for t in layers)
    plt.close(fig)


def test_the_pixels_show_each_panels_colours_over_its_hatching() -> None:
    """Drawn, each panel's cells have its weights' colours and its hidden cells the
    hatching's grey (the hatching laid over the images would hide every weight)."""
    import matplotlib.pyplot as plt

    L, H, T = 2, 3, 4
    weights = torch.zeros(L, H, T, T)
    weights[..., 0] = 1.0  # every query on its first key
    fig = viz.plot_grid(weights, list("abcd"))
    ax = fig.axes[0]
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3] / 255.0  # (height, width, 3)
    gap = grid_gap(T, T)
    image = ax.images[0]
    one, zero = (np.asarray(image.cmap(image.norm(v)))[:3] for v in (1.0, 0.0))

    def colour(layer: int, head: int, row: int, col: int) -> np.ndarray:
        # the cell's lower-right quarter: clear of the value written in its centre
        x, y = ax.transData.transform((head * (T + gap) + col + 0.3,
                                       layer * (T + gap) + row + 0.3))
        r, c = int(pixels.shape[0] - y), int(x)
        return pixels[r - 3:r + 3, c - 3:c + 3].reshape(-1, 3).mean(0)

    for layer, head in [(0, 0), (1, 2)]:
        assert np.abs(colour(layer, head, 3, 0) - one).max() < 0.05  # weight 1: yellow
        assert np.abs(colour(layer, head, 3, 1) - zero).max() < 0.05  # weight 0: dark
        masked = colour(layer, head, 0, 3)  # the future: light grey with hatch lines
        assert masked.mean() > 0.6 and np.ptp(masked) < 0.08
    plt.close(fig)
