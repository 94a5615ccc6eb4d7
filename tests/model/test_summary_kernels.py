"""model/summary_kernels.py: the Triton summaries equal the torch path's (`traced_attention`'s
streamed summaries) over left padding, cached keys, sliding windows, GQA, ragged blocks and
rows with nothing to attend to. On a CPU they run under Triton's interpreter, which is read
when the kernels' module is imported: the fixture imports a fresh copy with TRITON_INTERPRET
set and drops it afterwards; its inputs are float32 (triton 3.9's interpreter misreads
bfloat16 operands of tl.dot). On a GPU (`cuda` marker) they run compiled, in float32 and
bfloat16, and a trace of summaries alone then never holds a (nh, T, S) float32 tile."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import kernel_cases as cases
import pytest
import torch
from kernel_cases import CASES, TOLERANCE

import helpers
from attnlab import GPT, Trace
from attnlab.model import summary_kernels, traced_attention
from attnlab.model.attention import attend
from attnlab.model.masks import Mask, build_mask
from attnlab.model.summaries import SUMMARY_NAMES

if importlib.util.find_spec("triton") is None:  # found, not imported: see `interpreted`
    pytest.skip("needs triton (pip install triton)", allow_module_level=True)

KERNELS = "attnlab.model.summary_triton"


@pytest.fixture
def interpreted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The kernels' module under Triton's interpreter (`helpers.interpreted`)."""
    with helpers.interpreted(monkeypatch, KERNELS):
        yield


def _torch_path(q: torch.Tensor, k: torch.Tensor, mask: Mask, scale: float,
                names: list[str]) -> dict[str, torch.Tensor]:
    """The summaries of the CPU traced path (streamed: summaries alone)."""
    trace = cases.Wants(names)
    attend(q, k, torch.randn_like(k), mask, scale=scale, fused=False, trace=trace)
    assert list(trace.values) == names
    return trace.values


@pytest.mark.parametrize("case", list(CASES))
def test_interpreted_kernels_equal_the_torch_path(case: str, interpreted: None) -> None:
    pads, block = CASES[case][8:]
    q, k, mask = cases.case_tensors(case)
    S, causal = k.shape[2], bool(mask.causal)
    assert traced_attention.kernel_mask(mask)
    names = list(SUMMARY_NAMES)
    expected = _torch_path(q, k, mask, 0.3, names)
    got = summary_kernels.layer_summaries(names, q, k, 0.3, causal=causal, window=mask.window,
                                          padding=mask.padding, blocks=(block, block))
    assert list(got) == names
    for name in names:
        assert got[name].dtype == expected[name].dtype == torch.float32
        torch.testing.assert_close(got[name], expected[name], **TOLERANCE,
                                   msg=lambda m, n=name: f"{case} {n}: {m}")
    if pads is not None and pads[-1] == S:  # a row of pads: nothing anywhere
        assert all(not got[name][-1].any() for name in names)


@pytest.mark.parametrize("case", list(CASES))
def test_the_rows_pass_context_equals_the_fused_path(case: str, interpreted: None) -> None:
    """`attend_and_summarise`: the context equals `attend`'s fused path (rows with no key
    to attend, 0s) and the summaries equal `layer_summaries`' to the last bit."""
    block = CASES[case][9]
    q, k, mask = cases.case_tensors(case)
    v = torch.randn(k.shape, generator=torch.Generator().manual_seed(7))  # (B, nkv, S, hs)
    where = dict(causal=bool(mask.causal), window=mask.window, padding=mask.padding,
                 blocks=(block, block))
    names = list(SUMMARY_NAMES)
    context, got = summary_kernels.attend_and_summarise(names, q, k, v, 0.3, **where)
    expected = attend(q, k, v, mask, scale=0.3, fused=True)  # (B, nh, T, hs)
    assert context.shape == expected.shape and context.dtype == expected.dtype
    torch.testing.assert_close(context, expected, **TOLERANCE)
    if mask.empty_rows is not None:  # the all-pad row's queries: exactly 0
        assert not context.masked_select(mask.empty_rows).any()
    alone = summary_kernels.layer_summaries(names, q, k, 0.3, **where)
    for name in names:
        assert torch.equal(got[name], alone[name]), name


