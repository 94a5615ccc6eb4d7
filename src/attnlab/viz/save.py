"""`save_figure`: write a figure as PNG / SVG / PDF, and write a refilled figure fast.

A PNG is the figure drawn once on its canvas and cropped to every artist with 0.1 in
around (what savefig(bbox_inches="tight") saves, without the second draw it spends to
measure). `attnlab inspect` refills one figure head after head (`plot_attention(...,
into=fig)`); most of a draw is text layout of the tick labels, which a refill leaves as
they were. So each PNG save keeps a copy of the canvas with only the *static* parts drawn
(figure and axes backgrounds, the x and y axes: ticks, tick labels, axis labels), and
the next save of the same figure pastes that copy back and draws only the rest (images,
cell values, titles, spines, colorbars, bars) on top: matplotlib's blitting, as in its
animations. An axis counts as static while its key (position, limits, tick places and
labels, label) is what it was when the copy was made; one that changed (a colorbar's or
a bar chart's scale) is drawn with the rest from then on, and the copy made again. The
crop box is measured the same way: the static axes' extents once, the rest each time.

Pasting and drawing gives the pixels a full draw gives (tests/viz/test_viz_core.py checks a
refilled figure against a new one, pixel for pixel). SVGs and PDFs are drawn whole by savefig.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .core import pyplot

if TYPE_CHECKING:
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

PAD_INCHES = 0.1  # savefig's pad_inches around the tight box
FORMATS = ("png", "svg", "pdf")


def save_figure(fig: Figure, path: str | Path, formats: Sequence[str] | None = None, *,
                close: bool = True) -> list[Path]:
    """Write `fig` as path.png / path.svg / path.pdf, then close it; close=False keeps it
    open, e.g. to refill it and save the next head (drawn faster). A suffix of `path` that
    names a figure format is replaced (x.svg); any other stays in the name (head_0.1 ->
    head_0.1.png). formats: default the one the suffix of `path` names (x.svg), else png.

    One layout per figure: its layout engine runs at the first save and is then switched
    off, so a refilled figure keeps the layout of its first save.
    """
    plt = pyplot()
    path = Path(path)
    suffix = path.suffix.lower().lstrip(".")
    named = suffix in fig.canvas.get_supported_filetypes()  # x.svg, x.jpg: not head_0.1
    if formats is None:  # "x.jpg" is an error below, not a quiet x.png
        formats = (suffix,) if named else ("png",)
    stem = path.with_suffix("") if named else path
    bad = sorted(set(formats) - set(FORMATS))
    if bad or not formats:
        plt.close(fig)
        raise ValueError(f"figure formats {bad or list(formats)} not supported; use "
                         f"{', '.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        engine = fig.get_layout_engine()
        if engine is not None:
            engine.execute(fig)
            fig.set_layout_engine(None)
        box = _blit(fig).save_png(_named(stem, "png")) if "png" in formats else None
        for fmt in formats:
            target = _named(stem, fmt)
            if fmt != "png":  # drawn whole by savefig
                box = box or fig.get_tightbbox().padded(PAD_INCHES)  # (inches)
                fig.savefig(target, format=fmt, bbox_inches=box)
            written.append(target)
    finally:
        if close:
            plt.close(fig)
    return written


def _named(stem: Path, fmt: str) -> Path:
    return stem.with_name(f"{stem.name}.{fmt}")


def _blit(fig: Figure) -> _Blit:
    state = getattr(fig, "_attnlab_blit", None)
    if state is None:
        state = _Blit(fig)
        fig._attnlab_blit = state  # type: ignore[attr-defined]
    return state


def _axis_key(axis: Axis) -> tuple[Any, ...]:
    """What an axis shows: if this is unchanged, so are its pixels."""
    locs = axis.get_majorticklocs()
    labels = axis.get_majorticklabels()
    style = (labels[0].get_rotation(), labels[0].get_fontsize()) if labels else ()
    return (tuple(axis.axes.get_position().bounds), tuple(axis.get_view_interval()),
            tuple(locs), tuple(axis.get_major_formatter().format_ticks(list(locs))), style,
            axis.label.get_text(), axis.get_visible(), axis.axes.get_visible())


@dataclass(eq=False)
class _Blit:
    """The static copy of one figure's canvas and what it holds."""

    fig: Figure
    background: Any = None  # the canvas region with only the static artists drawn
    static: dict[Axis, tuple[Any, ...]] = field(default_factory=dict)  # axis -> its key
    static_box: list[Any] = field(default_factory=list)  # (display) static extents
    layout: tuple[Any, ...] = ()  # figure size, dpi and axes the copy was made for

    def save_png(self, target: Path) -> Any:
        """Draw (paste the copy and draw the rest, or everything), crop, write; returns the
        crop box in inches."""
        import PIL.Image
        from matplotlib.ticker import FixedLocator
        from matplotlib.transforms import Bbox

        fig = self.fig
        canvas: Any = fig.canvas  # FigureCanvasAgg (core.pyplot chose Agg)
        renderer = canvas.get_renderer()
        axes = fig.axes
        layout = (tuple(fig.get_size_inches()), fig.dpi, tuple(map(id, axes)))
        keys: dict[Axis, tuple[Any, ...]] = {
            axis: _axis_key(axis) for ax in axes for axis in (ax.xaxis, ax.yaxis)}
        fresh = self.background is None or layout != self.layout or any(
            keys[axis] != key for axis, key in self.static.items())
        if fresh:
            # static: the axes with ticks placed by hand (token labels; automatic ticks and
            # colorbars follow the data) that have not changed since the last copy
            bars = {im.colorbar.ax for ax in axes for im in ax.images if im.colorbar}
            self.static = {a: k for a, k in keys.items() if self.static.get(a, k) == k
                           and isinstance(a.get_major_locator(), FixedLocator)
                           and a.axes not in bars}
            self.layout = layout
        dynamic = self._dynamic()
        for artist in dynamic:
            artist.set_animated(True)
        try:
            if fresh:
                canvas.draw()  # the static artists only
                self.background = canvas.copy_from_bbox(fig.bbox)
                self.static_box = [a.get_tightbbox(renderer) for a in self.static]
            else:
                canvas.restore_region(self.background)
            for artist in dynamic:
                artist.draw(renderer)
        finally:
            for artist in dynamic:
                artist.set_animated(False)
        box = self._box(dynamic, renderer)
        x0, y0, x1, y1 = box
        width, height = canvas.get_width_height()
        image = PIL.Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw",
                                     "RGBA", 0, 1).crop((x0, height - y1, x1, height - y0))
        if image.getchannel("A").getextrema()[0] == 255:
            image = image.convert("RGB")  # opaque: no alpha channel to compress
        # zlib level 1: files a little larger than at the default 6, written much faster
        # (docs/performance.md#figures)
        image.save(target, format="png", compress_level=1, dpi=(fig.dpi, fig.dpi))
        return Bbox.from_extents(x0, y0, x1, y1).transformed(fig.dpi_scale_trans.inverted())

    def _dynamic(self) -> list[Any]:
        """Everything drawn on top of the copy, in drawing order."""
        fig = self.fig
        drawn: list[Any] = []
        for ax in sorted(fig.axes, key=lambda a: a.get_zorder()):
            if not ax.get_visible():
                continue
            if ax.xaxis not in self.static and ax.yaxis not in self.static:
                drawn.append(ax)  # all of it
                continue
            children = [a for a in ax.get_children()
                        if a is not ax.patch and a not in self.static and a.get_visible()]
            drawn += sorted(children, key=lambda a: a.get_zorder())
        # the figure's own artists (suptitle, legends, ...): all but its background
        rest = [a for a in fig.get_children()
                if a is not fig.patch and a not in fig.axes and a.get_visible()]
        return drawn + sorted(rest, key=lambda a: a.get_zorder())

    def _box(self, dynamic: list[Any], renderer: Any) -> tuple[int, int, int, int]:
        """The crop box in whole pixels: every artist's extent, padded, within the canvas."""
        boxes = self.static_box + [a.get_tightbbox(renderer) for a in dynamic
                                   if a.get_in_layout()]
        boxes = [b for b in boxes if b is not None and 0 < b.width < math.inf
                 and 0 < b.height < math.inf]
        boxes += [ax.bbox for ax in self.fig.axes if ax.get_visible()]
        pad = PAD_INCHES * self.fig.dpi
        w, h = self.fig.canvas.get_width_height()
        x0 = max(0, math.floor(min(b.x0 for b in boxes) - pad))
        y0 = max(0, math.floor(min(b.y0 for b in boxes) - pad))
        x1 = min(w, math.ceil(max(b.x1 for b in boxes) + pad))
        y1 = min(h, math.ceil(max(b.y1 for b in boxes) + pad))
        return x0, y0, x1, y1
