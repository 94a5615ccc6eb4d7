"""KV caches: where past keys and values live between decode steps.

`KVCache` is the one to use: preallocated (B, nkv, T_max, hs) buffers per layer, written
in place by `update(pos, k, v)`, which returns views of the filled prefix; a decode step
allocates nothing that grows with the context (gpt-fast's `KVCache`). `KVCache.concat` (of
`ConcatLayerKVCache`s) is the textbook version, which concatenates on every step; it is
tested equal to the static one. `LatentLayerCache` is multi-head latent attention's
(`latent.py`): each position's latent and shared RoPE key part rather than each head's k and v.
A cache keeps the padding mask of its columns for the calls that give none (`key_mask`); what
masks and positions mean is `attention.py`'s and `gpt.py`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def _span_end(pos: int, new: int, max_len: int) -> int:
    """The end of a write of `new` positions at `pos` into a cache of `max_len`; ValueError
    where they do not fit."""
    end = pos + new
    if pos < 0 or end > max_len:
        raise ValueError(
            f"cache write at positions {pos}..{end - 1} does not fit max_len={max_len}; "
            "create the cache with a larger max_len (prompt + new tokens)")
    return end


class LayerKVCache:
    """Preallocated key/value buffers for one layer: (B, nkv, T_max, hs) each."""

    def __init__(
        self,
        batch_size: int,
        n_kv_head: int,
        max_len: int,
        head_size: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (batch_size, n_kv_head, max_len, head_size)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (B, nkv, T_max, hs)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (B, nkv, T_max, hs)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def update(self, pos: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write k/v (B, nkv, T, hs) at positions pos..pos+T-1; return views (B, nkv, pos+T, hs)."""
        end = _span_end(pos, k.shape[2], self.max_len)
        if k.shape[:2] != self.k.shape[:2] or k.shape[3] != self.k.shape[3]:
            raise ValueError(
                f"keys of shape {tuple(k.shape)} do not fit cache buffers "
                f"{tuple(self.k.shape)} (B, nkv, T_max, hs); make the cache for this batch "
                "and model: model.new_cache(B, max_len)"
            )
        # narrow + copy_ rather than slice assignment: half the Python overhead, which is
        # most of what a one-token write costs
        self.k.narrow(2, pos, end - pos).copy_(k)
        self.v.narrow(2, pos, end - pos).copy_(v)
        return self.k.narrow(2, 0, end), self.v.narrow(2, 0, end)  # (B, nkv, pos+T, hs)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class ConcatLayerKVCache:
    """The textbook cache: keep k/v tensors and `torch.cat` the new ones on (O(S) copy per
    step)."""

    def __init__(self) -> None:
        self.k: Tensor | None = None  # (B, nkv, S, hs)
        self.v: Tensor | None = None  # (B, nkv, S, hs)

    def update(self, pos: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        length = 0 if self.k is None else self.k.shape[2]
        if pos != length:
            raise ValueError(
                f"a concatenating cache can only append: it holds {length} positions, "
                f"got a write at pos={pos}"
            )
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)  # (B, nkv, S, hs)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)  # (B, nkv, S, hs)
        return self.k, self.v

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)


