"""model/trace.py: traced == untraced, every name has its documented shape, filters, masked
cells 0."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import Wants
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab import GPT, CausalSelfAttention, GPTConfig, Trace
from attnlab.model import traced_attention
from attnlab.model.attention import attend
from attnlab.model.masks import build_mask
from attnlab.model.names import NAMES, absent_names
from attnlab.model.trace import narrowed
from helpers import modern_switches


def _model(**overrides: object) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("nano", **overrides)).eval()


@settings(max_examples=15, deadline=None)
@given(switches=modern_switches(latent=True))
def test_traced_logits_equal_untraced(switches: dict[str, object]) -> None:
    model = _model(n_head=4, **switches)
    idx = torch.randint(0, 65, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :4] = 0
    trace = Trace()
    traced = model(idx, attention_mask=mask, trace=trace).logits
    plain = model(idx, attention_mask=mask).logits
    torch.testing.assert_close(traced, plain, atol=1e-5, rtol=0)
    torch.testing.assert_close(trace.get("logits"), plain, atol=1e-5, rtol=0)


def test_every_name_has_its_shape() -> None:
    model = _model(dropout=0.1).train()
    B, T, c = 2, 7, model.config
    trace = Trace()
    model(torch.randint(0, 65, (B, T)), trace=trace)
    nh, hs, C = c.n_head, c.head_size, c.n_embd
    shapes = {
        "tok_emb": (B, T, C), "pos_emb": (B, T, C), "emb": (B, T, C),
        "q": (B, nh, T, hs), "k": (B, nh, T, hs), "v": (B, nh, T, hs),
        "attn_scores": (B, nh, T, T), "masked_scores": (B, nh, T, T),
        "attn_weights": (B, nh, T, T), "attn_weights_dropped": (B, nh, T, T),
        "context": (B, nh, T, hs), "attn_out": (B, T, C), "block_out": (B, T, C),
        "resid_pre": (B, T, C), "mlp_out": (B, T, C), "logits": (B, T, c.vocab_size),
        "resid_mid": (B, T, C), "mlp_pre": (B, T, c.ff_size), "mlp_hidden": (B, T, c.ff_size),
        "attn_entropy": (B, nh, T), "attn_sink": (B, nh, T), "attn_received": (B, nh, T),
        "attn_distance": (B, nh, T), "attn_max": (B, nh, T),
    }
    # learned positions: no rotary, so no q/k before rotation; no sandwich norms, so no
    # post-norm outputs (test_trace_names has them)
    assert set(shapes) == set(NAMES) - {"q_pre_rope", "k_pre_rope", "attn_out_normed",
                                        "mlp_out_normed", "router_logits", "expert_weights",
                                        "attn_learned_sink", "kv_latent"}
    for name, shape in shapes.items():
        layer = None if name in ("tok_emb", "pos_emb", "emb", "logits") else 1
        assert tuple(trace.get(name, layer).shape) == shape, name


def test_masked_cells_are_exactly_zero_and_rows_sum_to_one() -> None:
    model = _model()
    trace = Trace(names=["attn_weights", "masked_scores"])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    model(torch.randint(0, 65, (1, 6)), attention_mask=mask, trace=trace)
    weights = trace.get("attn_weights", 0)[0]  # (nh, T, S)
    may_attend = torch.tril(torch.ones(6, 6)).bool() & mask.bool()
    assert torch.all(weights[:, ~may_attend] == 0)
    assert torch.all(trace.get("masked_scores", 0)[0][:, ~may_attend] == float("-inf"))
    torch.testing.assert_close(weights[:, 2:].sum(-1), torch.ones(2, 4))
    assert torch.all(weights[:, :2] == 0)  # pad queries attend to nothing


def test_filters_keep_only_what_was_asked() -> None:
    model = _model()
    trace = Trace(layers=[1], heads=[0], names=["attn_weights"])
    model(torch.randint(0, 65, (1, 5)), trace=trace)
    assert list(trace) == [(1, "attn_weights")]
    assert trace.get("attn_weights", 1).shape == (1, 1, 5, 5)
    assert trace.nbytes() == 25 * 4
    with pytest.raises(KeyError, match="captured: \\['attn_weights@1'\\]"):
        trace.get("q", 1)
    with pytest.raises(ValueError, match="unknown trace names"):
        Trace(names=["attention"])
    # a layer the model lacks is refused when the model runs, not at get()
    layers = model.config.n_layer
    with pytest.raises(ValueError, match=rf"Trace\(layers=\[0, 7\]\): the model has {layers} "
                       rf"layers \(0 to {layers - 1}\); \[7\] are not among them"):
        model(torch.randint(0, 65, (1, 5)), trace=Trace(layers=[0, 7]))


def test_a_value_is_asked_for_as_get_takes_it_or_as_keys_iterate() -> None:
    model = _model()
    trace = Trace(layers=1, names=["attn_weights", "logits"]).run(
        model, torch.randint(0, 65, (1, 5)))
    assert trace["attn_weights", 1] is trace.get("attn_weights", 1)
    assert trace["logits"] is trace.get("logits")
    for key in (("attn_weights", 1), (1, "attn_weights"), "logits", (None, "logits")):
        assert key in trace
    for key in (("attn_weights", 0), (0, "attn_weights"), "q", ("attn_weights",)):
        assert key not in trace
    with pytest.raises(KeyError, match="trace has no 'q' for layer 1"):
        trace["q", 1]


def test_filters_that_cannot_be_met_are_refused_when_made() -> None:
    import numpy as np

    for bad, message in (({"layers": "0"}, r"layers are integers >= 0 .*, not '0'"),
                         ({"heads": [0, -1]}, r"heads are integers >= 0, not -1"),
                         ({"layers": [True]}, r"not True"),
                         ({"rows": [0.5]}, r"rows are integers, not 0.5"),
                         ({"layers": []}, r"Trace\(layers=\[\]\) would keep nothing"),
                         ({"names": []}, r"Trace\(names=\[\]\) would keep nothing")):
        with pytest.raises(ValueError, match=message):
            Trace(**bad)  # type: ignore[arg-type]
    trace = Trace(layers=np.int64(1), heads=torch.tensor([0]).tolist(), rows=[np.int32(-1)])
    assert trace.layers == {1} and trace.heads == [0] and trace.rows == (-1,)
    assert Trace(layers=torch.tensor(1), heads=np.array(2)).heads == [2]  # 0-d: one index


def test_head_filter_on_grouped_query_keeps_the_kv_heads_those_heads_read() -> None:
    model = GPT(GPTConfig.from_name("nano", n_head=4, n_kv_head=2, n_embd=16)).eval()
    idx = torch.randint(0, 65, (1, 8))
    full, one = Trace(), Trace(heads=[3])
    model(idx, trace=full)
    model(idx, trace=one)
    assert torch.equal(one.get("attn_weights", 0), full.get("attn_weights", 0)[:, [3]])
    assert torch.equal(one.get("k", 0), full.get("k", 0)[:, [1]])  # head 3 reads kv head 1
    for names in (None, ["mlp_hidden"]):  # checked before the pass, whatever it keeps
        with pytest.raises(ValueError, match=r"Trace\(heads=\[4\]\): the model has 4 heads "
                                             r"\(0 to 3\); \[4\] are not among them"):
            model(idx, trace=Trace(heads=[4], names=names))


def _reference_weights(
    trace: Trace, layer: int, may_attend: torch.Tensor, scale: float
) -> torch.Tensor:
    """softmax over the recorded raw scores, masked by hand: (B, nh, T, S), empty rows 0."""
    scores = trace.get("attn_scores", layer).masked_fill(~may_attend, float("-inf")) * scale
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key: NaN -> 0
    return weights


@pytest.mark.parametrize("rows", [1, 3, 64])
def test_blocked_weights_equal_one_softmax_with_padding_and_a_cache(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The traced path computes weights `BLOCK_ROWS` queries at a time over the keys those
    queries may see; any block size gives one masked softmax's weights and the fused logits."""
    monkeypatch.setattr(traced_attention, "BLOCK_ROWS", rows)
    model = _model()
    B, P, T = 2, 4, 7  # 4 cached positions, then 7 new queries over S = 11 keys
    mask = torch.ones(B, P + T, dtype=torch.long)
    mask[1, :6] = 0  # row 1: left padding into the new tokens (queries 0, 1 see nothing)
    ids = torch.randint(0, 65, (B, P + T), generator=torch.Generator().manual_seed(2))
    plain_cache, traced_cache = model.new_cache(B), model.new_cache(B)
    for cache in (plain_cache, traced_cache):
        model(ids[:, :P], attention_mask=mask[:, :P], kv_cache=cache)
    trace = Trace()
    plain = model(ids[:, P:], attention_mask=mask, kv_cache=plain_cache).logits
    traced = model(ids[:, P:], attention_mask=mask, kv_cache=traced_cache, trace=trace).logits
    torch.testing.assert_close(traced, plain, atol=1e-5, rtol=0)
    causal = torch.tril(torch.ones(P + T, P + T, dtype=torch.bool))[-T:]  # (T, S)
    may_attend = causal[None, None] & mask.bool()[:, None, None, :]  # (B, 1, T, S)
    scale = model.config.head_size**-0.5
    for layer in range(model.config.n_layer):
        weights = trace.get("attn_weights", layer)
        torch.testing.assert_close(weights, _reference_weights(trace, layer, may_attend, scale))
        assert torch.all(weights[~may_attend.expand_as(weights)] == 0.0)
        context = weights @ trace.get("v", layer)  # (B, nh, T, S) @ (B, nh, S, hs)
        torch.testing.assert_close(trace.get("context", layer), context)