def test_the_rows_pass_context_wants_v_like_k(interpreted: None) -> None:
    q, k = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match="pass v of k's shape"):
        summary_kernels.attend_and_summarise(["attn_max"], q, k, k[..., :8], 0.25, causal=True)


def test_only_a_left_padding_lets_the_kernels_drop_the_mask() -> None:
    """Keys from `_clean_from` on take the kernels' unmasked loops: a left-padded row's first
    real key, S for a row with a pad after a real key or with no real key at all."""
    pad = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 0, 1, 1], [1, 1, 1, 0, 0],
                        [0, 0, 0, 0, 0]], dtype=torch.uint8)  # (B, S)
    first = pad.argmax(dim=-1).to(torch.int32)  # (B,)
    assert summary_kernels._clean_from(pad, first).tolist() == [2, 0, 5, 5, 5]


@pytest.mark.parametrize("case", list(CASES))
def test_interpreted_given_lse_pass_equals_the_torch_path(case: str, interpreted: None) -> None:
    """Given each row's lse, the given-lse rows pass (tiles summed over rows once, at the end)
    and the received pass make the torch path's summaries: every case above, rows without
    keys and pads' own rows included."""
    q, k, mask = cases.case_tensors(case)
    block = CASES[case][9]
    names = list(SUMMARY_NAMES)
    expected = _torch_path(q, k, mask, 0.3, names)
    got = summary_kernels.layer_summaries(names, q, k, 0.3, causal=bool(mask.causal),
                                          window=mask.window, padding=mask.padding,
                                          blocks=(block, block), lse=cases.row_lse(q, k, mask, 0.3))
    assert list(got) == names
    for name in names:
        torch.testing.assert_close(got[name], expected[name], **TOLERANCE,
                                   msg=lambda m, n=name: f"{case} {n}: {m}")


def test_a_given_lse_must_have_one_value_per_row() -> None:
    q, k = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match=r"lse of shape \(1, 2, 4\); pass \(B, nh, T\)"):
        summary_kernels.layer_summaries(["attn_max"], q, k, 0.25, causal=True,
                                        lse=torch.zeros(1, 2, 4))