class LatentLayerCache:
    """Multi-head latent attention's cache for one layer (DeepSeek-V2 / V3's, `latent.py`):
    each position's normed latent and the RoPE-turned key part every head shares, side by
    side in one (B, T_max, latent + rd) buffer, from which attention expands each head's k
    and v or attends in the latent space. (latent + rd) numbers a position where a per-head
    cache holds 2 * nh * hs: DeepSeek-V2-Lite's 576 against 6,144."""

    def __init__(self, batch_size: int, max_len: int, latent_size: int, rope_dims: int, *,
                 dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        self.latent_size = latent_size
        self.kv = torch.zeros(batch_size, max_len, latent_size + rope_dims, dtype=dtype,
                              device=device)  # (B, T_max, latent + rd)

    @property
    def max_len(self) -> int:
        return self.kv.shape[1]

    def write(self, pos: int, latent: Tensor, k_rot: Tensor) -> Tensor:
        """Write latent (B, T, latent) and k_rot (B, T, rd) at positions pos..pos+T-1; return
        the view of every position written (B, pos+T, latent + rd)."""
        end = _span_end(pos, latent.shape[1], self.max_len)
        B, _, width = self.kv.shape
        if (latent.shape[0], latent.shape[2] + k_rot.shape[2]) != (B, width) or (
                latent.shape[2] != self.latent_size):
            raise ValueError(
                f"a latent of shape {tuple(latent.shape)} and RoPE part {tuple(k_rot.shape)} "
                f"do not fit the cache's {tuple(self.kv.shape)} (B, T_max, "
                f"{self.latent_size} + rd); make the cache for this batch and model: "
                "model.new_cache(B, max_len)")
        new = self.kv.narrow(1, pos, end - pos)  # (B, T, latent + rd)
        new.narrow(2, 0, self.latent_size).copy_(latent)
        new.narrow(2, self.latent_size, width - self.latent_size).copy_(k_rot)
        return self.kv.narrow(1, 0, end)  # (B, pos+T, latent + rd)

    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


class KVCache:
    """Per-layer caches plus `seq_len`, the number of positions written so far, and the
    attention mask of those positions once a call gave one.

    Pass it to `GPT.forward(..., kv_cache=cache)`; the model writes at `cache.seq_len` and
    advances it. Memory is exactly 2 * n_layer * B * nkv * T_max * hs * dtype size
    (n_layer * B * T_max * (latent + rd) * dtype size for latent attention's, `nbytes`).
    """

    def __init__(self, layers: Sequence[LayerKVCache | ConcatLayerKVCache | LatentLayerCache]
                 ) -> None:
        self.layers = layers
        self.seq_len = 0
        self.attention_mask: Tensor | None = None  # (B, >= seq_len) once a call gave one

    def __repr__(self) -> str:
        return (f"KVCache({len(self.layers)} layers, seq_len={self.seq_len}, "
                f"max_len={self.max_len}, padded={self.attention_mask is not None})")

    def reset(self) -> None:
        """Empty the cache for a new sequence, keeping its buffers (nothing is freed or zeroed:
        every later call writes the positions it reads)."""
        self.seq_len, self.attention_mask = 0, None
        for layer in self.layers:
            if isinstance(layer, ConcatLayerKVCache):
                layer.k = layer.v = None

    def key_mask(self, attention_mask: Tensor | None, new: int) -> Tensor | None:
        """The mask over a call's keys (cached + `new`), kept for the calls after it: the
        call's own, or, when it gives none after a call that did (a left-padded prefill,
        then decode steps), the kept one with the new columns real. Without it a decode step
        would attend to the prefill's pads."""
        if attention_mask is None and self.attention_mask is not None:
            kept = self.attention_mask[:, :self.seq_len]  # (B, <= seq_len)
            # columns written since without a mask (DecodeStep's) hold tokens, as the new do
            real = kept.new_ones(kept.shape[0], self.seq_len - kept.shape[1] + new)
            attention_mask = torch.cat([kept, real], 1)  # (B, seq_len + new)
        if attention_mask is not None:
            self.attention_mask = attention_mask  # (B, seq_len + new)
        return attention_mask

    @classmethod
    def static(
        cls,
        n_layer: int,
        batch_size: int,
        n_kv_head: int,
        max_len: int,
        head_size: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> KVCache:
        return cls([
            LayerKVCache(batch_size, n_kv_head, max_len, head_size, dtype=dtype, device=device)
            for _ in range(n_layer)
        ])

    @classmethod
    def latent(
        cls,
        n_layer: int,
        batch_size: int,
        max_len: int,
        latent_size: int,
        rope_dims: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> KVCache:
        """Latent attention's cache (`LatentLayerCache` per layer)."""
        return cls([LatentLayerCache(batch_size, max_len, latent_size, rope_dims, dtype=dtype,
                                     device=device) for _ in range(n_layer)])

    @classmethod
    def concat(cls, n_layer: int) -> KVCache:
        return cls([ConcatLayerKVCache() for _ in range(n_layer)])

    @property
    def holds_latents(self) -> bool:
        """Whether it is latent attention's cache (`KVCache.latent`), which nothing else reads."""
        return isinstance(self.layers[0], LatentLayerCache)

    @property
    def max_len(self) -> int | None:
        """Capacity in positions, or None for a growing (concatenating) cache."""
        first = self.layers[0]
        return None if isinstance(first, ConcatLayerKVCache) else first.max_len

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)
