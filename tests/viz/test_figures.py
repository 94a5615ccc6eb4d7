"""viz/figures.py: figures are written, masked cells are drawn as masked, long texts stay
readable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import GPT, GPTConfig, Trace, viz
from attnlab.viz import figures

pytest.importorskip("matplotlib")


def _trace(T: int, n_layer: int = 2) -> tuple[Trace, list[str]]:
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_layer=n_layer, block_size=max(T, 8))).eval()
    idx = torch.randint(0, 65, (1, T), generator=torch.Generator().manual_seed(0))
    trace = Trace()
    model(idx, trace=trace)
    tokens = [f"w{int(i)}" for i in idx[0]]
    tokens[0] = "\n"  # control characters must not break a label
    return trace, tokens


def _png_size(path: Path) -> tuple[int, int]:
    import matplotlib.image

    height, width = matplotlib.image.imread(path).shape[:2]
    return width, height


def test_every_figure_is_written_non_empty(tmp_path: Path) -> None:
    trace, tokens = _trace(8)
    head = {n: trace.get(n, 0)[0, 1] for n in
            ("q", "k", "v", "context", "attn_scores", "masked_scores", "attn_weights")}
    grid = torch.stack([trace.get("attn_weights", la)[0] for la in range(2)])  # (L, nh, T, T)
    figures = {
        "weights": viz.plot_attention(head["attn_weights"], tokens),
        "masked": viz.plot_attention(head["masked_scores"], tokens, kind="masked"),
        "steps": viz.plot_attention_steps(head["attn_scores"], head["masked_scores"],
                                          head["attn_weights"], tokens, scale=0.35),
        "grid": viz.plot_grid(grid, tokens),
        "row": viz.plot_row(head["attn_weights"][5], tokens, 5),
        "qkv": viz.plot_qkv(head["q"], head["k"], head["v"], tokens, context=head["context"]),
        "emb": viz.plot_embeddings(trace.get("tok_emb")[0], trace.get("pos_emb")[0],
                                   trace.get("emb")[0], tokens),
        "panels": viz.plot_panels([head["attn_weights"]] * 2, [tokens] * 2, ["a", "b"]),
        "loss": viz.plot_loss([{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5},
                               {"step": 2, "val_loss": 1.7}]),
    }
    for name, fig in figures.items():
        formats = ("png", "svg") if name in ("steps", "grid") else ("png",)  # SVG: two suffice
        files = viz.save_figure(fig, tmp_path / name, formats)
        assert [f.suffix for f in files] == [f".{f}" for f in formats]
        assert files[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        w, h = _png_size(files[0])
        assert 300 <= w <= 2000 and 250 <= h <= 2000, (name, w, h)
        if len(files) == 2:
            assert "<svg" in files[1].read_text()[:1000], name


def test_small_matrices_show_values_and_masked_cells_show_no_number() -> None:
    weights = torch.softmax(torch.randn(4, 4).masked_fill(
        torch.triu(torch.ones(4, 4, dtype=torch.bool), 1), float("-inf")), -1)
    fig = viz.plot_attention(weights, ["a", "b", "c", "d"])
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert len(texts) == 10  # the lower triangle only: a masked cell is not "0.00"
    assert texts[0] == "1.00"
    masked = weights.log()  # -inf exactly where masked
    fig2 = viz.plot_attention(masked, ["a", "b", "c", "d"], kind="masked")
    assert [t.get_text() for t in fig2.axes[0].texts].count("-inf") == 6
    import matplotlib.pyplot as plt

    plt.close(fig)
    plt.close(fig2)


def test_masked_cells_are_grey_not_the_colour_of_zero() -> None:
    """Render a 4x4 weight matrix and sample the pixels of a masked and a zero-weight cell."""
    import matplotlib.pyplot as plt

    weights = torch.tensor([[1.0, 0, 0, 0], [0.0, 1, 0, 0], [0.5, 0.5, 0, 0], [0.0, 0.2, 0.3, 0.5]])
    fig = viz.plot_attention(weights, list("abcd"))
    ax = fig.axes[0]
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3] / 255.0  # (H, W, 3)
    height = pixels.shape[0]

    def cell_colour(row: int, col: int) -> np.ndarray:
        # the cell's lower-right quarter: clear of the number written in its centre
        x, y = ax.transData.transform((col + 0.3, row + 0.3))
        r, c = int(height - y), int(x)
        return pixels[r - 4:r + 4, c - 4:c + 4].reshape(-1, 3).mean(0)

    masked, zero = cell_colour(0, 3), cell_colour(3, 0)  # above vs on/below the diagonal
    plt.close(fig)
    assert masked.mean() > 0.6 and np.ptp(masked) < 0.08  # light grey (hatch lines included)
    assert zero.mean() < 0.35  # viridis at 0: dark purple
    assert np.abs(masked - zero).sum() > 0.5


def test_256_tokens_stay_readable(tmp_path: Path) -> None:
    trace, tokens = _trace(256, n_layer=1)
    weights = trace.get("attn_weights", 0)[0]  # (nh, T, T)
    fig = viz.plot_attention(weights[0], tokens)
    ax = fig.axes[0]
    assert not ax.texts  # no numbers in a 256 x 256 matrix
    assert 4 <= len(ax.get_xticklabels()) <= figures.MAX_TICKS
    assert 4 <= len(ax.get_yticklabels()) <= figures.MAX_TICKS
    assert ax.get_xticklabels()[1].get_text().startswith(str(ax.get_xticks()[1]))  # "8 w17"
    # typical weights are ~1/256: the colour scale follows them instead of 0..1
    assert ax.images[0].norm.vmax < 0.5
    (png,) = viz.save_figure(fig, tmp_path / "weights256")
    w, h = _png_size(png)
    cap = figures.MAX_INCHES * figures.DPI * 1.15  # bbox_inches="tight" may add a little
    assert 1000 <= w <= cap and 1000 <= h <= cap, (w, h)

    grid = weights[None]  # (1, nh, T, T)
    (png,) = viz.save_figure(viz.plot_grid(grid, tokens), tmp_path / "grid256")
    w, h = _png_size(png)
    assert w <= cap and h <= cap, (w, h)
    (png,) = viz.save_figure(viz.plot_row(weights[0, 200], tokens, 200), tmp_path / "row256")
    w, h = _png_size(png)
    assert w <= cap and h <= 600, (w, h)
    (png,) = viz.save_figure(viz.plot_qkv(*(trace.get(n, 0)[0, 0] for n in "qkv"), tokens),
                             tmp_path / "qkv256")
    assert max(_png_size(png)) <= cap


def test_labels_and_errors() -> None:
    assert viz.token_label("a\nb") == "a\\nb"
    assert viz.token_label(" ") == "␣" and viz.token_label(" World") == " World"
    assert viz.token_label("$x$") == r"\$x\$"
    assert viz.token_label("x" * 40) == "x" * 11 + "…"
    with pytest.raises(ValueError, match="2-d matrix"):
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        try:
            viz.heatmap(ax, torch.zeros(2, 3, 3))
        finally:
            plt.close(fig)
    with pytest.raises(ValueError, match="query 9 out of range for 4 tokens"):
        viz.plot_row(torch.ones(4) / 4, list("abcd"), 9)
    with pytest.raises(ValueError, match=r"\['jpg'\] not supported; use png, svg, pdf"):
        viz.save_figure(viz.plot_loss([]), "x", ("jpg",))
    with pytest.raises(ValueError, match=r"\['jpg'\] not supported"):  # not a quiet x.png
        viz.save_figure(viz.plot_loss([]), "x.jpg")


def test_the_suffix_of_the_path_picks_the_format(tmp_path: Path) -> None:
    for name in ("loss.pdf", "loss.svg", "loss.png", "loss"):
        (path,) = viz.save_figure(viz.plot_loss([{"step": 1, "loss": 2.0}]), tmp_path / name)
        assert path.name == (name if "." in name else "loss.png")
        assert path.read_bytes()[:4] == {".pdf": b"%PDF", ".svg": b"<?xm",
                                         ".png": b"\x89PNG"}[path.suffix]
    # a dot that names no format is part of the name: one file per head, not one for all
    heads = [viz.save_figure(viz.plot_loss([]), tmp_path / f"copy_0.{h}", ("png", "svg"))
             for h in range(3)]
    assert [[p.name for p in files] for files in heads] == [
        [f"copy_0.{h}.png", f"copy_0.{h}.svg"] for h in range(3)]
    assert all(p.is_file() for files in heads for p in files)


def test_matplotlib_is_imported_lazily() -> None:
    code = "import sys, attnlab.viz.figures; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_control_characters_are_labelled_by_their_codes(tmp_path: Path) -> None:
    """A byte-level BPE's tokens include ESC, NUL and the like: drawn as they are, each was a
    missing-glyph box and a matplotlib warning (`attnlab lens` printed four on a random
    Llama), and an invisible chip in the viewer."""
    from attnlab.tokenizers import HFTokenizer
    from attnlab.viz.heads import plot_lens

    assert viz.token_label("\x1b[0m") == "<1b>[0m" and viz.token_label("a\x85") == "a<U+0085>"
    tokens = ["\x1b", "\x00", "a"]
    fig = plot_lens(torch.rand(2, 3), [["\x05", "b", "\x7f"], ["c", "\x1c", "d"]], tokens)
    viz.save_figure(fig, tmp_path / "lens")  # warnings are errors: no missing glyph
    pytest.importorskip("tokenizers")
    tok = HFTokenizer.train("a \x1b[0m b \x1b[1m\n" * 50, 300)
    assert tok.pieces(tok.encode("\x1b")) == ["<1b>"]


def test_lens_and_patching_figures_of_a_long_text_stay_within_the_cap() -> None:
    """plot_lens gave 0.6 in per position: a 1200-token logit lens was a 721-inch,
    72,120-pixel-wide PNG that took 16 s to save; plot_patching grew 0.45 in a position."""
    from attnlab.viz.heads import plot_lens, plot_patching

    T = 600
    tokens = [f"w{i}" for i in range(T)]
    fig = plot_lens(torch.rand(3, T), [tokens] * 3, tokens)
    assert fig.get_size_inches()[0] <= figures.MAX_INCHES
    assert not fig.axes[0].texts  # no token written into a cell this narrow
    assert len(fig.axes[0].get_xticklabels()) <= figures.MAX_TICKS
    fig = plot_patching(torch.rand(2, 4), torch.rand(2, T), tokens)
    assert fig.get_size_inches()[0] <= figures.MAX_INCHES
    blocks = plot_patching(torch.rand(2, 4), torch.rand(2, T), tokens, attn_out=torch.rand(2, T),
                           mlp_out=torch.rand(2, T) * 3)  # one scale for all four grids: 3
    titles = [ax.get_title() for ax in blocks.axes]
    assert "attention output (one position)" in titles and "MLP output (one position)" in titles
    assert blocks.get_size_inches()[0] <= figures.MAX_INCHES
    assert {ax.images[0].norm.vmax for ax in blocks.axes if ax.images} == {
        float(max(1.0, blocks.axes[3].images[0].get_array().max()))}
    short = plot_lens(torch.rand(3, 5), [tokens[:5]] * 3, tokens[:5])
    assert len(short.axes[0].texts) == 15  # short texts keep their tokens in the cells


def test_patching_figure_draws_each_heads_inputs_on_one_scale() -> None:
    """inputs (qkv=True's grids) go under the head outputs, each titled, keys and values of a
    grouped-query model over its key-value heads, all on the one colour scale."""
    from attnlab.viz.heads import plot_patching

    tokens = [f"w{i}" for i in range(6)]
    inputs = {"q": torch.rand(3, 4), "k": torch.rand(3, 2), "v": torch.rand(3, 2) * 2,
              "attn_weights": torch.rand(3, 4)}
    fig = plot_patching(torch.rand(3, 4), torch.rand(3, 6), tokens, inputs=inputs)
    titled = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    for title, grid in [("queries (every position)", inputs["q"]),
                        ("keys of key-value heads (every position)", inputs["k"]),
                        ("values of key-value heads (every position)", inputs["v"]),
                        ("attention weights (every position)", inputs["attn_weights"])]:
        np.testing.assert_array_equal(titled[title].images[0].get_array(), grid.numpy())
    assert {ax.images[0].norm.vmax for ax in fig.axes if ax.images} == {
        float(max(1.0, inputs["v"].max()))}
    square = plot_patching(torch.rand(3, 4), torch.rand(3, 6), tokens,
                           inputs={"k": torch.rand(3, 4)})  # every head its own keys
    assert "keys (every position)" in [ax.get_title() for ax in square.axes]
    senders = torch.rand(3, 4) * 1.5
    senders[2] = float("nan")  # path patching: no path from the last receiver's layer
    paths = plot_patching(torch.rand(3, 4), torch.rand(3, 6), tokens,
                          inputs={"paths to 2.1 via q": senders})
    ax = next(ax for ax in paths.axes if ax.get_title() == "paths to 2.1 via q (every position)")
    assert _hatched(ax).tolist() == [[False] * 4, [False] * 4, [True] * 4]
    assert ax.images[0].norm.vmax == pytest.approx(max(1.0, float(senders[:2].max())))


def _hatched(ax: object) -> np.ndarray:
    """(T, S) True where a drawn heatmap hides its cell (drawn hatched grey)."""
    return np.ma.getmaskarray(ax.images[0].get_array())  # type: ignore[attr-defined]


def grid_panel(fig: object, layer: int, head: int, heads: int) -> np.ma.MaskedArray:
    """The drawn cells of a `plot_grid` figure's panel at row `layer`, column `head`: its
    one Axes holds an image per head, layer by layer."""
    return fig.axes[0].images[layer * heads + head].get_array()  # type: ignore[attr-defined]


def test_a_window_and_padding_are_hatched_in_every_weight_figure() -> None:
    """Keys outside a sliding window and pad keys of a left-padded row were drawn as cells of
    weight 0, though the model never let the query see them: only the future was hatched."""
    import matplotlib.pyplot as plt

    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", block_size=16, sliding_window=3,
                                    window_layers=[1])).eval()
    idx = torch.randint(0, 65, (2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0  # row 1: three left pads
    trace = Trace(names=["attn_scores", "masked_scores", "attn_weights"]).run(model, idx, mask)
    tokens = [f"w{int(i)}" for i in idx[1]]
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    window = causal & ~torch.ones(10, 10, dtype=torch.bool).tril(-3)  # keys i-2..i
    pad = mask[1].bool()  # (S,)
    may = [trace.may_attend(la, 1) for la in range(2)]  # (T, S) each
    assert torch.equal(may[0], causal & pad) and torch.equal(may[1], window & pad)
    weights = torch.stack([trace.get("attn_weights", la)[1] for la in range(2)])  # (L, nh, T, S)
    scores = trace.get("attn_scores", 1)[1, 0]  # (T, S)
    masked_scores = trace.get("masked_scores", 1)[1, 0]  # (T, S)
    figures = []

    fig = viz.plot_attention(weights[1, 0], tokens, may_attend=may[1])
    assert (_hatched(fig.axes[0]) == (~may[1]).numpy()).all()
    assert sum(t.get_text() == "0.00" for t in fig.axes[0].texts) == 0  # none masked as 0
    fig = viz.plot_attention(masked_scores, tokens, kind="masked", may_attend=may[1],
                             into=fig)
    assert (_hatched(fig.axes[0]) == (~may[1]).numpy()).all()
    figures.append(fig)
    steps = viz.plot_attention_steps(scores, masked_scores, weights[1, 0], tokens)
    raw, masked, softmax = (ax for ax in steps.axes if ax.images)
    assert not _hatched(raw).any()  # raw scores exist for every cell
    assert (_hatched(masked) == (~may[1]).numpy()).all()
    assert (_hatched(softmax) == (~may[1]).numpy()).all()  # from the masked scores' -inf
    grid = viz.plot_grid(weights, tokens, may_attend=torch.stack(may))
    for i in range(2):
        for j in range(2):
            hatched = np.ma.getmaskarray(grid_panel(grid, i, j, 2))
            assert (hatched == (~may[i]).numpy()).all(), (i, j)
    panels = viz.plot_panels(list(weights[:, 0]), [tokens] * 2, ["0", "1"], may_attend=may)
    for i in range(2):
        assert (_hatched(panels.axes[i]) == (~may[i]).numpy()).all(), i
    figures += [steps, grid, panels]

    # without a mask: the causal future, as for a plain causal model
    plain = viz.plot_attention(weights[1, 0], tokens)
    plain_grid = viz.plot_grid(weights, tokens)
    assert (_hatched(plain.axes[0]) == (~causal).numpy()).all()
    for i, j in [(0, 0), (1, 1)]:
        assert (np.ma.getmaskarray(grid_panel(plain_grid, i, j, 2)) == (~causal).numpy()
                ).all()
    figures += [plain, plain_grid]
    with pytest.raises(ValueError, match=r"may_attend of shape \(9, 10\) for a \(10, 10\)"):
        viz.plot_attention(weights[1, 0], tokens, may_attend=may[1][1:])
    with pytest.raises(ValueError, match=r"for 2 layers of \(10, 10\) weights"):
        viz.plot_grid(weights, tokens, may_attend=torch.stack(may * 2))
    for fig in figures:
        plt.close(fig)


def test_weight_vmax_ignores_masked_cells() -> None:
    """A row of 95 left pads: its real weights are 15 of the 5050 causal cells, so the 99.5th
    percentile of the causal cells was a pad's 0 and the scale fell to 2/S (everything bright)."""
    import matplotlib.pyplot as plt

    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", block_size=128)).eval()
    idx = torch.randint(0, 65, (1, 100), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(1, 100, dtype=torch.long)
    mask[0, 95:] = 1  # five tokens after 95 pads
    trace = Trace(names=["attn_weights"]).run(model, idx, mask)
    weights, may = trace.get("attn_weights", 0)[0, 0], trace.may_attend(0)  # (T, S) each
    top = weights[may]
    expected = float(np.quantile(top.numpy(), 0.995))
    assert viz.weight_vmax(weights, may) == pytest.approx(expected) and expected > 0.3
    assert viz.weight_vmax(weights[None], may) == pytest.approx(expected)  # broadcast
    fig = viz.plot_attention(weights, [f"w{i}" for i in range(100)], may_attend=may)
    assert fig.axes[0].images[0].norm.vmax == pytest.approx(expected)
    plt.close(fig)
    assert viz.weight_vmax(torch.zeros(20, 20), torch.zeros(20, 20, dtype=torch.bool)) == 1.0
    with pytest.raises(ValueError, match=r"does not broadcast to weights of shape \(100, 100\)"):
        viz.weight_vmax(weights, may[:5])


def _bands(ax: object) -> list[tuple[float, float]]:
    """The (left, right) x of each hatched band of a row figure."""
    return sorted((p.get_x(), p.get_x() + p.get_width()) for p in ax.patches  # type: ignore[attr-defined]
                  if p.get_gid() == "masked")


def test_a_rows_keys_outside_its_window_and_pads_are_hatched() -> None:
    """plot_row hatched only the later keys: a windowed query's earlier keys and a padded
    row's pad keys were bars of height 0 with "0.00" over them."""
    import matplotlib.pyplot as plt

    row = torch.tensor([0.0, 0.0, 0.0, 0.1, 0.2, 0.0, 0.3, 0.4, 0.0, 0.0])  # (S,)
    tokens = [f"w{i}" for i in range(10)]
    pad = torch.arange(10) >= 3  # three left pads
    window = (torch.arange(10) > 7 - 3) & (torch.arange(10) <= 7)  # query 7, keys 5..7
    fig = viz.plot_row(row, tokens, 7, may_attend=pad & window)
    ax = fig.axes[0]
    assert _bands(ax) == [(-0.5, 4.5), (7.5, 9.5)]  # pads and keys 3..4 (window), future
    assert [t.get_text() for t in ax.texts] == ["0.00", "0.30", "0.40"]  # keys 5, 6, 7
    assert "masked" in ax.get_legend().get_texts()[0].get_text()
    # refilled with a row the window does not cut: only the future and the pads are left
    assert viz.plot_row(row, tokens, 7, may_attend=pad, into=fig) is fig
    assert _bands(ax) == [(-0.5, 2.5), (7.5, 9.5)]
    assert [t.get_text() for t in ax.texts] == ["0.10", "0.20", "0.00", "0.30", "0.40"]
    plain = viz.plot_row(row, tokens, 7)  # no mask: the future, as before
    assert _bands(plain.axes[0]) == [(7.5, 9.5)]
    assert plain.axes[0].get_legend().get_texts()[0].get_text() == "future: weight exactly 0"
    last = viz.plot_row(row, tokens, 9)  # the last query of a causal row: nothing hatched
    assert _bands(last.axes[0]) == [] and last.axes[0].get_legend() is None
    with pytest.raises(ValueError, match=r"may_attend of shape \(9,\) for a row of 10 keys"):
        viz.plot_row(row, tokens, 7, may_attend=pad[1:])
    for f in (fig, plain, last):
        plt.close(f)


def test_head_summaries_figure_has_a_panel_and_a_colorbar_per_summary() -> None:
    from attnlab.viz import plot_head_summaries

    means = {"attn_entropy": torch.rand(3, 4) * 2, "attn_sink": torch.rand(3, 4)}
    fig = plot_head_summaries(means, {"attn_entropy": "entropy (nats)"}, layers=[2, 5, 7],
                              heads=[0, 1, 2, 3])
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in panels] == ["entropy (nats)", "attn_sink"]
    assert len(fig.axes) == 4  # two panels, two colorbars: each on its own scale
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["2", "5", "7"]
    assert panels[1].images[0].norm.vmax == 1.0  # a weight: on [0, 1]


def test_patching_figure_counts_each_input_grids_own_heads() -> None:
    """An input grid's columns are its own heads: the keys of a grouped-query model's 2
    key-value heads are labelled 0 1 beside its 4 query heads' 0 1 2 3."""
    from attnlab.viz.heads import plot_patching

    tokens = [f"w{i}" for i in range(6)]
    fig = plot_patching(torch.rand(3, 4), torch.rand(3, 6), tokens,
                        inputs={"q": torch.rand(3, 4), "k": torch.rand(3, 2)})
    titled = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}

    def columns(title: str) -> list[str]:
        return [label.get_text() for label in titled[title].get_xticklabels()]

    assert columns("keys of key-value heads (every position)") == ["0", "1"]
    assert columns("queries (every position)") == ["0", "1", "2", "3"]
    assert columns("head outputs (every position)") == ["0", "1", "2", "3"]


