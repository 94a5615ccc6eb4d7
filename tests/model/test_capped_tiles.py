"""A soft-capped call's tiles (`traced_attention.tiled_attend`, which `explicit.explicit_attend`
takes on a CPU without autograd once the scores outgrow a tile) give the whole explicit
path's context, through left padding, rows with nothing to attend to, sliding windows,
grouped-query heads and queries that are the last T of S keys (a KV cache), with tiles of
any size."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.model import explicit, summaries
from attnlab.model.attention import attend
from attnlab.model.explicit import _whole
from attnlab.model.masks import build_mask
from attnlab.model.sdpa import expand_kv
from attnlab.model.traced_attention import tiled_attend


def _case(B: int, nh: int, nkv: int, T: int, S: int, lengths: list[int],
          window: int | None, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, nh, T, 8, generator=g) * 2  # wide enough for small caps to bend
    k, v = (torch.randn(B, nkv, S, 8, generator=g) * 2 for _ in range(2))
    attention_mask = torch.zeros(B, S, dtype=torch.long)  # (B, S)
    for b, n in enumerate(lengths):
        attention_mask[b, S - n:] = 1  # left padding
    return q, k, v, build_mask(T, S, attention_mask, window=window)


@settings(max_examples=80, deadline=None)
@given(B=st.integers(1, 3), heads=st.sampled_from([(2, 2), (4, 2), (4, 1)]),
       S=st.integers(1, 40), cached=st.integers(0, 12), data=st.data(),
       window=st.sampled_from([None, 1, 3, 7]), cap=st.sampled_from([0.5, 5.0]),
       tile=st.sampled_from([8, 64, 512, 1 << 20]), seed=st.integers(0, 99))
def test_tiles_are_the_whole_path(B: int, heads: tuple[int, int], S: int, cached: int,
                                  data: st.DataObject, window: int | None, cap: float,
                                  tile: int, seed: int) -> None:
    nh, nkv = heads
    T = max(1, S - cached)
    lengths = data.draw(st.lists(st.integers(1, S), min_size=B, max_size=B))
    q, k, v, mask = _case(B, nh, nkv, T, S, lengths, window, seed)
    may_attend = mask.may_attend
    if may_attend is not None and mask.empty_rows is not None:  # as `attend` lets them through
        may_attend = may_attend | mask.empty_rows
    saved = summaries.TILE_BYTES["cpu"]
    summaries.TILE_BYTES["cpu"] = 4 * tile  # tiles of `tile` elements: many on these sizes
    try:
        with torch.no_grad():
            tiled = tiled_attend(q, expand_kv(k, nh), expand_kv(v, nh), mask, may_attend, 0.3,
                                 cap)  # (B, nh, T, 8)
            whole = _whole(q, k, v, mask, may_attend, 0.3, 0.0, cap)  # (B, nh, T, 8)
    finally:
        summaries.TILE_BYTES["cpu"] = saved
    # each output is a weighted mean of v, summed in another order: its rounding scales with
    # |v| (up to ~8 here), not with the mean, which may lie near 0 (1.5e-6 apart at 0.006)
    torch.testing.assert_close(tiled, whole, atol=1e-6 * float(v.abs().max()), rtol=1e-5)


def test_attend_takes_the_tiles_only_without_autograd_past_one_tile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`attend` with a cap: the tiles where nothing needs a gradient and the scores outgrow
    one tile, the whole path otherwise (autograd on, or scores within a tile), the same
    context either way."""
    taken: list[int] = []
    tiles = explicit.tiled_attend

    def counted(*args: object) -> torch.Tensor:
        taken.append(1)
        return tiles(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(explicit, "tiled_attend", counted)
    q, k, v, mask = _case(2, 4, 2, 24, 24, [24, 9], 5, seed=0)
    with torch.no_grad():
        within = attend(q, k, v, mask, softcap=0.5)  # 2 x 4 x 24 x 24 scores: one tile
        assert not taken
        monkeypatch.setitem(summaries.TILE_BYTES, "cpu", 4 * 512)
        tiled = attend(q, k, v, mask, softcap=0.5)
        assert taken == [1]
    q.requires_grad_(True)
    whole = attend(q, k, v, mask, softcap=0.5)  # autograd: the whole path
    assert taken == [1] and whole.requires_grad
    torch.testing.assert_close(tiled, within, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(tiled, whole.detach(), atol=1e-6, rtol=1e-5)
