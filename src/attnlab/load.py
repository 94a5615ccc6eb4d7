"""Open any model directory: an attnlab checkpoint (or a run directory) or a Hugging Face
model directory of a supported family. The one place that knows both kinds exist:
`checkpoint.py` reads attnlab's, `hf` reads Hugging Face's, and every command opens a
directory through `load_checkpoint`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .checkpoint import Checkpoint, load_attnlab_checkpoint
from .hf import load_hf_checkpoint
from .tokenizers import is_hf_dir


def load_checkpoint(
    directory: str | Path, *, map_location: str | torch.device = "cpu",
    dtype: torch.dtype | None = None, force: bool = False,
) -> Checkpoint:
    """Load model (eval mode), tokenizer and meta from a checkpoint directory, or from a
    Hugging Face model directory of a supported family (`attnlab.hf`), on `map_location`,
    in `dtype` (default: float32).

    Both kinds are checked before anything is allocated (names, shapes and dtypes from the
    file headers against the config; then the memory `map_location` has free, which
    `force=True` skips) and read one tensor at a time into the model's own memory."""
    if is_hf_dir(directory):
        return load_hf_checkpoint(directory, map_location=map_location, dtype=dtype,
                                  force=force)
    return load_attnlab_checkpoint(directory, map_location=map_location, dtype=dtype,
                                   force=force)