def test_steps_title_names_a_soft_cap() -> None:
    """A capped model's weights are softmax(cap * tanh(masked * scale / cap)), not
    softmax(masked * scale): the third panel's title said the latter for Gemma 2."""
    scores = torch.randn(4, 4)
    masked = scores.masked_fill(torch.ones(4, 4).triu(1).bool(), float("-inf"))
    weights = torch.softmax(masked, -1)
    titles = [ax.get_title() for ax in viz.plot_attention_steps(
        scores, masked, weights, list("abcd"), scale=0.25, softcap=50.0).axes if ax.images]
    assert titles[2] == "softmax(50·tanh(masked × 0.25 / 50))"
    plain = viz.plot_attention_steps(scores, masked, weights, list("abcd"), scale=0.25)
    assert [ax.get_title() for ax in plain.axes if ax.images][2] == "softmax(masked × 0.25)"


def test_expert_figure_ends_its_scale_at_1_or_at_a_scaled_routers_largest_weight() -> None:
    """Softmax routing's weights sit in [0, 1]; DeepSeek-V3's routed_scaling takes them past
    1, where a scale ending at 1 would draw every weight above it alike."""
    import matplotlib.pyplot as plt

    tokens = ["a", "b"]
    plain = [torch.tensor([[0.7, 0.3, 0.0], [0.0, 0.6, 0.4]])]
    scaled = [2.5 * plain[0], torch.tensor([[0.0, 2.0, 0.5], [1.0, 0.0, 1.5]])]
    for weights, top in ((plain, 1.0), (scaled, 2.0)):
        fig = viz.plot_experts(weights, tokens, list(range(len(weights))))
        limits = {image.get_clim() for ax in fig.axes for image in ax.images}
        plt.close(fig)
        assert limits == {(0.0, top)}
