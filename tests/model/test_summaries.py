"""model/summaries.py and the traced path's tiles: every per-head summary equals the same
quantity computed from a traced `attn_weights`, over random models (GQA, rotary, QK-norm,
sliding windows), left and right padding, KV-cache splits and tile sizes; a trace of
summaries alone never makes a (B, nh, T, S) tensor; the one-block (GPU) split gives the
CPU split's weights."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab import GPT, CausalSelfAttention, GPTConfig, Trace, build_mask
from attnlab.interp.edits import Edit, Edits
from attnlab.model import summaries, summary_kernels, traced_attention
from attnlab.model.summaries import SUMMARY_NAMES
from helpers import modern_switches

TOLERANCE = dict(atol=1e-5, rtol=1e-5)  # float32; distances and received weights exceed 1


def _model(n_kv_head: int = 4, dtype: torch.dtype = torch.float32, **switches: Any) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig.from_name("nano", n_head=4, n_kv_head=n_kv_head, **switches)
    return GPT(config).eval().to(dtype)


def reference(weights: torch.Tensor, padding: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The five summaries of weights (B, nh, T, S), written out in float64 from their
    definitions; padding (B, S) 1/0: pad queries read as rows of 0, the sink at the first 1."""
    w = weights.double()
    B, _, T, S = w.shape
    first = torch.zeros(B, dtype=torch.long)
    if padding is not None:
        w = w * padding[:, S - T:].double()[:, None, :, None]  # (B, nh, T, S)
        first = padding.int().argmax(-1)  # (B,)
    query = torch.arange(S - T, S)[:, None]  # (T, 1): the query's own key index
    key = torch.arange(S)[None, :]  # (1, S)
    return {
        "attn_entropy": -torch.special.xlogy(w, w).sum(-1),  # 0 log 0 = 0
        "attn_sink": w[torch.arange(B), :, :, first],  # (B, nh, T)
        "attn_received": w.sum(-2),
        "attn_distance": (w * (query - key)).sum(-1),
        "attn_max": w.amax(-1),
    }


def _traced(model: GPT, ids: torch.Tensor, mask: torch.Tensor | None, P: int,
            names: list[str], **trace: Any) -> Trace:
    """A trace of `names` over ids[:, P:], after a prefill of ids[:, :P] into a cache."""
    cache = model.new_cache(ids.shape[0], ids.shape[1])
    if P:
        model(ids[:, :P], attention_mask=None if mask is None else mask[:, :P], kv_cache=cache)
    out = Trace(names=names, **trace)
    model(ids[:, P:], attention_mask=mask, kv_cache=cache, trace=out)
    return out


