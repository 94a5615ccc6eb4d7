"""The validation of `GPTConfig`'s latent-attention fields (kv_latent, q_latent, rope_head_dim,
v_head_dim: DeepSeek-V2 / V3's multi-head latent attention, `latent.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import GPTConfig


def check_latent(c: GPTConfig) -> None:
    """ValueError naming the first latent-attention field of `c` that is out of range or
    contradicts another switch, and the fix."""
    for name in ("kv_latent", "q_latent", "v_head_dim"):
        value = getattr(c, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"GPTConfig.{name}={value!r} must be a positive integer or None")
    if c.kv_latent is None:
        return
    rd, hs = c.rope_head_dim, c.head_size
    if isinstance(rd, bool) or not isinstance(rd, int) or rd < 2 or rd % 2 or rd >= hs:
        raise ValueError(
            f"rope_head_dim={rd!r} must be an even integer >= 2 below head_size {hs} (latent "
            "attention turns the last rope_head_dim of each head's q and k dims: DeepSeek-V3 "
            "64 of 192; set head_dim to the dims without RoPE plus these)")
    if (c.v_head_dim or hs) > hs:
        raise ValueError(
            f"v_head_dim={c.v_head_dim} is wider than head_size {hs}: latent attention keeps "
            "v in k's cache, padded to head_size; use v_head_dim <= head_dim")
    if c.n_kv_heads != c.n_head:
        raise ValueError(
            f"n_kv_head={c.n_kv_head} with kv_latent={c.kv_latent}: latent attention projects "
            f"k and v for every one of the n_head={c.n_head} heads; set n_kv_head=None")
    clashes = [name for name, on in (
        ("qk_norm", c.qk_norm), ("attn_sinks", c.attn_sinks), ("qk_l2_norm", c.qk_l2_norm),
        ("nope_temperature", bool(c.nope_temperature)), ("qkv_clip", c.qkv_clip is not None),
        ("attn_out_proj=False", not c.attn_out_proj)) if on]
    if clashes:
        raise ValueError(f"kv_latent={c.kv_latent} with {', '.join(clashes)}: latent "
                         "attention (DeepSeek-V2 / V3's) has none of these; drop them")
