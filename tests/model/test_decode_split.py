"""decode.Affine at several torch threads: the matrix cut into one block per thread."""

from __future__ import annotations

import pytest
import torch

from attnlab.model.decode_parts import Affine, thread_parts
from helpers import split_blocks


def _affine(n_in: int, n_out: int, rows: bool, bias: bool) -> Affine:
    gen = torch.Generator().manual_seed(n_in * n_out)
    w = torch.randn(n_in, n_out, generator=gen)  # (in, out)
    if not rows:
        w = w.t().contiguous().t()  # (in, out) over (out, in) memory
    return Affine(w, torch.randn(n_out, generator=gen) if bias else None)


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The shapes of the blocks each torch.bmm / torch.baddbmm call got, as it is called."""
    calls: list[tuple[int, ...]] = []
    for name in ("bmm", "baddbmm"):
        real = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _f=real, **k: calls.append(
            tuple(a[-1].shape)) or _f(*a, **k))
    return calls


@pytest.mark.parametrize("rows", [True, False], ids=["in-out memory", "out-in memory"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("threads", [2, 3])
def test_blocks_compute_the_product(
    rows: bool, bias: bool, batch: int, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    affine = _affine(12, 18, rows, bias)
    x = torch.randn(batch, 12, generator=torch.Generator().manual_seed(1))  # (B, in)
    exact = x.double() @ affine.weight.double()  # (B, out)
    if bias:
        exact += affine.bias.double()  # type: ignore[union-attr]
    calls = _spy(monkeypatch)
    with split_blocks(threads):
        got = affine(x)  # (B, out)
    # 12 input rows or 18 outputs, in `threads` blocks
    assert calls == [(threads, 12 // threads, 18) if rows else (threads, 12, 18 // threads)]
    assert got.shape == (batch, 18) and got.is_contiguous()
    torch.testing.assert_close(got.double(), exact, atol=1e-5, rtol=1e-5)


def test_blocks_per_thread_need_enough_weights_and_an_even_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = torch.zeros(6, 40)  # 240 weights
    with split_blocks(4, split_min=60):
        assert thread_parts(6, w) == 3  # 4 does not divide 6
        assert thread_parts(7, w) == 1  # a prime side: kept whole
        assert thread_parts(40, w) == 4
    with split_blocks(4, split_min=100):
        assert thread_parts(40, w) == 2  # two blocks of 120 weights, not four of 60
    with split_blocks(4, split_min=241):
        assert thread_parts(40, w) == 1  # too small to share out
    with split_blocks(1):
        assert thread_parts(40, w) == 1  # one thread: torch.mm
    with split_blocks(4):
        assert thread_parts(40, w.double()) == 1  # float32 only
    calls = _spy(monkeypatch)
    with split_blocks(4):
        bf = torch.ones(6, 40, dtype=torch.bfloat16)
        assert Affine(bf, None)(torch.ones(1, 6, dtype=torch.bfloat16)).shape == (1, 40)
        assert calls == []  # bfloat16 products stay whole (only float32 was measured)
        Affine(w, None)(torch.ones(1, 6))
        assert calls == [(3, 2, 40)]
