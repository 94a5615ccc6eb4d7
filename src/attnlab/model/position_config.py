"""The validation of `GPTConfig`'s position fields (`config.py` calls it from
`__post_init__`): how RoPE turns q and k, its scaling, the layers without it (NoPE) and
their temperature, the QK-norm after it and the windowed layers' own base (`rope.py` computes
what they describe)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .rope import check_rope_scaling

if TYPE_CHECKING:
    from .config import GPTConfig


def check_positions(c: GPTConfig) -> None:
    """ValueError naming the first position field of `c` that is out of range or needs a
    switch that is off, and the fix (GPTConfig's fields say what each is)."""
    rope = c.pos == "rope"
    check_rope_scaling(c.rope_scaling, theta=c.rope_theta,
                       rotary_dims=c.rotary_dims if rope else None)
    # (rope_tables_rounded refines rope_in_float32: idle without it, whatever pos is)
    for name in ("rope_in_float32", "rope_interleaved", "rope_backwards", "qk_l2_norm"):
        if getattr(c, name) and not rope:
            raise ValueError(f"{name}=True says how RoPE turns q and k (or what follows it): "
                             f"it needs pos='rope', not pos={c.pos!r}")
    if c.rope_scaling is not None and not rope:
        raise ValueError(f"rope_scaling={c.rope_scaling} needs pos='rope', not pos={c.pos!r}")
    if c.local_rope_theta is not None and (
            not rope or c.sliding_window is None or not c.local_rope_theta > 0):
        raise ValueError(f"local_rope_theta={c.local_rope_theta} is the RoPE base of the "
                         "sliding-window layers: it needs pos='rope', a sliding_window and a "
                         "value > 0")
    if c.nope_layers is not None:
        bad = [i for i in c.nope_layers if not 0 <= i < c.n_layer]
        if not rope or bad:
            raise ValueError(f"nope_layers={c.nope_layers} names layers without RoPE: it "
                             f"needs pos='rope' and layers within 0..{c.n_layer - 1}")
    if c.qk_norm_after_rope and (not rope or not c.qk_norm or c.qk_norm_whole):
        raise ValueError("qk_norm_after_rope=True moves each head's QK-norm after RoPE: it "
                         "needs pos='rope' and qk_norm=True over each head (qk_norm_whole="
                         "False)")
    if c.qk_l2_norm and c.qk_norm:
        raise ValueError("qk_l2_norm=True norms q and k after RoPE, without a weight: drop "
                         "the other QK-norm (qk_norm=False)")
    scale, floor = c.nope_temperature, c.nope_temperature_floor
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not (
            math.isfinite(scale) and scale >= 0) or (scale and c.nope_layers is None):
        raise ValueError(f"nope_temperature={scale!r} sharpens the NoPE layers' scores: a "
                         "finite number >= 0 (Llama 4's: 0.1) beside nope_layers; 0.0: none")
    if isinstance(floor, bool) or not isinstance(floor, int) or floor < 1:
        raise ValueError(f"nope_temperature_floor={floor!r} must be a positive integer "
                         "(Llama 4's: 8192 positions)")
