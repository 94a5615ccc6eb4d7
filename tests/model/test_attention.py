"""model/attention.py: masks, explicit == fused, equality with SDPA, the seeds' published
numbers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab import (
    GPT,
    CausalSelfAttention,
    GPTConfig,
    Mask,
    Trace,
    attend,
    build_mask,
    causal_mask,
)
from attnlab.model import sdpa
from helpers import assert_dropped

ATOL = 1e-5


def _qkv(B: int, nh: int, nkv: int, T: int, S: int, hs: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, nh, T, hs, generator=g)
    k = torch.randn(B, nkv, S, hs, generator=g)
    v = torch.randn(B, nkv, S, hs, generator=g)
    return q, k, v


def _left_pad_mask(lengths: list[int], S: int) -> torch.Tensor:
    mask = torch.zeros(len(lengths), S, dtype=torch.long)
    for row, n in enumerate(lengths):
        if n:
            mask[row, -n:] = 1
    return mask


# ------------------------------------------------------------------------------ masks


@pytest.mark.parametrize(("T", "S"), [(1, 1), (5, 5), (1, 9), (3, 9)])
def test_causal_mask_is_seed003_trimmed_tril(T: int, S: int) -> None:
    expected = torch.tril(torch.ones(S, S)).bool()[-T:, -S:]
    assert torch.equal(causal_mask(T, S), expected)


def test_causal_mask_rejects_more_queries_than_keys() -> None:
    with pytest.raises(ValueError, match="q_len=4, k_len=3"):
        causal_mask(4, 3)


def _sees(query: int, key: int, window: int | None) -> bool:
    """GPTConfig.sliding_window's definition, written out: query i sees keys
    i - window < j <= i (window None: every key j <= i)."""
    return key <= query and (window is None or query - window < key)


def _by_definition(T: int, S: int, window: int | None, pad: torch.Tensor) -> torch.Tensor:
    """(B, T, S): the real keys (pad (B, S), 1 = real) each of T queries, the last T of S
    positions, sees by `_sees`."""
    return torch.tensor([[[_sees(S - T + t, j, window) and bool(row[j]) for j in range(S)]
                          for t in range(T)] for row in pad])


@pytest.mark.parametrize(("T", "S", "window"), [
    (6, 6, 2), (3, 9, 4), (1, 9, 3), (5, 9, 1), (2, 7, 7), (4, 6, 9)])
def test_the_window_mask_is_its_definition(T: int, S: int, window: int) -> None:
    """causal_mask and build_mask as the definition says, not as each other: queries after
    S - T cached keys, rows left-padded, windows of one key, of all of them and wider."""
    pad = _left_pad_mask([S, S - 2, 1], S)
    may_attend = build_mask(T, S, pad, window=window).may_attend
    assert may_attend is not None
    assert torch.equal(may_attend[:, 0], _by_definition(T, S, window, pad))  # (B, T, S)
    every = torch.ones(1, S, dtype=torch.long)
    assert torch.equal(causal_mask(T, S, window=window), _by_definition(T, S, window, every)[0])


@torch.no_grad()
def test_a_windowed_models_weights_follow_the_definition_through_a_cache() -> None:
    """A left-padded prefill into a KV cache, then decode steps: every layer's attention
    weights are nonzero exactly on the keys the definition gives each query."""
    torch.manual_seed(0)
    window = 3
    model = GPT(GPTConfig.from_name("nano", sliding_window=window)).eval()
    ids = torch.randint(0, 65, (3, 6))  # (B, P)
    pad = _left_pad_mask([6, 4, 1], 6)  # (B, S), S growing by one per step
    cache = model.new_cache(3, 9)
    for _ in range(4):
        trace = Trace(names=["attn_weights"])
        model(ids, attention_mask=pad, kv_cache=cache, trace=trace)
        expected = _by_definition(ids.shape[1], pad.shape[1], window, pad)  # (B, T, S)
        for layer in range(model.config.n_layer):
            weights = trace.get("attn_weights", layer)  # (B, nh, T, S)
            assert torch.equal(weights > 0, expected[:, None].expand_as(weights)), layer
        ids = torch.randint(0, 65, (3, 1))  # (B, 1)
        pad = torch.cat([pad, torch.ones(3, 1, dtype=torch.long)], dim=1)


def test_build_mask_rejects_mask_of_wrong_length() -> None:
    with pytest.raises(ValueError, match=r"covers 4 keys .* k_len=6"):
        build_mask(6, 6, torch.ones(2, 4))


def test_padding_mask_needs_2d() -> None:
    with pytest.raises(ValueError, match=r"\(B, S\)"):
        build_mask(3, 3, torch.ones(3))


# ------------------------------------------------------------ explicit == fused

CASES = {
    # name: (B, nh, nkv, T, S, causal, pad lengths or None)
    "no_mask": (2, 3, 3, 5, 5, False, None),
    "causal": (2, 3, 3, 7, 7, True, None),
    "padding_causal": (3, 2, 2, 6, 6, True, [6, 3, 1]),
    "cache_offset": (2, 2, 2, 3, 8, True, None),
    "cache_offset_padding": (2, 2, 2, 1, 8, True, [8, 2]),
    "encoder_padding": (2, 2, 2, 6, 6, False, [6, 4]),
    "cross_attention": (2, 4, 4, 5, 9, False, [9, 3]),
    "gqa": (2, 6, 2, 7, 7, True, [7, 5]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_explicit_equals_fused(case: str) -> None:
    B, nh, nkv, T, S, causal, lengths = CASES[case]
    q, k, v = _qkv(B, nh, nkv, T, S, hs=8)
    attention_mask = None if lengths is None else _left_pad_mask(lengths, S)
    mask = build_mask(T, S, attention_mask, causal=causal)
    explicit = attend(q, k, v, mask, fused=False)
    fused = attend(q, k, v, mask, fused=True)
    assert torch.isfinite(explicit).all() and torch.isfinite(fused).all()
    torch.testing.assert_close(explicit, fused, atol=ATOL, rtol=0)


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 3),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 3),
    T=st.integers(1, 9),
    extra=st.integers(0, 6),
    hs=st.sampled_from([1, 4, 16]),
    causal=st.booleans(),
    pad=st.lists(st.integers(0, 15), min_size=3, max_size=3) | st.none(),
    seed=st.integers(0, 2**16),
    window=st.sampled_from([None, 1, 2, 5]),
)
def test_explicit_equals_fused_property(
    B: int, kv_heads: int, group: int, T: int, extra: int, hs: int, causal: bool,
    pad: list[int] | None, seed: int, window: int | None,
) -> None:
    S = T + extra
    q, k, v = _qkv(B, kv_heads * group, kv_heads, T, S, hs, seed)
    attention_mask = None if pad is None else _left_pad_mask([min(n, S) for n in pad[:B]], S)
    window = window if causal else None  # a sliding window is causal
    mask = build_mask(T, S, attention_mask, causal=causal, window=window)
    explicit = attend(q, k, v, mask, fused=False)
    fused = attend(q, k, v, mask, fused=True)
    torch.testing.assert_close(explicit, fused, atol=ATOL, rtol=0)
    if mask.empty_rows is not None:
        # queries with no key to attend to give exactly zero, never NaN
        empty = mask.empty_rows.expand(B, q.shape[1], T, 1)
        assert torch.equal(explicit[empty.expand_as(explicit)], torch.zeros(int(empty.sum()) * hs))


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 3),
    kv_heads=st.integers(1, 3),
    group=st.integers(2, 4),
    T=st.integers(1, 6),
    extra=st.integers(0, 6),
    causal=st.booleans(),
    pad=st.lists(st.integers(0, 12), min_size=3, max_size=3) | st.none(),
    window=st.sampled_from([None, 1, 3]),
    sdpa_gqa=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_grouped_query_heads_equal_copied_out_heads(
    B: int, kv_heads: int, group: int, T: int, extra: int, causal: bool,
    pad: list[int] | None, window: int | None, sdpa_gqa: bool, seed: int,
) -> None:
    """Grouped-query k/v (SDPA's enable_gqa, its torch 2.4 fallback, the explicit path) give
    what copying each key/value head out to its query heads gives, under padding, sliding
    windows and cached keys (T < S)."""
    S = T + extra
    q, k, v = _qkv(B, kv_heads * group, kv_heads, T, S, 8, seed)
    attention_mask = None if pad is None else _left_pad_mask([min(n, S) for n in pad[:B]], S)
    mask = build_mask(T, S, attention_mask, causal=causal, window=window if causal else None)
    k_out, v_out = (t.repeat_interleave(group, dim=1) for t in (k, v))  # (B, nh, S, hs)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sdpa, "SDPA_GQA", sdpa_gqa and sdpa.SDPA_GQA)
        for fused in (True, False):
            torch.testing.assert_close(attend(q, k, v, mask, fused=fused),
                                       attend(q, k_out, v_out, mask, fused=fused),
                                       atol=ATOL, rtol=0)


class _Shapes(TorchDispatchMode):
    """Records the shape of every tensor an op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


@pytest.mark.parametrize("padded", [False, True])
def test_grouped_query_attention_copies_no_key_head_per_query_head(padded: bool) -> None:
    """A decode step of a GQA model reads its 2 key/value heads as they are: no (B, nh, S, hs)
    copy of the cache's k or v (the fused path, where SDPA takes enable_gqa)."""
    if not sdpa.SDPA_GQA:
        pytest.skip("torch < 2.5: SDPA takes no enable_gqa, the fused path copies k and v")
    B, nh, nkv, S, hs = 2, 6, 2, 16, 8
    q, k, v = _qkv(B, nh, nkv, 1, S, hs)
    mask = build_mask(1, S, _left_pad_mask([S, 5], S) if padded else None)
    with _Shapes() as seen:
        attend(q, k, v, mask, fused=True)
    assert (B, nh, S, hs) not in seen.shapes


def test_empty_rows_have_finite_gradients() -> None:
    q, k, v = _qkv(2, 2, 2, 5, 5, 4)
    for fused in (False, True):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        mask = build_mask(5, 5, _left_pad_mask([5, 2], 5))
        attend(qg, kg, vg, mask, fused=fused).sum().backward()
        for t in (qg, kg, vg):
            assert t.grad is not None and torch.isfinite(t.grad).all()


def test_dropout_only_in_training() -> None:
    q, k, v = _qkv(1, 1, 1, 6, 6, 4)
    mask = build_mask(6, 6)
    eval_out = attend(q, k, v, mask, dropout_p=0.5, training=False, fused=False)
    torch.testing.assert_close(eval_out, attend(q, k, v, mask, fused=False))
    torch.manual_seed(0)
    train_out = attend(q, k, v, mask, dropout_p=0.5, training=True, fused=False)
    assert not torch.allclose(train_out, eval_out)


def test_the_fused_path_drops_attention_weights_in_training() -> None:
    """Training runs the fused path (SDPA; `train.evaluate.fused_attention`): there, as on the
    explicit path, dropout zeroes attention weights, the rest scaled by 1 / (1 - p), the
    same under the same seed. With v the identity the context is the weights themselves."""
    B, nh, T, p = 4, 2, 16, 0.5
    q, k, _ = _qkv(B, nh, nh, T, T, T)
    v = torch.eye(T).expand(B, nh, T, T)  # (B, nh, S, hs = S): context = attn_weights
    mask = build_mask(T, T)
    weights = attend(q, k, v, mask, dropout_p=p, training=False)  # (B, nh, T, S)
    for fused in (True, False):
        torch.manual_seed(0)
        dropped = attend(q, k, v, mask, dropout_p=p, training=True, fused=fused)
        assert_dropped(dropped, weights, p)
        torch.manual_seed(0)
        assert torch.equal(attend(q, k, v, mask, dropout_p=p, training=True, fused=fused),
                           dropped)


def test_either_dropout_alone_changes_the_attention_output() -> None:
    """`dropout` also drops the attention's output (the residual branch, GPT-2's
    resid_pdrop): with the weights' dropout off that alone changes the output, element by
    element; with the output's off, the weights' changes it (fused, as training runs it)."""
    p = 0.5
    torch.manual_seed(0)
    attn = CausalSelfAttention(16, n_head=2, dropout=p)
    x = torch.randn(4, 8, 16)
    whole = attn.eval()(x)  # (B, T, C)
    attn.train()
    attn.dropout = 0.0  # the weights' dropout off
    torch.manual_seed(1)
    assert_dropped(attn(x), whole, p)
    attn.dropout, attn.out_dropout.p = p, 0.0  # the output's off
    torch.manual_seed(1)
    dropped = attn(x, fused=True)
    assert not torch.allclose(dropped, whole)
    torch.manual_seed(1)
    assert torch.equal(attn(x, fused=True), dropped)


# ------------------------------------------------------------------ seed 000: SDPA


def test_seed000_equals_sdpa_is_causal_and_bool_mask() -> None:
    torch.manual_seed(0)
    T, d = 5, 64
    x = torch.randn(1, 1, T, d)
    q, k, v = x * 0.9, x * 1.1, torch.randn(1, 1, T, d)
    ours = attend(q, k, v, build_mask(T, T), fused=False)
    sdpa_causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    tril = torch.tril(torch.ones(T, T)) == 1
    sdpa_bool = F.scaled_dot_product_attention(q, k, v, attn_mask=tril)
    assert torch.allclose(ours, sdpa_causal, atol=ATOL)
    assert torch.allclose(ours, sdpa_bool, atol=ATOL)


# --------------------------------------------------------- seed 001 / 004 numbers


def test_seed001_causal_attention_context_vectors() -> None:
    inputs = torch.tensor(
        [[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
         [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]]
    )
    batch = torch.stack((inputs, inputs, inputs), dim=0)  # (3, 6, 3)
    torch.manual_seed(123)
    ca = CausalSelfAttention(3, 2, n_head=1, bias=False, out_proj=False, dropout=0.0)
    for fused in (False, True):
        context = ca(batch, fused=fused)
        expected = torch.tensor(
            [[-0.4519, 0.2216], [-0.5874, 0.0058], [-0.6300, -0.0632],
             [-0.5675, -0.0843], [-0.5526, -0.0981], [-0.5299, -0.1081]]
        )
        assert context.shape == (3, 6, 2)
        torch.testing.assert_close(context, expected.expand(3, 6, 2), atol=1e-4, rtol=0)


def test_seed004_single_head_weights() -> None:
    torch.manual_seed(1337)
    B, T, C, head_size = 4, 8, 32, 16
    inputs = torch.randn(B, T, C)
    key_repr = torch.nn.Linear(C, head_size, bias=False)  # the seed builds key first
    query_repr = torch.nn.Linear(C, head_size, bias=False)
    head = CausalSelfAttention(C, head_size, n_head=1, bias=False, out_proj=False, scale=1.0)
    with torch.no_grad():
        head.query.weight.copy_(query_repr.weight)
        head.key.weight.copy_(key_repr.weight)
    trace = Trace()
    head(inputs, trace=trace)
    expected = torch.tensor([
        [1.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000],
        [0.1574, 0.8426, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000],
        [0.2088, 0.1646, 0.6266, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000],
        [0.5792, 0.1187, 0.1889, 0.1131, 0.0000, 0.0000, 0.0000, 0.0000],
        [0.0294, 0.1052, 0.0469, 0.0276, 0.7909, 0.0000, 0.0000, 0.0000],
        [0.0176, 0.2689, 0.0215, 0.0089, 0.6812, 0.0019, 0.0000, 0.0000],
        [0.1691, 0.4066, 0.0438, 0.0416, 0.1048, 0.2012, 0.0329, 0.0000],
        [0.0210, 0.0843, 0.0555, 0.2297, 0.0573, 0.0709, 0.2423, 0.2391],
    ])
    weights = trace.get("attn_weights")  # (B, nh, T, T)
    torch.testing.assert_close(weights[0, 0], expected, atol=1e-4, rtol=0)


# ------------------------------------------------------------------------ module


def test_module_cross_attention_and_encoder_paths_agree() -> None:
    torch.manual_seed(0)
    x, ctx = torch.randn(2, 5, 16), torch.randn(2, 9, 12)
    ctx_mask = _left_pad_mask([9, 4], 9)
    cross = CausalSelfAttention(16, 16, n_head=4, d_context=12).eval()
    torch.testing.assert_close(
        cross(x, ctx_mask, context=ctx, fused=False), cross(x, ctx_mask, context=ctx, fused=True),
        atol=ATOL, rtol=0,
    )
    encoder = CausalSelfAttention(16, 16, n_head=4, causal=False).eval()
    out = encoder(x, fused=False)
    # no causal mask: the first token sees the last one
    x2 = x.clone()
    x2[:, -1] += 1.0
    assert not torch.allclose(encoder(x2)[:, 0], out[:, 0])


def test_module_causal_first_token_ignores_future() -> None:
    torch.manual_seed(0)
    attn = CausalSelfAttention(16, 16, n_head=4, n_kv_head=2).eval()
    x = torch.randn(1, 6, 16)
    x2 = x.clone()
    x2[:, 3:] = torch.randn(1, 3, 16)
    torch.testing.assert_close(attn(x)[:, :3], attn(x2)[:, :3])


def test_module_rejects_bad_head_counts() -> None:
    with pytest.raises(ValueError, match="d_out=10 is not divisible by n_head=3"):
        CausalSelfAttention(10, n_head=3)
    with pytest.raises(ValueError, match="n_head=4 is not a multiple of n_kv_head=3"):
        CausalSelfAttention(12, n_head=4, n_kv_head=3)


def test_attend_rejects_mismatched_shapes() -> None:
    q, k, v = _qkv(1, 2, 2, 3, 3, 4)
    with pytest.raises(ValueError, match="do not fit"):
        attend(q, k[..., :2], v[..., :2])
    with pytest.raises(ValueError, match="4-d"):
        attend(q[0], k, v)


def test_mask_none_means_full_attention() -> None:
    q, k, v = _qkv(1, 1, 1, 4, 4, 8)
    torch.testing.assert_close(
        attend(q, k, v, Mask(None), fused=False), F.scaled_dot_product_attention(q, k, v),
        atol=ATOL, rtol=0,
    )