def test_attend_with_lse_is_sdpa_and_its_lse() -> None:
    """On a CPU the lse comes from SDPA's own flash kernel: the context equals
    `F.scaled_dot_product_attention` exactly, the lse the masked scores' logsumexp."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 37, 16, generator=gen) for _ in range(3))
    attended = summary_kernels.attend_with_lse(q, k, v, 0.3)
    assert attended is not None
    context, lse = attended
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                scale=0.3)
    assert torch.equal(context, expected)
    torch.testing.assert_close(lse, cases.row_lse(q, k, build_mask(37, 37), 0.3), **TOLERANCE)


def test_only_the_wanted_summaries_are_made(interpreted: None) -> None:
    q, k = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    got = summary_kernels.layer_summaries(["attn_max", "attn_sink"], q, k, 0.25, causal=True)
    assert list(got) == ["attn_sink", "attn_max"]
    expected = _torch_path(q, k, build_mask(5, 5), 0.25, ["attn_sink", "attn_max"])
    for name, value in got.items():
        torch.testing.assert_close(value, expected[name], **TOLERANCE)


def test_a_model_trace_through_the_kernels_equals_the_torch_trace(
    interpreted: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the kernels let run on CPU tensors, a model's trace of summaries alone has the
    torch path's names, shapes, dtypes and values (and takes the kernel path: counted)."""
    model = cases.small_model(pos="rope", sliding_window=3, window_layers=[0])
    ids = torch.randint(0, 65, (2, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, :4] = 0
    names = list(SUMMARY_NAMES)
    expected = Trace(names=names).run(model, ids, mask)
    calls = []
    launch = summary_kernels.layer_summaries

    def counted(*args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        calls.append(kwargs["window"])
        return launch(*args, **kwargs)

    monkeypatch.setattr(summary_kernels, "available", lambda q: True)
    monkeypatch.setattr(summary_kernels, "ROWS_MAKE_CONTEXT", False)  # SDPA's context
    monkeypatch.setattr(summary_kernels, "layer_summaries", counted)
    got = Trace(names=names).run(model, ids, mask)
    assert calls == [3] + [None] * (model.config.n_layer - 1)
    _assert_same_trace(got, expected, model.config.n_layer, names)


def _assert_same_trace(got: Trace, expected: Trace, n_layer: int, names: list[str]) -> None:
    for layer in range(n_layer):
        for name in names:
            value = got.get(name, layer)
            assert value.shape == expected.get(name, layer).shape
            assert value.dtype == expected.get(name, layer).dtype
            torch.testing.assert_close(value, expected.get(name, layer), **TOLERANCE)


def test_a_model_trace_with_the_rows_pass_context_equals_the_torch_trace(
    interpreted: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ROWS_MAKE_CONTEXT` on: every layer's context comes from the rows pass (counted), every
    summary equals the torch trace's and the logits the untraced forward's."""
    model = cases.small_model(pos="rope", sliding_window=3, window_layers=[0])
    ids = torch.randint(0, 65, (2, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, :4] = 0
    names = list(SUMMARY_NAMES)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits  # (B, T, V) the fused path's
    expected = Trace(names=names).run(model, ids, mask)
    calls = []
    launch = summary_kernels.attend_and_summarise

    def counted(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        calls.append(kwargs["window"])
        return launch(*args, **kwargs)

    monkeypatch.setattr(summary_kernels, "available", lambda q: True)
    monkeypatch.setattr(summary_kernels, "ROWS_MAKE_CONTEXT", True)
    monkeypatch.setattr(summary_kernels, "attend_and_summarise", counted)
    got = Trace(names=names)
    with torch.no_grad():
        traced_logits = model(ids, attention_mask=mask, trace=got).logits  # (B, T, V)
    assert calls == [3] + [None] * (model.config.n_layer - 1)
    _assert_same_trace(got, expected, model.config.n_layer, names)
    torch.testing.assert_close(traced_logits, logits, **TOLERANCE)


def test_a_model_trace_with_the_forward_lse_equals_the_torch_trace(
    interpreted: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`LSE_FROM_FORWARD` on: the layers under the plain causal mask take the context and
    the lse from `attend_with_lse` (counted: not the windowed layer 0), and the summaries
    equal the torch trace's, the logits the untraced forward's; a padded batch, and heads
    whose size is no multiple of 8 (SDPA pads those before its kernels), keep the rows
    pass (no call), as a layer does where `attend_with_lse` finds no fused kernel (None)."""
    model = cases.small_model(pos="rope", sliding_window=3, window_layers=[0],
                              n_embd=32)  # head size 8
    ids = torch.randint(0, 65, (2, 11), generator=torch.Generator().manual_seed(1))
    names = list(SUMMARY_NAMES)
    with torch.no_grad():
        logits = model(ids).logits  # (B, T, V) the fused path's
    expected = Trace(names=names).run(model, ids)
    calls = []
    attend_with_lse = summary_kernels.attend_with_lse

    def counted(*args: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        calls.append(args[0].shape)
        return attend_with_lse(*args)

    monkeypatch.setattr(summary_kernels, "available", lambda q: True)
    monkeypatch.setattr(summary_kernels, "LSE_FROM_FORWARD", True)
    monkeypatch.setattr(summary_kernels, "attend_with_lse", counted)
    got = Trace(names=names)
    with torch.no_grad():
        traced_logits = model(ids, trace=got).logits  # (B, T, V)
    assert len(calls) == model.config.n_layer - 1
    _assert_same_trace(got, expected, model.config.n_layer, names)
    torch.testing.assert_close(traced_logits, logits, **TOLERANCE)
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, :4] = 0
    calls.clear()
    _assert_same_trace(Trace(names=names).run(model, ids, mask),
                       _torch_trace(model, ids, mask, names, monkeypatch),
                       model.config.n_layer, names)
    odd = cases.small_model(pos="rope", n_embd=24)  # head size 6
    Trace(names=names).run(odd, ids)
    assert calls == []
    # where SDPA would run its math path: no lse, the fused path and the rows pass
    monkeypatch.setattr(summary_kernels, "attend_with_lse", lambda *args: None)
    with torch.no_grad():
        got = Trace(names=names)
        torch.testing.assert_close(model(ids, trace=got).logits, logits, **TOLERANCE)
    _assert_same_trace(got, expected, model.config.n_layer, names)


def _torch_trace(model: GPT, ids: torch.Tensor, mask: torch.Tensor, names: list[str],
                 monkeypatch: pytest.MonkeyPatch) -> Trace:
    """The trace of `names` by the torch path (the kernels turned off meanwhile)."""
    with monkeypatch.context() as patch:
        patch.setattr(summary_kernels, "available", lambda q: False)
        return Trace(names=names).run(model, ids, mask)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_kernels_equal_the_torch_path(dtype: torch.dtype) -> None:
    """(B, nh, nkv, T, S, hs) = (2, 8, 2, 300, 700, 64), left pads, a window of 200: the
    compiled kernels against the torch path on the same GPU inputs, in float32 (bfloat16
    inputs: the torch path rounds its scores to bfloat16, so within 2e-2)."""
    cases.need_cuda()
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 8, 300, 64, device="cuda", generator=gen, dtype=dtype)
    k = torch.randn(2, 2, 700, 64, device="cuda", generator=gen, dtype=dtype)
    attention_mask = torch.ones(2, 700, dtype=torch.long, device="cuda")
    attention_mask[1, :37] = 0
    names = list(SUMMARY_NAMES)
    tolerance = TOLERANCE if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for window in (None, 200):
        mask = build_mask(300, 700, attention_mask, window=window, device="cuda")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(summary_kernels, "available", lambda q: False)  # the torch path
            expected = _torch_path(q, k, mask, 0.125, names)
        got = summary_kernels.layer_summaries(names, q, k, 0.125, causal=True,
                                              window=mask.window, padding=mask.padding)
        for name in names:
            torch.testing.assert_close(got[name], expected[name], **tolerance,
                                       msg=lambda m, n=name, w=window: f"{w} {n}: {m}")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_rows_pass_context_equals_the_fused_path(dtype: torch.dtype) -> None:
    """The shapes above, GQA read in place: `attend_and_summarise`'s context against
    `attend`'s fused path (SDPA) on the same GPU inputs, to 1e-5 in float32 (2e-2 in
    bfloat16: both round the weights to bfloat16 before the product with v)."""
    cases.need_cuda()
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 8, 300, 64, device="cuda", generator=gen, dtype=dtype)
    k, v = (torch.randn(2, 2, 700, 64, device="cuda", generator=gen, dtype=dtype)
            for _ in range(2))
    attention_mask = torch.ones(2, 700, dtype=torch.long, device="cuda")
    attention_mask[1, :37] = 0
    tolerance = TOLERANCE if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for window in (None, 200):
        mask = build_mask(300, 700, attention_mask, window=window, device="cuda")
        expected = attend(q, k, v, mask, scale=0.125, fused=True)  # (B, nh, T, hs)
        context, _ = summary_kernels.attend_and_summarise(
            ["attn_max"], q, k, v, 0.125, causal=True, window=mask.window,
            padding=mask.padding)
        torch.testing.assert_close(context, expected, **tolerance,
                                   msg=lambda m, w=window: f"window {w}: {m}")


@pytest.mark.cuda
def test_cuda_trace_of_summaries_takes_the_kernels() -> None:
    """A bfloat16 model's trace of summaries alone at T = 2048, nh = 8 on a GPU peaks well
    below one (nh, T, S) float32 tile (128 MiB): the kernels ran, not the tiled torch path."""
    cases.need_cuda()
    model = cases.small_model(n_head=8, n_layer=2, block_size=2048).to("cuda", torch.bfloat16)
    ids = torch.randint(0, 65, (1, 2048), device="cuda")
    names = list(SUMMARY_NAMES)
    Trace(names=names).run(model, ids)  # compiles the kernels
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    trace = Trace(names=names).run(model, ids)
    peak = torch.cuda.max_memory_allocated() - before
    nh = model.config.n_head
    assert peak < 4 * nh * 2048 * 2048 // 4, peak
    assert trace.get("attn_received", 0).shape == (1, nh, 2048)


@pytest.mark.cuda
@pytest.mark.parametrize("flag", ["ROWS_MAKE_CONTEXT", "LSE_FROM_FORWARD"])
def test_cuda_trace_with_another_context_equals_the_forward(flag: str) -> None:
    """A float32 GQA model with a window layer on a GPU, with `flag` on (the rows pass's
    context, over a left-padded row; the forward's lse, in the unwindowed layer of an
    unpadded batch): the traced forward's logits equal the untraced forward's and its
    summaries the two passes' (context from SDPA), to 1e-5."""
    cases.need_cuda()
    model = cases.small_model(pos="rope", sliding_window=100, window_layers=[0], n_layer=2,
                   block_size=512).to("cuda")
    ids = torch.randint(0, 65, (2, 300), device="cuda")
    mask = None  # a mask of ones would be a padding to the model
    if flag == "ROWS_MAKE_CONTEXT":
        mask = torch.ones(2, 300, dtype=torch.long, device="cuda")
        mask[1, :37] = 0
    names = list(SUMMARY_NAMES)
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits  # (B, T, V)
        expected = Trace(names=names)
        model(ids, attention_mask=mask, trace=expected)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(summary_kernels, flag, True)
            got = Trace(names=names)
            traced_logits = model(ids, attention_mask=mask, trace=got).logits  # (B, T, V)
    _assert_same_trace(got, expected, model.config.n_layer, names)
    torch.testing.assert_close(traced_logits, logits, **TOLERANCE)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_given_lse_pass_equals_the_rows_pass(dtype: torch.dtype) -> None:
    """On a GPU `attend_with_lse` calls the kernel SDPA picks, by name (cuDNN's or flash
    attention for bfloat16, memory-efficient attention for float32): its context is SDPA's
    and its lse the scores'; given that lse, the given-lse pass makes the rows pass's
    summaries (T = 1000, a ragged last block; GQA read in place)."""
    cases.need_cuda()
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(2, 8, 1000, 64, device="cuda", generator=gen, dtype=dtype)
               for _ in range(3))
    attended = summary_kernels.attend_with_lse(q, k, v, 0.125)
    assert attended is not None
    context, lse = attended
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                scale=0.125)
    close = TOLERANCE if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(context, expected, **close)
    mask = build_mask(1000, 1000, device="cuda")
    torch.testing.assert_close(lse, cases.row_lse(q.float(), k.float(), mask, 0.125), **close)
    names = list(SUMMARY_NAMES)
    k_heads = k[:, ::4]  # (2, 2, 1000, 64): four query heads to a key head
    rows = summary_kernels.layer_summaries(names, q, k_heads, 0.125, causal=True)
    given = summary_kernels.layer_summaries(
        names, q, k_heads, 0.125, causal=True,
        lse=cases.row_lse(q.float(), k_heads.float(), mask, 0.125))
    for name in names:
        torch.testing.assert_close(given[name], rows[name], **close,
                                   msg=lambda m, n=name: f"{n}: {m}")
