"""Per-head summaries of attention weights, reduced block by block: never a (T, S) matrix.

This module owns the summary names (`SUMMARY_NAMES`), what each one means, and the reduction
of one block of attention weights into them (`Summaries.add`). The blocks come from
attention's traced path (`traced_attention.py`), which computes a block of query rows'
scores and softmax, hands the weights here and discards them; this module never computes a
softmax itself. Shape vocabulary as in `attention.py`; w_ij is the weight query i gives key
j, and key indices count cached keys too:

    attn_entropy   (B, nh, T)  -sum_j w_ij log w_ij over the keys with w_ij > 0, in nats
    attn_sink      (B, nh, T)  w_ij at the row's first real key (the first 1 of attention_mask)
    attn_received  (B, nh, S)  sum_i w_ij over the query rows: the weight key j receives
    attn_distance  (B, nh, T)  sum_j w_ij (i - j), i the query's own key index (cached + row)
    attn_max       (B, nh, T)  max_j w_ij
    attn_learned_sink (B, nh, T)  1 - sum_j w_ij: the weight the head's learned sink takes
                   (a model with attn_sinks only, gpt-oss's; never a GPU kernel's)

In cross-attention (`Mask.cross`) the queries are no keys: every query row counts and
attn_distance is refused. A pad query (its own column of attention_mask is 0) counts as a
row with nothing to attend to: a left pad's row has all weights 0 already (`attend` zeroes
them), a right pad's row is read as 0 here. So a pad row's entropy, sink, distance and max
are 0 and it adds nothing to attn_received: the rule `interp/heads.py` follows too, where
such rows are left out of a mean. The reductions
run in float32 (float64 for a float64 model) whatever the model's dtype, on blocks of at most
`TILE_BYTES` per tensor, so memory is O(nh x (T + S)) per layer plus one tile.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .runtime import wide

#: The summary names, in the order a trace records them (after attn_weights).
SUMMARY_NAMES = ("attn_entropy", "attn_sink", "attn_received", "attn_distance", "attn_max")
#: The summary of a model with learned attention sinks alone (`GPTConfig.attn_sinks`), which
#: the GPU summary kernels never see (a model with sinks takes the explicit path).
LEARNED_SINK = "attn_learned_sink"

#: Bytes of one float32 tile of weights (B, nh, rows, keys) per device type: the reductions
#: hold two such temporaries, the traced path's streamed blocks a few more. A CPU tile stays
#: in its cache (docs/performance.md#summary-tiles); a GPU one is large enough that each
#: kernel fills the device. Device types not named take "default".
TILE_BYTES: dict[str, int] = {"cpu": 4 << 20, "cuda": 1 << 30, "default": 64 << 20}


def tile_elements(device: torch.device) -> int:
    """Float32 elements in one tile on `device` (`TILE_BYTES`)."""
    return max(1, TILE_BYTES.get(device.type, TILE_BYTES["default"]) // 4)


class Summaries:
    """The wanted summaries of one layer's attention, filled block by block (`add`).

    names: a subset of `SUMMARY_NAMES`. shape: (B, nh, T, S) of the weights summarised.
    padding: (B, S) bool, True for real tokens (`Mask.padding`); None: no padding.
    cross: cross-attention (`Mask.cross`): the queries are not the last T of the S keys, so
    none is a pad key and none has a distance (attn_distance is refused).
    `values` holds the results, zero until their blocks are added.
    """

    def __init__(self, names: list[str], shape: tuple[int, int, int, int],
                 padding: Tensor | None, *, dtype: torch.dtype,
                 device: torch.device, cross: bool = False) -> None:
        unknown = sorted(set(names) - {*SUMMARY_NAMES, LEARNED_SINK})
        if unknown:
            raise ValueError(f"unknown summaries {unknown}; known: "
                             f"{[*SUMMARY_NAMES, LEARNED_SINK]}")
        if cross and "attn_distance" in names:
            raise ValueError(
                "attn_distance has no meaning in cross-attention (its queries come from "
                "another sequence, not among the keys); trace the other summaries, e.g. "
                f"names={[n for n in SUMMARY_NAMES if n != 'attn_distance']}")
        B, nh, T, S = shape
        if padding is not None and tuple(padding.shape) != (B, S):
            raise ValueError(f"padding of shape {tuple(padding.shape)} for weights of shape "
                             f"{shape}; pass the (B, S) = ({B}, {S}) mask over every key")
        self.shape, self.dtype, self.device = shape, wide(dtype), device
        # self-attention: queries are the last T of S keys, row r is key index offset + r
        self.offset = 0 if cross else S - T
        self.first_keys = torch.zeros(B, dtype=torch.long, device=device)  # (B,)
        self.pad_queries: Tensor | None = None  # (B, 1, T, 1) True for a pad's query
        if padding is not None:
            padding = padding.to(device=device, dtype=torch.bool)
            self.first_keys = padding.int().argmax(dim=-1)  # (B,) the first 1: the first max
        if padding is not None and not cross:
            pads = ~padding[:, self.offset:]  # (B, T)
            self.pad_queries = pads[:, None, :, None] if bool(pads.any()) else None
        self._distances: tuple[tuple[int, int, int, int], Tensor] | None = None
        self.values: dict[str, Tensor] = {
            name: torch.zeros((B, nh, S if name == "attn_received" else T), dtype=self.dtype,
                              device=device)
            for name in (*SUMMARY_NAMES, LEARNED_SINK) if name in names
        }

    def add(self, weights: Tensor, i0: int, k0: int, h0: int = 0) -> None:
        """Reduce weights (B, heads, rows, keys): heads h0.., queries i0.. over keys k0..;
        every key outside the block has weight 0 for these rows. A large block is reduced
        in tiles of `TILE_BYTES`."""
        weights = weights.detach()  # summaries are read, never differentiated
        B, heads, rows, keys = weights.shape
        step = max(1, tile_elements(weights.device) // (B * heads * keys))
        scratch = weights.new_empty((B, heads, min(step, rows), keys), dtype=self.dtype)
        for a0 in range(0, rows, step):
            a1 = min(a0 + step, rows)
            tile = weights[:, :, a0:a1].to(self.dtype)  # (B, heads, r, keys)
            if self.pad_queries is not None:  # out of place: the weights may be a trace's
                tile = tile.masked_fill(self.pad_queries[:, :, i0 + a0:i0 + a1], 0.0)
            self._add_tile(tile, (h0, i0 + a0, k0), scratch[:, :, :a1 - a0])

    def _add_tile(self, w: Tensor, at: tuple[int, int, int], scratch: Tensor) -> None:
        """w (B, heads, r, keys) float weights of heads h0.., queries i0.. over keys k0..
        (`at`); scratch: a tensor of w's shape and dtype for the products."""
        h0, i0, k0 = at
        heads, r, keys = w.shape[1:]
        h, rows, cols = slice(h0, h0 + heads), slice(i0, i0 + r), slice(k0, k0 + keys)
        out = self.values
        if "attn_entropy" in out:
            # -w log w, with log(0) read as log(tiny): 0 for w = 0 (only w > 0 count), and
            # vectorised, where special.entr is not (docs/performance.md#summary-tiles)
            logs = torch.clamp_min(w, torch.finfo(w.dtype).tiny, out=scratch).log_()
            out["attn_entropy"][:, h, rows] = logs.mul_(w).sum(-1).neg_()  # (B, heads, r)
        if "attn_sink" in out:
            col = self.first_keys - k0  # (B,) the first real key's column in this block
            inside = (col >= 0) & (col < keys)  # (B,)
            index = col.clamp(0, keys - 1)[:, None, None, None].expand(*w.shape[:3], 1)
            sink = w.gather(-1, index)[..., 0]  # (B, heads, r)
            out["attn_sink"][:, h, rows] = sink * inside[:, None, None]
        if "attn_received" in out:
            out["attn_received"][:, h, cols] += w.sum(-2)  # (B, heads, keys)
        if "attn_distance" in out:
            distance = self._distance(i0 + self.offset, r, k0, keys)  # (r, keys)
            out["attn_distance"][:, h, rows] = torch.mul(w, distance, out=scratch).sum(-1)
        if "attn_max" in out:
            out["attn_max"][:, h, rows] = w.amax(-1)  # (B, heads, r)
        if LEARNED_SINK in out:  # a row with no weight at all (a pad's) gives the sink 0 too
            kept = w.sum(-1)  # (B, heads, r)
            out[LEARNED_SINK][:, h, rows] = torch.where(kept > 0, 1 - kept, 0.0)

    def _distance(self, i0: int, r: int, k0: int, keys: int) -> Tensor:
        """(r, keys) i - j for query key indices i0.. and keys k0..: exact integers in the
        summaries' dtype (below 2**24), so the products carry no cancellation. The last one
        is kept: the tiles of one block of rows share it across their heads."""
        at = (i0, r, k0, keys)
        if self._distances is None or self._distances[0] != at:
            query = torch.arange(i0, i0 + r, dtype=self.dtype, device=self.device)  # (r,)
            key = torch.arange(k0, k0 + keys, dtype=self.dtype, device=self.device)  # (keys,)
            self._distances = at, query[:, None] - key[None, :]  # (r, keys)
        return self._distances[1]
