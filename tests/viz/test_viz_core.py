"""viz/core.py, viz/save.py: save_figure draws once per file and saves what
bbox_inches="tight" saves; a refilled figure shows its new values and nothing of the old ones."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch

from attnlab import viz
from attnlab.viz import core, figures

pytest.importorskip("matplotlib")


def _pixels(path: Path) -> np.ndarray:
    import matplotlib.image

    return matplotlib.image.imread(path)  # (H, W, 4)


def _weights(T: int, seed: int) -> torch.Tensor:
    """(T, T) causal softmax weights."""
    scores = torch.randn(T, T, generator=torch.Generator().manual_seed(seed)) * 2
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    return torch.softmax(scores.masked_fill(future, float("-inf")), -1)


def _steps(T: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scores = torch.randn(T, T, generator=torch.Generator().manual_seed(seed))
    masked = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1),
                                float("-inf"))
    return scores, masked, torch.softmax(masked, -1)


def _margins(pixels: np.ndarray) -> tuple[int, ...]:
    """White rows / columns around what is drawn: (top, bottom, left, right)."""
    ink = (pixels[..., :3] < 0.99).any(-1)  # (H, W)
    rows, cols = np.flatnonzero(ink.any(1)), np.flatnonzero(ink.any(0))
    return (rows[0], len(ink) - 1 - rows[-1], cols[0], ink.shape[1] - 1 - cols[-1])


def test_save_figure_draws_once_per_file_and_saves_what_tight_saves(tmp_path: Path) -> None:
    """matplotlib's savefig(bbox_inches="tight") on a laid-out figure draws it twice; with
    one draw the PNG must hold the same picture with the same margin (0.1 in) around it, to
    the pixel but for the crop box rounded out to whole pixels."""
    from matplotlib.figure import Figure

    tokens = [f"t{i}" for i in range(16)]
    draw = mock.patch.object(Figure, "draw", autospec=True, side_effect=Figure.draw)
    with draw as draws:
        (png, svg) = viz.save_figure(viz.plot_attention(_weights(16, 0), tokens),
                                     tmp_path / "ours", ("png", "svg"))
    assert draws.call_count == 2  # one per file
    assert "<svg" in svg.read_text()[:1000]

    reference = viz.plot_attention(_weights(16, 0), tokens)
    with draw as draws:
        reference.savefig(tmp_path / "tight.png", bbox_inches="tight")
    assert draws.call_count == 2  # what save_figure avoids
    core.pyplot().close(reference)
    ours, tight = _pixels(png), _pixels(tmp_path / "tight.png")
    assert abs(ours.shape[0] - tight.shape[0]) <= 1 and abs(ours.shape[1] - tight.shape[1]) <= 1
    pad = round(0.1 * figures.DPI)  # 13 px
    assert all(pad - 1 <= m <= pad + 3 for m in _margins(ours)), _margins(ours)
    assert all(pad - 1 <= m <= pad + 3 for m in _margins(tight)), _margins(tight)


def _qkv(seed: int, into: Any) -> Any:
    q, k, v, context = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(seed))
    return viz.plot_qkv(q, k, v, list("abcdef"), context=context, title=f"head {seed}",
                        into=into)


REFILLS: dict[str, Callable[[int, Any], Any]] = {
    # seed 0: a sharp head, weights of 1 (no arrow on the colour bar); seed 1: softer
    "weights": lambda seed, into: viz.plot_attention(
        torch.eye(16) if seed == 0 else _weights(16, seed), [f"t{i}" for i in range(16)],
        title=f"head {seed}", into=into),
    "masked": lambda seed, into: viz.plot_attention(
        _steps(5, seed)[1], list("abcde"), kind="masked", title=f"head {seed}", into=into),
    "steps": lambda seed, into: viz.plot_attention_steps(
        *_steps(6, seed), list("abcdef"), title=f"head {seed}", into=into),
    "qkv": lambda seed, into: _qkv(seed, into),
    "row": lambda seed, into: viz.plot_row(_weights(8, seed)[5], list("abcdefgh"), 5,
                                           into=into),
}


def _shown(fig: Any) -> list[Any]:
    """What a figure shows, artist by artist: cells, colour scales, colour bar arrows, bars,
    and every text with its colour."""
    shown: list[Any] = [t.get_text() for t in fig.texts]
    for ax in fig.axes:
        if ax.images:
            image, cells = ax.images[0], ax.images[0].get_array()
            shown += [np.ma.filled(cells, 0).tolist(), np.ma.getmaskarray(cells).tolist(),
                      image.get_clim(), image.get_cmap().name,
                      image.colorbar and image.colorbar.extend]
        elif ax.containers:  # a row's bars
            shown += [(bar.get_height(), bar.get_facecolor()) for bar in ax.containers[0]]
            shown.append(ax.get_ylim())
        if ax.images or ax.containers:
            shown += [(t.get_text(), t.get_position(), t.get_color()) for t in ax.texts]
            shown += [ax.get_title(), [t.get_text() for t in ax.get_xticklabels()]]
    return shown


@pytest.mark.parametrize("kind", REFILLS)
def test_a_refilled_figure_shows_what_a_new_one_does(kind: str, tmp_path: Path) -> None:
    """Head 0 refilled with head 1 shows what a new figure of head 1 shows; refilled with
    head 0 again it is head 0's figure to the pixel: no value written in a cell, colour
    scale, arrow or bar of head 1 is left behind."""
    draw = REFILLS[kind]
    (first,) = viz.save_figure(draw(0, None), tmp_path / "first")
    fig = draw(0, None)
    viz.save_figure(fig, tmp_path / "first_again", close=False)  # laid out as `first` was
    assert draw(1, fig) is fig
    new = draw(1, None)
    assert _shown(fig) == _shown(new)
    core.pyplot().close(new)
    assert draw(0, fig) is fig
    (back,) = viz.save_figure(fig, tmp_path / "back")
    np.testing.assert_array_equal(_pixels(first), _pixels(back))


def test_refill_refuses_a_figure_of_another_shape() -> None:
    fig = viz.plot_attention(_weights(4, 0), list("abcd"))
    with pytest.raises(ValueError, match=r"holds a \(4, 4\) heatmap, got a \(5, 5\) matrix"):
        viz.plot_attention(_weights(5, 0), list("abcde"), into=fig)
    with pytest.raises(ValueError, match="holds 1 heatmaps where plot_attention_steps draws 3"):
        viz.plot_attention_steps(*_steps(4, 0), list("abcd"), into=fig)
    core.pyplot().close(fig)
    row = viz.plot_row(_weights(4, 0)[2], list("abcd"), 2)
    with pytest.raises(ValueError, match="row of 3 bars over 4 tokens, not query 1 of 4"):
        viz.plot_row(_weights(4, 0)[1], list("abcd"), 1, into=row)
    core.pyplot().close(row)


def test_a_refilled_figure_is_pasted_not_drawn_again(tmp_path: Path) -> None:
    """Saving a refilled figure pastes its unchanged token axes and draws the rest: one full
    draw for eight heads. New tokens (same length) change those axes: that save draws again.
    Pasted files are what a full draw of the same figure gives, to the pixel."""
    from matplotlib.figure import Figure

    tokens, other = [f"t{i}" for i in range(40)], [f"u{i}" for i in range(40)]
    fig = None

    def save(name: str) -> np.ndarray:
        (png,) = viz.save_figure(fig, tmp_path / name, close=False)
        return _pixels(png)

    with mock.patch.object(Figure, "draw", autospec=True, side_effect=Figure.draw) as draws:
        for head in range(8):
            fig = viz.plot_attention(_weights(40, head), tokens, title=f"head {head}", into=fig)
            save(f"h{head}")
        assert draws.call_count == 1
        viz.plot_attention(_weights(40, 0), other, title="head 0", into=fig)
        save("other0")
        assert draws.call_count == 2  # the token axes changed
        viz.plot_attention(_weights(40, 1), other, title="head 1", into=fig)
        pasted = save("other1")
        assert draws.call_count == 2
        del fig._attnlab_blit  # type: ignore[attr-defined]  # forget the copy: draw it whole
        full = save("full1")
        assert draws.call_count == 3
    np.testing.assert_array_equal(pasted, full)
    core.pyplot().close(fig)
