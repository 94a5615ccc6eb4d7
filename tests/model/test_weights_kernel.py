"""The weights pass (`summary_kernels.attention_weights`, `weights_triton.py`): a layer's whole
attention weights written once from q, k and each row's lse, equal to the explicit path's.

On a CPU the kernels run under Triton's interpreter (`helpers.interpreted`), over the
summaries' mask cases (kernel_cases.CASES: padding, windows, cached keys, GQA, rows
with nothing to attend to, ragged blocks). The GPU tests carry the cuda marker.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import kernel_cases as cases
import pytest
import torch
from kernel_cases import CASES, TOLERANCE

import helpers
from attnlab import Trace
from attnlab.interp.edits import Edits, uniform_attention
from attnlab.model import summary_kernels
from attnlab.model.attention import attend

if importlib.util.find_spec("triton") is None:  # found, not imported: see `interpreted`
    pytest.skip("needs triton (pip install triton)", allow_module_level=True)


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with helpers.interpreted(monkeypatch, "attnlab.model.weights_triton"):
        yield


def _torch_weights(q: torch.Tensor, k: torch.Tensor, mask: object, scale: float
                   ) -> torch.Tensor:
    """The explicit path's (B, nh, T, S) weights, as a trace records them."""
    trace = cases.Wants(["attn_weights"])
    attend(q, k, torch.randn_like(k), mask, scale=scale, fused=False, trace=trace)  # type: ignore[arg-type]
    return trace.values["attn_weights"]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("lse_from", ["rows pass", "given"])
def test_interpreted_weights_equal_the_explicit_path(case: str, lse_from: str,
                                                     interpreted: None) -> None:
    """Every weight, 0s where the mask hides a key and over rows with no key (an all-pad
    row's, a pad's own query), with the lse from the rows pass or handed over."""
    q, k, mask = cases.case_tensors(case)
    block = CASES[case][9]
    expected = _torch_weights(q, k, mask, 0.3)
    lse = cases.row_lse(q, k, mask, 0.3) if lse_from == "given" else None
    weights, context = summary_kernels.attention_weights(
        q, k, None, 0.3, causal=bool(mask.causal), window=mask.window, padding=mask.padding,
        lse=lse, blocks=(block, block))
    assert context is None
    assert weights.shape == expected.shape and weights.dtype == expected.dtype
    torch.testing.assert_close(weights, expected, **TOLERANCE)
    if mask.may_attend is not None:  # hidden pairs are exactly 0, not merely small
        assert not weights.masked_select(~mask.may_attend).any()


@pytest.mark.parametrize("case", ["left padding, whole blocks", "window, padding, ragged",
                                  "cached keys and GQA"])
def test_interpreted_weights_with_the_rows_pass_context(case: str, interpreted: None) -> None:
    """With v and no lse, the rows pass also makes the context: the fused path's."""
    q, k, mask = cases.case_tensors(case)
    v = torch.randn(k.shape, generator=torch.Generator().manual_seed(7))  # (B, nkv, S, hs)
    weights, context = summary_kernels.attention_weights(
        q, k, v, 0.3, causal=bool(mask.causal), window=mask.window, padding=mask.padding,
        blocks=(16, 16))
    assert context is not None
    torch.testing.assert_close(context, attend(q, k, v, mask, scale=0.3, fused=True),
                               **TOLERANCE)
    torch.testing.assert_close(weights, _torch_weights(q, k, mask, 0.3), **TOLERANCE)


def test_weights_take_v_or_lse_not_both() -> None:
    q = torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match="pass v or lse, not both"):
        summary_kernels.attention_weights(q, q, q, 0.25, causal=True, lse=torch.zeros(1, 2, 5))