@st.composite
def batches(draw: Any) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(ids (B, P + T), attention mask or None, P cached columns): left pads (rows that may
    be all pad up to one token), and sometimes right pads."""
    B, P, T = draw(st.integers(1, 3)), draw(st.integers(0, 6)), draw(st.integers(1, 12))
    S = P + T
    ids = torch.randint(0, 65, (B, S), generator=torch.Generator().manual_seed(S * B))
    if draw(st.booleans()):
        return ids, None, P
    mask = torch.ones(B, S, dtype=torch.long)
    for b in range(B):
        left = draw(st.integers(0, S - 1))
        right = draw(st.sampled_from([0, 0, 1, 2]))
        mask[b, :left] = 0
        mask[b, max(left + 1, S - right):] = 0  # at least one real token per row
    return ids, mask, P


@settings(max_examples=40, deadline=None)
@given(switches=modern_switches(), n_kv_head=st.sampled_from([1, 2, 4]), batch=batches(),
       tile_rows=st.sampled_from([1, 2, 5, 64]), block_rows=st.sampled_from([1, 3, 128]))
def test_summaries_equal_the_reference_from_the_traced_weights(
    switches: dict[str, Any], n_kv_head: int, batch: tuple, tile_rows: int, block_rows: int
) -> None:
    """Streamed (summaries alone, tiles of `tile_rows` queries) and beside the weights (blocks
    of `block_rows`), every summary equals its definition applied to the traced weights."""
    model = _model(n_kv_head, **switches)
    ids, mask, P = batch
    nh, S = 4, ids.shape[1]
    tile = {"cpu": 4 * ids.shape[0] * nh * S * tile_rows}
    with mock.patch.dict(summaries.TILE_BYTES, tile), \
            mock.patch.object(traced_attention, "BLOCK_ROWS", block_rows):
        weights = _traced(model, ids, mask, P, ["attn_weights"])
        streamed = _traced(model, ids, mask, P, list(SUMMARY_NAMES))
        beside = _traced(model, ids, mask, P, ["attn_weights", *SUMMARY_NAMES])
    for layer in range(model.config.n_layer):
        expected = reference(weights.get("attn_weights", layer), mask)
        for name in SUMMARY_NAMES:
            for trace in (streamed, beside):
                got = trace.get(name, layer)
                assert got.dtype == torch.float32, name
                torch.testing.assert_close(got.double(), expected[name], **TOLERANCE,
                                           msg=lambda m, n=name, la=layer: f"{n}@{la}: {m}")


def test_known_values_by_hand() -> None:
    """Uniform attention (all q/k weights 0): a row of n visible keys has entropy log n, max
    and sink 1/n, distance (n - 1) / 2; key j of T receives sum_{i >= j} 1 / (i + 1); a left
    pad's row is all 0 and its sink is the first real key."""
    model = _model()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.query.weight.zero_()
            if block.attn.query.bias is not None:
                block.attn.query.bias.zero_()
    ids = torch.randint(0, 65, (2, 6))
    mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])
    trace = Trace(names=list(SUMMARY_NAMES)).run(model, ids, mask)
    n = torch.tensor([[1.0, 2, 3, 4, 5, 6], [0, 0, 1, 2, 3, 4]])  # visible keys per query
    seen = n.clamp(min=1)
    real = (n > 0).float()
    received = torch.tensor([[sum(1 / i for i in range(j + 1, 7)) for j in range(6)],
                             [0, 0, *(sum(1 / i for i in range(j + 1, 5)) for j in range(4))]])
    expected = {"attn_entropy": seen.log() * real, "attn_max": real / seen,
                "attn_sink": real / seen, "attn_distance": (n - 1).clamp(min=0) / 2,
                "attn_received": received}
    for name, value in expected.items():
        got = trace.get(name, 1)  # (B, nh, T): every head alike
        torch.testing.assert_close(got, value[:, None].expand_as(got), atol=1e-6, rtol=1e-6)