@pytest.mark.parametrize("rows", [2, 64])
def test_gradients_flow_through_traced_weights_with_padding(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace of the weights takes attention's explicit path; with autograd on (saliency,
    attribution patching through queries and keys) its gradients equal the untraced model's,
    with left-padded rows whose first queries see no key (their weights are zeroed after the
    softmax, which must not overwrite what the softmax's backward reads)."""
    monkeypatch.setattr(traced_attention, "BLOCK_ROWS", rows)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", init_std=0.2)).double().eval()
    ids = torch.randint(0, 65, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0

    def grads(trace: Trace | None) -> list[torch.Tensor]:
        model.zero_grad()
        logits = model(ids, attention_mask=mask, trace=trace).logits  # (B, T, V)
        logits[:, -1].logsumexp(-1).sum().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    plain, traced = grads(None), grads(Trace(names=["attn_weights"]))
    assert len(traced) == len(plain) > 0
    for a, b in zip(traced, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 9), T=st.integers(1, 24), P=st.integers(0, 6),
       pad=st.integers(0, 12), window=st.sampled_from([None, 1, 3, 8]))
def test_weights_alone_equal_the_weights_beside_the_scores(
    rows: int, T: int, P: int, pad: int, window: int | None
) -> None:
    """A trace of the weights alone masks each block of queries' scores as it makes them;
    a trace with the raw scores masks them whole first. Any block size gives the same
    weights and the same masked cells, with left padding, a cache and sliding windows
    (checked to fail where a block's mask assumes plain causal structure)."""
    import attnlab.model.traced_attention as attention_module

    model = _model(n_head=4, sliding_window=window)
    B = 2
    mask = torch.ones(B, P + T, dtype=torch.long)
    mask[1, :min(pad, P + T - 1)] = 0  # row 1 left-padded, one token kept
    ids = torch.randint(0, 65, (B, P + T), generator=torch.Generator().manual_seed(T))
    traces = []
    old = attention_module.BLOCK_ROWS
    attention_module.BLOCK_ROWS = rows
    try:
        for names in (["attn_weights"], ["attn_scores", "attn_weights"]):
            cache = model.new_cache(B)
            if P:
                model(ids[:, :P], attention_mask=mask[:, :P], kv_cache=cache)
            traces.append(Trace(names=names))
            model(ids[:, P:], attention_mask=mask, kv_cache=cache, trace=traces[-1])
    finally:
        attention_module.BLOCK_ROWS = old
    for layer in range(model.config.n_layer):
        alone, beside = (t.get("attn_weights", layer) for t in traces)
        torch.testing.assert_close(alone, beside, atol=1e-6, rtol=0)
        assert torch.equal(alone == 0, beside == 0)  # the same cells masked


def test_float16_storage_halves_the_bytes_within_the_stated_error() -> None:
    model = _model()
    idx = torch.randint(0, 65, (2, 12), generator=torch.Generator().manual_seed(3))
    full, half = Trace(names=["attn_weights", "q"]), Trace(names=["attn_weights", "q"],
                                                           dtype=torch.float16)
    torch.testing.assert_close(model(idx, trace=half).logits, model(idx, trace=full).logits,
                               atol=0, rtol=0)  # storage only: the model computes in float32
    assert half.nbytes() * 2 == full.nbytes()
    for key in full:
        assert half.values[key].dtype == torch.float16
        err = (half.values[key].float() - full.values[key]).abs()
        bound = 2**-12 if key[1] == "attn_weights" else 2**-11 * full.values[key].abs()
        assert torch.all(err <= bound), key
    with pytest.raises(ValueError, match="must be a floating dtype"):
        Trace(dtype=torch.int8)


def test_kept_keys_survive_later_cache_writes() -> None:
    model = _model()
    cache = model.new_cache(1, max_len=6)
    trace = Trace(names=["k", "attn_weights"])
    model(torch.randint(0, 65, (1, 6)), kv_cache=cache, trace=trace)
    kept = trace.get("k", 0).clone()
    cache.seq_len = 0  # rewind: the next call overwrites every cached position
    model(torch.randint(0, 65, (1, 6)), kv_cache=cache)
    assert torch.equal(trace.get("k", 0), kept)  # a copy, not the cache's memory
    assert trace.get("k", 0).data_ptr() != cache.layers[0].k.data_ptr()


@settings(max_examples=25, deadline=None)
@given(switches=modern_switches(n_layer=3),
       names=st.sets(st.sampled_from(sorted(set(NAMES) - {"logits"})), max_size=3),
       layers=st.sets(st.integers(0, 2), max_size=2))
def test_run_keeps_what_a_whole_forward_keeps_and_stops_after_it(
        switches: dict[str, object], names: set[str], layers: set[int]) -> None:
    """Trace.run holds the same values as model(idx, trace=...) for any filter, on every
    switch, with left padding; the blocks after the last traced layer and the head never
    run; a trace left without its stop point runs the whole forward again."""
    model = _model(n_head=4, n_layer=3, **switches)
    idx = torch.randint(0, 65, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    if names and names <= absent_names(model.config).keys():  # q_pre_rope, learned positions
        with pytest.raises(ValueError, match="would keep nothing: this model never computes"):
            Trace(layers=layers or None, names=names).run(model, idx, mask)
        return
    whole = Trace(layers=layers or None, names=names or None)
    model(idx, attention_mask=mask, trace=whole)
    ran: list[str] = []
    hooks = [module.register_forward_pre_hook(lambda *_, name=name: ran.append(name))
             for name, module in [(f"block {i}", b) for i, b in enumerate(model.blocks)]
             + [("lm_head", model.lm_head)]]
    part = Trace(layers=layers or None, names=names or None).run(model, idx, mask)
    assert part.values.keys() == whole.values.keys()
    for key, value in whole.values.items():
        assert torch.equal(part.values[key], value), key
    if not names:  # every name: the logits too
        assert ran == ["block 0", "block 1", "block 2", "lm_head"]
    else:
        last = -1 if names <= {"tok_emb", "pos_emb", "emb"} else max(layers or {2})
        if names & set(NAMES) - {"tok_emb", "pos_emb", "emb", "resid_pre"}:
            last += 1  # a value inside the last traced block (resid_pre is its input)
        assert ran == [f"block {i}" for i in range(last)]
    ran.clear()
    assert model(idx, attention_mask=mask, trace=part).logits.shape == (2, 9, 65)
    assert ran == ["block 0", "block 1", "block 2", "lm_head"]
    for hook in hooks:
        hook.remove()


def test_run_applies_edits_before_it_keeps() -> None:
    from attnlab.interp.edits import Edits, zero_heads

    model = _model(n_head=4, n_layer=3)
    idx = torch.randint(0, 65, (2, 9))
    edits = Edits([zero_heads(0, [1, 2])])
    whole = Trace(layers=1, names="attn_weights")
    model(idx, trace=whole, edits=edits)
    part = Trace(layers=1, names="attn_weights").run(model, idx, edits=edits)
    assert torch.equal(part.get("attn_weights", 1), whole.get("attn_weights", 1))
    plain = Trace(layers=1, names="attn_weights").run(model, idx)
    assert not torch.equal(plain.get("attn_weights", 1), whole.get("attn_weights", 1))


def test_may_attend_is_what_the_model_masked_with_or_without_masked_scores() -> None:
    """The figures and the view ask the trace which cells a query could see: causal, within
    a layer's sliding window, and not a pad key; the weights alone cannot tell (0 either way)."""
    model = _model(sliding_window=3, window_layers=[1])
    idx = torch.randint(0, 65, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0  # row 1: three left pads
    full = Trace(names=["attn_weights", "masked_scores"]).run(model, idx, mask)
    light = Trace(names=["attn_weights"]).run(model, idx, mask)
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    window = causal & ~torch.ones(8, 8, dtype=torch.bool).tril(-3)  # keys i-2..i
    for row in (0, 1):
        pad = mask[row].bool()  # (S,)
        for layer, expected in ((0, causal & pad), (1, window & pad)):
            for trace in (full, light):
                assert torch.equal(trace.may_attend(layer, row), expected), (row, layer)
    # a padding given for the keys replaces the pass's own
    assert torch.equal(light.may_attend(0, 0, attention_mask=mask[1]), causal & mask[1].bool())
    with pytest.raises(ValueError, match="no scores or weights for layer 0"):
        Trace(names=["q"]).run(model, idx).may_attend(0)
    with pytest.raises(ValueError, match=r"pass the \(B, 8\) mask"):
        light.may_attend(0, attention_mask=mask[:, :5])


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["causal", "encoder", "cross"]), B=st.integers(1, 3),
       T=st.integers(1, 6), extra=st.integers(0, 4), padded=st.booleans(),
       seed=st.integers(0, 2**16))
def test_may_attend_without_masked_scores_is_what_masked_scores_say(
    kind: str, B: int, T: int, extra: int, padded: bool, seed: int
) -> None:
    """A standalone module's trace rebuilds the mask it attended under: causal (queries the
    last T keys), or the padding alone for an encoder (causal=False) and cross-attention,
    exactly the cells whose masked scores are not -inf."""
    torch.manual_seed(seed)
    attn = CausalSelfAttention(8, 8, n_head=2, causal=kind == "causal",
                               d_context=8 if kind == "cross" else None).eval()
    x = torch.randn(B, T, 8)
    source = torch.randn(B, T + extra, 8) if kind == "cross" else x
    S = source.shape[1]
    mask = None
    if padded:  # every row keeps its last key: a causal query always has one to see
        mask = (torch.rand(B, S) < 0.6).long()
        mask[:, -1] = 1
    light, full = Trace(names=["attn_weights"]), Trace(names=["attn_weights", "masked_scores"])
    for trace in (light, full):
        attn(x, mask, context=source if kind == "cross" else None, trace=trace)
    for row in range(B):
        assert torch.equal(light.may_attend(None, row), full.may_attend(None, row)), row


@settings(max_examples=25, deadline=None)
@given(dtype=st.sampled_from([torch.float16, torch.bfloat16]), size=st.sampled_from([1, 300, 3e4]),
       padded=st.booleans(), seed=st.integers(0, 2**16))
def test_a_narrower_trace_dtype_masks_what_the_model_masked(
    dtype: torch.dtype, size: float, padded: bool, seed: int
) -> None:
    """Scores past float16's range are stored as +-65504, not +-inf: only masked cells are
    -inf, so `may_attend` of a float16 trace is the float32 trace's."""
    torch.manual_seed(seed)
    attn = CausalSelfAttention(8, 8, n_head=2).eval()
    x = torch.randn(2, 5, 8) * size
    mask = torch.tensor([[1] * 5, [0, 0, 1, 1, 1]]) if padded else None
    names = ["attn_scores", "masked_scores", "attn_weights"]
    wide, narrow = Trace(names=names), Trace(names=names, dtype=dtype)
    for trace in (wide, narrow):
        attn(x, mask, trace=trace)
    assert torch.isfinite(narrow.get("attn_scores")).all()
    for row in range(2):
        assert torch.equal(narrow.may_attend(None, row), wide.may_attend(None, row))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_narrowed_holds_values_past_the_range_and_keeps_the_rest_as_a_cast(
    dtype: torch.dtype,
) -> None:
    """In range (weights), a plain cast; past it, +-the largest finite value, -inf (masked)
    and nan as they were; an empty tensor stays empty."""
    largest = torch.finfo(dtype).max
    inside = torch.rand(3, 40) * 2 - 1  # (3, 40)
    assert torch.equal(narrowed(inside, dtype), inside.to(dtype))
    wild = inside.double()  # float64: past bfloat16's range too
    wild[0, :4] = torch.tensor([1e39, -1e39, float("inf"), float("-inf")], dtype=torch.float64)
    wild[1, 0] = float("nan")
    out = narrowed(wild, dtype)
    assert out.dtype == dtype
    assert out[0, :4].tolist() == [largest, -largest, largest, float("-inf")]
    assert out[1, 0].isnan() and torch.equal(out[2], inside[2].to(dtype))
    assert narrowed(torch.empty(0, 5), dtype).shape == (0, 5)


@pytest.mark.parametrize("hs", [64, 80])
def test_scaled_scores_are_the_product_then_the_scale(hs: int) -> None:
    """The traced path scales inside the product; slices of q and k^T as the blocks take
    them give product-then-scale's scores: bit for bit at a power-of-two scale (head size
    64), within float32's rounding bound for a sum of hs products at 1/sqrt(80) (the BLAS
    may scale an operand before it sums)."""
    gen = torch.Generator().manual_seed(hs)
    q = torch.randn(2, 6, 40, hs, generator=gen)[:, 1:4, 5:37]  # (B, heads, rows, hs) slice
    key_t = torch.randn(2, 6, 50, hs, generator=gen).transpose(-2, -1)[:, 1:4, :, 3:45]
    scale = hs**-0.5
    expected = (q @ key_t) * scale  # (B, heads, rows, keys)
    got = traced_attention.scaled_scores(q, key_t, scale)
    assert got.shape == expected.shape == (2, 3, 32, 42)
    if hs == 64:
        assert torch.equal(got, expected)
    else:
        bound = hs * torch.finfo(torch.float32).eps * (q.abs() @ key_t.abs()) * scale
        assert torch.all((got - expected).abs() <= bound)


@pytest.mark.parametrize("heads", [[1], [2], [1, 2]])
def test_a_head_filter_reads_each_query_heads_own_kv_head(heads: list[int]) -> None:
    """Grouped-query attention (4 query heads, 2 key/value heads: heads 0-1 read kv head 0,
    2-3 kv head 1): Trace(heads=...) gives the whole trace's weights of those heads. Head 3
    alone (the existing test) cannot tell h // 2 from h % 2; heads 1 and 2 can."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_head=4, n_kv_head=2)).eval()
    ids = torch.randint(0, 65, (2, 12), generator=torch.Generator().manual_seed(0))
    whole = Trace(names=["attn_weights"]).run(model, ids)
    some = Trace(heads=heads, names=["attn_weights"]).run(model, ids)
    torch.testing.assert_close(some.get("attn_weights", 0), whole.get("attn_weights", 0)[:, heads],
                               atol=0, rtol=0)


class _Ops(TorchDispatchMode):
    """Records each aten op called under it with its first argument's shape."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[object, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        self.calls.append((func, () if first is None else tuple(first.shape)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("hs", [8, 16])
def test_traced_blocks_of_one_sequence_work_in_one_scratch(
    hs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A traced CPU pass of one sequence without autograd multiplies q and k where they lie
    (no contiguous copy of either), masks each block's scores with one add (no masked_fill
    over every head) and runs each block's softmax in place in one scratch (no fresh block
    per step); its weights and output equal the reference path's (`attend(fused=False)`, no
    trace)."""
    monkeypatch.setattr(traced_attention, "BLOCK_ROWS", 4)
    B, nh, T = 1, 3, 13
    qkv = torch.randn(B, T, 3, nh, hs, generator=torch.Generator().manual_seed(0))
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, nh, T, hs) views
    mask = build_mask(T, T)
    trace = Wants(["attn_weights"])
    with torch.no_grad(), _Ops() as ops:
        out = attend(q, k, v, mask, fused=False, trace=trace)  # (B, nh, T, hs)
    called = [func for func, _ in ops.calls]
    assert torch.ops.aten.clone.default not in called  # q.contiguous(), k.contiguous()
    aten = torch.ops.aten
    assert aten._softmax.default not in called and aten.softmax.int not in called  # fresh
    assert called.count(aten.softmax.int_out) == -(-T // 4)  # one in place per block
    assert all(shape[1] == 1 for func, shape in ops.calls  # only the (1, 1, rows, keys) add
               if func == aten.masked_fill_.Scalar)
    may_attend = torch.ones(T, T, dtype=torch.bool).tril()  # (T, S)
    scores = (q @ k.transpose(-2, -1)) * hs**-0.5  # (B, nh, T, S)
    expected = torch.softmax(scores.masked_fill(~may_attend, float("-inf")), dim=-1)
    torch.testing.assert_close(trace.values["attn_weights"], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(out, attend(q, k, v, mask, fused=False), atol=1e-6, rtol=0)