@pytest.mark.parametrize("source", ["rows pass", "forward lse"])
def test_a_model_trace_of_weights_through_the_kernel(
        source: str, interpreted: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """`WEIGHTS_FROM_LSE` on: every layer's weights come from the weights pass (counted), with
    the lse from the rows pass (a left-padded batch, a window in layer 0, GQA) or, under the
    plain causal mask, from `attend_with_lse` (counted: not the windowed layer 0); weights
    and logits equal the explicit path's, and an edit of the weights still reaches the
    logits."""
    model = cases.small_model(pos="rope", sliding_window=5, window_layers=[0],
                              n_embd=32)  # head size 8
    n_layer = model.config.n_layer
    ids = torch.randint(0, 65, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = None
    if source == "rows pass":
        mask = torch.ones(2, 12, dtype=torch.long)
        mask[1, :4] = 0
    expected = Trace(names="attn_weights")
    with torch.no_grad():
        logits = model(ids, attention_mask=mask, trace=expected).logits  # (B, T, V)
    monkeypatch.setattr(summary_kernels, "available", lambda q: True)
    monkeypatch.setattr(summary_kernels, "WEIGHTS_FROM_LSE", frozenset(summary_kernels.DTYPES))
    monkeypatch.setattr(summary_kernels, "LSE_FROM_FORWARD", source == "forward lse")
    counts = {"weights": 0, "forward": 0}
    for name, key in (("attention_weights", "weights"), ("attend_with_lse", "forward")):
        real = getattr(summary_kernels, name)
        monkeypatch.setattr(summary_kernels, name, lambda *a, real=real, key=key, **kw: (
            counts.__setitem__(key, counts[key] + 1), real(*a, **kw))[1])
    got = Trace(names="attn_weights")
    with torch.no_grad():
        traced_logits = model(ids, attention_mask=mask, trace=got).logits  # (B, T, V)
    assert counts == {"weights": n_layer, "forward": n_layer - 1 if mask is None else 0}
    torch.testing.assert_close(traced_logits, logits, **TOLERANCE)
    for layer in range(n_layer):
        torch.testing.assert_close(got.get("attn_weights", layer),
                                   expected.get("attn_weights", layer), **TOLERANCE)
    edit = Edits([uniform_attention(1, 2)])
    with torch.no_grad():
        edited = model(ids, attention_mask=mask, trace=Trace(names="attn_weights"),
                       edits=edit).logits  # (B, T, V)
    monkeypatch.setattr(summary_kernels, "WEIGHTS_FROM_LSE", frozenset())
    with torch.no_grad():
        reference = model(ids, attention_mask=mask, trace=Trace(names="attn_weights"),
                          edits=edit).logits  # (B, T, V)
    assert not torch.allclose(reference, logits)
    torch.testing.assert_close(edited, reference, **TOLERANCE)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("source", ["rows pass", "forward lse"])
def test_cuda_trace_of_weights_through_the_kernel(dtype: torch.dtype, source: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU, `WEIGHTS_FROM_LSE` on: every layer's weights (a window in layer 0, GQA,
    ragged blocks; a left-padded batch for the rows pass) and the logits equal the explicit
    path's."""
    cases.need_cuda()
    # head size 16: SDPA's kernels take it
    model = cases.small_model(pos="rope", sliding_window=100, window_layers=[0], n_layer=2,
                              n_embd=64, block_size=512).to("cuda", dtype)
    ids = torch.randint(0, 65, (2, 300), device="cuda")
    mask = None
    if source == "rows pass":
        mask = torch.ones(2, 300, dtype=torch.long, device="cuda")
        mask[1, :37] = 0
    close = TOLERANCE if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    with torch.no_grad():
        expected = Trace(names="attn_weights")
        with monkeypatch.context() as explicit:  # 16-bit traces take the pass by default
            explicit.setattr(summary_kernels, "WEIGHTS_FROM_LSE", frozenset())
            logits = model(ids, attention_mask=mask, trace=expected).logits  # (B, T, V)
        calls = []
        real = summary_kernels.attention_weights
        with monkeypatch.context() as patch:
            patch.setattr(summary_kernels, "WEIGHTS_FROM_LSE", frozenset(summary_kernels.DTYPES))
            patch.setattr(summary_kernels, "LSE_FROM_FORWARD", source == "forward lse")
            patch.setattr(summary_kernels, "attention_weights",
                          lambda *a, **kw: calls.append(kw.get("lse") is None) or real(*a, **kw))
            got = Trace(names="attn_weights")
            traced_logits = model(ids, attention_mask=mask, trace=got).logits  # (B, T, V)
    # the windowed layer 0 takes the rows pass's lse; layer 1 SDPA's where asked
    assert calls == [True, source == "rows pass"]
    torch.testing.assert_close(traced_logits, logits, **close)
    for layer in range(2):
        torch.testing.assert_close(got.get("attn_weights", layer),
                                   expected.get("attn_weights", layer), **close)


def test_only_16_bit_traces_take_the_weights_pass_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The default `WEIGHTS_FROM_LSE` holds the 16-bit dtypes (an H100 measured the pass
    faster there and slower in float32): where the kernels run, a float32 trace keeps the
    explicit path, and takes the pass once float32 is listed."""
    assert {torch.bfloat16, torch.float16} == summary_kernels.WEIGHTS_FROM_LSE
    model, ids = cases.small_model(), torch.randint(0, 65, (1, 9))
    monkeypatch.setattr(summary_kernels, "available", lambda q: True)

    def called(*args: object, **kwargs: object) -> None:
        raise LookupError("the weights pass")

    monkeypatch.setattr(summary_kernels, "attention_weights", called)
    with torch.no_grad():
        Trace(names="attn_weights").run(model, ids)  # float32
        monkeypatch.setattr(summary_kernels, "WEIGHTS_FROM_LSE", frozenset({torch.float32}))
        with pytest.raises(LookupError, match="the weights pass"):
            Trace(names="attn_weights").run(model, ids)
