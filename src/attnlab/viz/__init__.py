"""Figures of attention and of interventions, from plain tensors.

`figures.py` draws attention (heatmaps with token labels, one query's row, the loss
curve), `grid.py` the layer x head grid (every head in one image), `heads.py` draws
interventions (detector scores, per-head summaries, patching effects, the logit lens),
`core.py` holds what they share (the lazy matplotlib import, tick labels, `heatmap`,
colorbars), `visible.py` the cells a figure shows and the weights' colour scale over them,
and `save.py` writes a figure as PNG / SVG / PDF.
Nothing here knows the model: the callers index a `Trace` and pass tensors.
"""

from .core import heatmap, to_list, token_label
from .figures import (
    plot_attention,
    plot_attention_steps,
    plot_embeddings,
    plot_loss,
    plot_matrices,
    plot_panels,
    plot_qkv,
    plot_row,
)
from .grid import plot_grid
from .heads import (
    plot_experts,
    plot_head_scores,
    plot_head_summaries,
    plot_lens,
    plot_patching,
)
from .save import save_figure
from .visible import weight_vmax

__all__ = [
    "heatmap",
    "plot_attention",
    "plot_attention_steps",
    "plot_embeddings",
    "plot_experts",
    "plot_grid",
    "plot_head_scores",
    "plot_head_summaries",
    "plot_lens",
    "plot_loss",
    "plot_matrices",
    "plot_panels",
    "plot_patching",
    "plot_qkv",
    "plot_row",
    "save_figure",
    "to_list",
    "token_label",
    "weight_vmax",
]
