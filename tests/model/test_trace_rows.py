"""Trace(rows=...): the weights of chosen query rows equal those rows of the whole trace's, over
random models (GQA, rotary, QK-norm, sliding windows), padding, KV-cache splits and head
filters, with or without summaries and scores; no op makes a (B, nh, T, S) tensor for them;
an edit of the weights still sees every row; a row outside the pass is refused by name."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab import GPT, GPTConfig, Trace
from attnlab.interp.edits import Edits, uniform_attention
from attnlab.model import summaries, tf32x3
from attnlab.model.summaries import SUMMARY_NAMES
from helpers import modern_switches

TOLERANCE = dict(atol=1e-5, rtol=1e-5)  # float32: later layers read a fused context


def _model(n_kv_head: int = 4, **switches: Any) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("nano", n_head=4, n_kv_head=n_kv_head, **switches)).eval()


def _pass(model: GPT, ids: torch.Tensor, mask: torch.Tensor | None, P: int,
          trace: Trace) -> Trace:
    """`trace` of a pass over ids[:, P:] after a prefill of ids[:, :P] into a cache."""
    cache = model.new_cache(ids.shape[0], ids.shape[1])
    if P:
        model(ids[:, :P], attention_mask=None if mask is None else mask[:, :P], kv_cache=cache)
    model(ids[:, P:], attention_mask=mask, kv_cache=cache, trace=trace)
    return trace


@settings(max_examples=40, deadline=None)
@given(switches=modern_switches(), n_kv_head=st.sampled_from([1, 2, 4]),
       B=st.integers(1, 2), P=st.integers(0, 4), T=st.integers(1, 10), data=st.data(),
       heads=st.sampled_from([None, [2], [0, 3]]),
       extra=st.sampled_from([[], list(SUMMARY_NAMES), ["masked_scores"]]))
def test_the_rows_weights_are_those_rows_of_the_whole_trace(
    switches: dict[str, Any], n_kv_head: int, B: int, P: int, T: int, data: st.DataObject,
    heads: list[int] | None, extra: list[str],
) -> None:
    """Rows in any order, repeated, negative: the kept weights are the whole trace's rows in
    ascending order (and heads), `may_attend` says the same rows, and summaries and scores
    beside them are those of every row (the scores sliced as the weights)."""
    model = _model(n_kv_head, **switches)
    S = P + T
    ids = torch.randint(0, 65, (B, S), generator=torch.Generator().manual_seed(S))
    mask = None
    if data.draw(st.booleans(), "padded"):
        mask = torch.ones(B, S, dtype=torch.long)
        mask[0, :data.draw(st.integers(0, S - 1), "pads")] = 0
    rows = data.draw(st.lists(st.integers(-T, T - 1), min_size=1, max_size=4), "rows")
    kept = sorted({r % T for r in rows})
    names = ["attn_weights", *extra]
    whole = _pass(model, ids, mask, P, Trace(names=names, heads=heads))
    some = _pass(model, ids, mask, P, Trace(names=names, heads=heads, rows=rows))
    assert some.values.keys() == whole.values.keys()
    for (layer, name), value in whole.values.items():
        expected = value[:, :, kept] if name in ("attn_weights", "masked_scores") else value
        torch.testing.assert_close(some.get(name, layer), expected, **TOLERANCE,
                                   msg=lambda m, n=name, la=layer: f"{n}@{la}: {m}")
    for b in range(B):
        assert torch.equal(some.may_attend(1, b), whole.may_attend(1, b)[kept])


class _Shapes(TorchDispatchMode):
    """The largest number of elements of any tensor an op makes while the mode is on."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("names", [["attn_weights"], ["attn_weights", *SUMMARY_NAMES]])
def test_the_rows_alone_are_computed(names: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """(B, nh, T, S) = (2, 4, 48, 48): Trace(rows=[0, -1]) makes no tensor of half the
    weights, with or without summaries (which stream), and keeps (2, 4, 2, 48) weights; the
    whole trace does make one."""
    model = _model(n_kv_head=2, block_size=48)
    ids = torch.randint(0, 65, (2, 48))
    mask = torch.ones(2, 48, dtype=torch.long)
    mask[1, :5] = 0
    full = 2 * 4 * 48 * 48
    monkeypatch.setitem(summaries.TILE_BYTES, "cpu", 4 * full // 16)  # streamed: 3 rows a tile
    for rows, makes_weights in (([0, -1], False), (None, True)):
        shapes = _Shapes()
        with shapes:
            trace = Trace(names=names, rows=rows).run(model, ids, mask)
        assert (shapes.largest >= full // 2) == makes_weights, rows
        assert trace.get("attn_weights", 1).shape == (2, 4, 2 if rows else 48, 48)


def test_an_edit_of_the_weights_is_seen_by_every_row() -> None:
    """An edit of the weights needs every row's, so the whole weights are made and the trace
    keeps its rows of the edited weights; the model uses the edit."""
    model = _model()
    ids = torch.randint(0, 65, (1, 9))
    edits = Edits([uniform_attention(1, 2)])
    trace = Trace(names="attn_weights", rows=-1)
    logits = model(ids, trace=trace, edits=edits).logits
    assert torch.allclose(trace.get("attn_weights", 1)[0, 2, 0], torch.full((9,), 1 / 9))
    torch.testing.assert_close(logits, model(ids, edits=edits).logits, atol=0, rtol=0)


def test_a_row_outside_the_pass_is_refused() -> None:
    model = _model()
    with pytest.raises(ValueError, match=r"trace rows \[9, -10\] out of range for this pass's "
                                         r"9 query rows: 0 to 8, or -9 to -1"):
        Trace(rows=[9, -10, 2]).run(model, torch.zeros(1, 9, dtype=torch.long))
    assert "rows=[-1]" in repr(Trace(rows=-1))


def test_the_rows_weights_take_the_traced_paths_3xtf32_products(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rows' scores come from the traced path's one block function: where 3xTF32 is
    wanted they run through it too (no diagonal: picked rows need not be consecutive)."""
    model = _model(n_kv_head=2)
    ids = torch.randint(0, 65, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    whole = Trace(names="attn_weights").run(model, ids, mask)
    calls: list[int | None] = []

    def matmul(a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0,
               diagonal: int | None = None, past: str = "-inf") -> torch.Tensor:
        calls.append(diagonal)
        return (a @ b) * alpha  # what 3xTF32 computes, within float32's rounding

    # wanted for attention's (B, heads, rows, hs) products, not the linear layers'
    monkeypatch.setattr(tf32x3, "wanted", lambda a, b, rows: a.dim() == 4)
    monkeypatch.setattr(tf32x3, "matmul", matmul)
    some = Trace(names="attn_weights", rows=[-1, 2]).run(model, ids, mask)
    assert calls and all(diagonal is None for diagonal in calls)
    for layer in range(model.config.n_layer):
        torch.testing.assert_close(some.get("attn_weights", layer),
                                   whole.get("attn_weights", layer)[:, :, [2, 8]], **TOLERANCE)