class _Shapes(TorchDispatchMode):
    """Every tensor shape an op makes while the mode is on."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.made.append(tuple(t.shape))
        return out


@pytest.mark.parametrize("device_type", ["cpu", "one block"])
def test_a_trace_of_summaries_alone_never_makes_the_weights(
    device_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(B, nh, T, S) = (2, 4, 48, 48): no op of a summaries trace makes a tensor of half its
    elements, on the CPU split or the one-block (GPU) split; a weights trace does."""
    if device_type == "one block":
        monkeypatch.setattr(traced_attention, "ONE_BLOCK", {"cpu"})
    model = _model(n_kv_head=2, block_size=48)
    ids = torch.randint(0, 65, (2, 48))
    mask = torch.ones(2, 48, dtype=torch.long)
    mask[1, :5] = 0
    full = 2 * 4 * 48 * 48
    monkeypatch.setitem(summaries.TILE_BYTES, "cpu", 4 * full // 16)  # 3 rows per tile
    for names, makes_weights in ((list(SUMMARY_NAMES), False), (["attn_weights"], True)):
        shapes = _Shapes()
        with shapes:
            Trace(names=names).run(model, ids, mask)
        largest = max(torch.Size(s).numel() for s in shapes.made)
        assert (largest >= full // 2) == makes_weights, (names, largest)


@settings(max_examples=200, deadline=None)
@given(B=st.integers(1, 6), nh=st.integers(1, 12), T=st.integers(1, 300),
       extra=st.integers(0, 300), tile=st.integers(1, 1 << 16))
def test_a_streamed_tile_fits_its_bytes_and_fills_them(
    B: int, nh: int, T: int, extra: int, tile: int
) -> None:
    """`stream_tile`'s (rows, heads) of (B, nh, T, S) weights: at most a tile of elements
    (but one row of one head, whatever its size), no fewer than BLOCK_ROWS rows while heads
    can be split off instead, and as much as fits: one more head, or with every head one
    more row, would pass the tile. (A tile B times too large, or a head short, changes no
    value, only the memory and speed `summaries.TILE_BYTES` is set for.)"""
    S = T + extra
    with mock.patch.dict(summaries.TILE_BYTES, {"cpu": 4 * tile}):
        rows, heads = traced_attention.stream_tile(torch.empty(B, nh, T, 1), S)
    per_row = B * S  # elements of one query row of one head
    assert 1 <= rows <= T and 1 <= heads <= nh
    assert rows * heads * per_row <= max(tile, per_row)
    least = min(T, traced_attention.BLOCK_ROWS)
    if least * per_row <= tile:
        assert rows >= least
    if heads < nh:
        assert (heads + 1) * rows * per_row > tile
    elif rows < T:
        assert heads * (rows + 1) * per_row > tile


def test_bfloat16_models_reduce_in_float32() -> None:
    """A bfloat16 model's summaries are float32 and equal the reference from its weights
    within bfloat16's rounding of those weights (2**-8 relative)."""
    model = _model(n_kv_head=2, dtype=torch.bfloat16, pos="rope", qk_norm=True)
    ids, mask = torch.randint(0, 65, (2, 20)), torch.ones(2, 20, dtype=torch.long)
    mask[0, :7] = 0
    weights = Trace(names="attn_weights").run(model, ids, mask)
    streamed = Trace(names=list(SUMMARY_NAMES)).run(model, ids, mask)
    for layer in range(model.config.n_layer):
        expected = reference(weights.get("attn_weights", layer), mask)
        for name in SUMMARY_NAMES:
            got = streamed.get(name, layer)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got.double(), expected[name], atol=2e-2, rtol=2e-2)


def test_summaries_of_edited_weights_are_of_what_the_model_used() -> None:
    """An edit of attn_weights (a uniform pattern on head 1) changes the summaries with the
    weights; a summary itself cannot be edited."""
    model = _model()
    ids = torch.randint(0, 65, (1, 8))
    uniform = Edit("attn_weights", 0, lambda w, _: torch.tril(torch.ones_like(w)) /
                   torch.tril(torch.ones_like(w)).sum(-1, keepdim=True), heads=(1,))
    trace = Trace(layers=0, names=["attn_weights", *SUMMARY_NAMES])
    model(ids, trace=trace, edits=Edits([uniform]))
    expected = reference(trace.get("attn_weights", 0), None)
    for name in SUMMARY_NAMES:
        torch.testing.assert_close(trace.get(name, 0).double(), expected[name], **TOLERANCE)
    torch.testing.assert_close(trace.get("attn_entropy", 0)[0, 1],
                               torch.arange(1, 9).float().log())
    with pytest.raises(ValueError, match="'attn_entropy' is a summary the model never reads"):
        Edit("attn_entropy", 0, lambda w, _: w)


def test_edited_bfloat16_weights_are_summarised_in_float32() -> None:
    """The summaries of a bfloat16 model's edited weights (bfloat16, as the edit returns
    them) are reduced in float32 too: float32's rounding of the sums of those very weights,
    not bfloat16's (2**-8 relative, over 32 keys)."""
    model = _model(dtype=torch.bfloat16)
    ids = torch.randint(0, 65, (2, 32), generator=torch.Generator().manual_seed(0))
    halved = Edit("attn_weights", 0, lambda w, _: w * 0.5)  # a new bfloat16 tensor
    trace = Trace(layers=0, names=["attn_weights", *SUMMARY_NAMES])
    model(ids, trace=trace, edits=Edits([halved]))
    assert trace.get("attn_weights", 0).dtype == torch.bfloat16
    expected = reference(trace.get("attn_weights", 0), None)
    for name in SUMMARY_NAMES:
        torch.testing.assert_close(trace.get(name, 0).double(), expected[name], **TOLERANCE,
                                   msg=lambda m, n=name: f"{n}: {m}")


def test_entropy_counts_weights_far_below_any_eps() -> None:
    """attn_entropy is -sum w log w over every w > 0: a peaked row whose other 4095 weights
    are 1e-9 each gets their 4095e-9 * 20.7 nats, within float32's rounding of the sum
    (clamping w to an eps such as 1e-6 before the log would read log(1e-6) = -13.8)."""
    S = 4096
    w = torch.full((1, 1, 1, S), 1e-9, dtype=torch.float64)
    w[..., 0] = 1 - (S - 1) * 1e-9
    sums = summaries.Summaries(["attn_entropy"], (1, 1, 1, S), None, dtype=torch.float32,
                               device=torch.device("cpu"))
    w = w.float()
    sums.add(w, 0, 0)
    expected = -torch.special.xlogy(w.double(), w.double()).sum(-1)  # (1, 1, 1)
    torch.testing.assert_close(sums.values["attn_entropy"].double(), expected, atol=0,
                               rtol=1e-4)


@settings(max_examples=15, deadline=None)
@given(switches=modern_switches(), batch=batches())
def test_one_block_split_gives_the_cpu_splits_weights(
    switches: dict[str, Any], batch: tuple
) -> None:
    """The GPU's split (every query in one block, `ONE_BLOCK`) forced on the CPU: the same
    weights, summaries and logits as the CPU's blocks of `BLOCK_ROWS` (here 3)."""
    model = _model(n_kv_head=2, **switches)
    ids, mask, P = batch
    names = ["attn_weights", "context", "block_out", *SUMMARY_NAMES]
    with mock.patch.object(traced_attention, "BLOCK_ROWS", 3):
        blocks = _traced(model, ids, mask, P, names)
        with mock.patch.object(traced_attention, "ONE_BLOCK", {"cpu"}):
            one = _traced(model, ids, mask, P, names)
    assert blocks.values.keys() == one.values.keys()
    for key, value in blocks.values.items():
        torch.testing.assert_close(one.values[key], value, atol=1e-5, rtol=1e-5,
                                   msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.cuda
def test_cuda_weights_equal_the_cpu_path() -> None:
    """On a GPU the traced pass runs one block per layer; its weights and summaries equal the
    CPU's blocked ones to 1e-5 (float32, left padding, grouped heads, a sliding window)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = _model(n_kv_head=2, sliding_window=5, window_layers=[1], block_size=256)
    ids = torch.randint(0, 65, (2, 200))
    mask = torch.ones(2, 200, dtype=torch.long)
    mask[1, :37] = 0
    names = ["attn_weights", *SUMMARY_NAMES]
    cpu = Trace(names=names).run(model, ids, mask)
    gpu = Trace(names=names).run(model.cuda(), ids.cuda(), mask.cuda())
    for key, value in cpu.values.items():
        torch.testing.assert_close(gpu.values[key].cpu(), value, atol=1e-5, rtol=1e-5,
                                   msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.parametrize("names", [["attn_weights"], list(SUMMARY_NAMES)])
def test_a_head_filter_computes_the_kept_heads_alone(
    names: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trace(heads=[3]) of the weights or summaries (grouped heads, left padding): the same
    values as the whole trace's head 3, and no op makes a tensor of half the (B, nh, T, S)
    weights (the context comes from the fused path)."""
    model = _model(n_kv_head=2, block_size=48)
    ids = torch.randint(0, 65, (2, 48))
    mask = torch.ones(2, 48, dtype=torch.long)
    mask[1, :9] = 0
    monkeypatch.setitem(summaries.TILE_BYTES, "cpu", 4 * 2 * 48 * 48 // 4)
    whole = Trace(names=names).run(model, ids, mask)
    shapes = _Shapes()
    with shapes:
        one = Trace(heads=[3], names=names).run(model, ids, mask)
    full = 2 * 4 * 48 * 48  # (B, nh, T, S)
    assert max(torch.Size(s).numel() for s in shapes.made) < full // 2
    assert one.values.keys() == whole.values.keys()
    for (layer, name), value in whole.values.items():
        assert one.values[layer, name].shape[1] == 1
        # layer 0 alike bit for bit; later layers read a fused context (float rounding)
        torch.testing.assert_close(one.values[layer, name], value[:, [3]],
                                   **({"atol": 0, "rtol": 0} if layer == 0 else TOLERANCE))


CROSS_NAMES = [name for name in SUMMARY_NAMES if name != "attn_distance"]


@settings(max_examples=30, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 9), S=st.integers(1, 9),
       n_kv_head=st.sampled_from([1, 2]), padded=st.booleans(), seed=st.integers(0, 2**16))
def test_cross_attention_summaries_read_every_query_row(
    B: int, T: int, S: int, n_kv_head: int, padded: bool, seed: int
) -> None:
    """Cross-attention (queries from another sequence, T > S too): no query is a pad key, so
    every row's summaries are its weights' (none read as a pad's zeros); the sink is the
    context row's first real key."""
    torch.manual_seed(seed)
    attn = CausalSelfAttention(8, 8, n_head=2, n_kv_head=n_kv_head, d_context=6).eval()
    x, context = torch.randn(B, T, 8), torch.randn(B, S, 6)
    mask = None
    if padded:  # left and right pads over the context, at least one real key per row
        mask = torch.zeros(B, S, dtype=torch.long)
        for b in range(B):
            left = int(torch.randint(0, S, ()))
            mask[b, left:int(torch.randint(left + 1, S + 1, ()))] = 1
    weights, alone, beside = (Trace(names=names) for names in (
        ["attn_weights"], CROSS_NAMES, ["attn_weights", *CROSS_NAMES]))
    for trace in (weights, alone, beside):
        attn(x, mask, context=context, trace=trace)
    w = weights.get("attn_weights").double()  # (B, nh, T, S)
    first = torch.zeros(B, dtype=torch.long) if mask is None else mask.argmax(-1)  # (B,)
    expected = {"attn_entropy": -torch.special.xlogy(w, w).sum(-1),
                "attn_sink": w[torch.arange(B), :, :, first], "attn_received": w.sum(-2),
                "attn_max": w.amax(-1)}
    for name in CROSS_NAMES:
        for trace in (alone, beside):
            torch.testing.assert_close(trace.get(name).double(), expected[name], **TOLERANCE)


def test_cross_attention_refuses_attn_distance() -> None:
    """A query of another sequence has no key index, so no distance to a key: asked for by
    name, the error names cross-attention and the summaries that remain; a default trace
    (every name) goes without it and keeps the others."""
    attn = CausalSelfAttention(8, 8, n_head=2, d_context=6).eval()
    x, context = torch.randn(1, 5, 8), torch.randn(1, 3, 6)
    with pytest.raises(ValueError, match="attn_distance has no meaning in cross-attention"):
        attn(x, context=context, trace=Trace(names=["attn_distance"]))
    every = Trace()
    attn(x, context=context, trace=every)
    assert sorted(name for layer, name in every.values if name in SUMMARY_NAMES) == sorted(
        CROSS_NAMES)


def test_cross_attention_masks_keep_away_from_the_summary_kernels() -> None:
    """The kernels read query row r as key S - T + r: a cross-attention mask is not theirs."""
    assert traced_attention.kernel_mask(build_mask(5, 3, causal=False))
    assert not traced_attention.kernel_mask(build_mask(5, 3, causal=False, cross=True))
    with pytest.raises(ValueError, match="pass causal=False"):
        build_mask(5, 3, cross=True)


def test_sdpa_choice_is_a_backend_member() -> None:
    """`attend_with_lse` picks its kernel by comparing the choice with `SDPBackend` members:
    torch returns a plain int, which equals none of them (on a GPU every choice then read as
    "no fused kernel", and `LSE_FROM_FORWARD` silently fell back)."""
    q = torch.randn(1, 2, 8, 16)
    choice = summary_kernels.sdpa_choice(q, q, q, 0.25)
    assert choice == SDPBackend.FLASH_ATTENTION  # a CPU's fused kernel for float32
