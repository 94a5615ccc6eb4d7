"""Attention sinks (gpt-oss's learned logit per head, `GPTConfig.attn_sinks`): the softmax by
its definition, and every path that computes it (whole, tiles, traced, streamed summaries,
kept heads and rows, the decode step) giving the same weights and context."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import GPT, GPTConfig, Trace
from attnlab.model import summaries
from attnlab.model.attention import attend
from attnlab.model.explicit import _whole
from attnlab.model.layers import sink_softmax
from attnlab.model.masks import build_mask
from attnlab.model.sdpa import expand_kv
from attnlab.model.traced_attention import tiled_attend


def _by_definition(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """exp(s_ij) / (sum_j exp(s_ij) + exp(sink_h)), in float64."""
    s = scores.double()
    top = torch.maximum(s.amax(-1, keepdim=True), sinks.double().view(1, -1, 1, 1))
    e = (s - top).exp()  # (B, nh, T, S)
    return e / (e.sum(-1, keepdim=True) + (sinks.double().view(1, -1, 1, 1) - top).exp())


def test_the_softmax_is_its_definition_and_a_row_masked_everywhere_is_zero() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 5, 7, generator=g) * 4  # (B, nh, T, S)
    sinks = torch.tensor([-2.0, 0.0, 3.0])  # (nh,)
    scores[0, :, 1] = float("-inf")  # a row with nothing to attend to
    weights = sink_softmax(scores, sinks)  # (B, nh, T, S)
    torch.testing.assert_close(weights.double(), _by_definition(scores, sinks), atol=1e-6,
                               rtol=0)
    assert torch.equal(weights[0, :, 1], torch.zeros(3, 7))
    assert (weights.sum(-1) < 1).all()  # the sink took its share of every row
    assert torch.equal(sink_softmax(scores[1], None), torch.softmax(scores[1], -1))


def _case(B: int, nh: int, nkv: int, T: int, S: int, lengths: list[int],
          window: int | None, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, nh, T, 8, generator=g)
    k, v = (torch.randn(B, nkv, S, 8, generator=g) for _ in range(2))
    sinks = torch.randn(nh, generator=g) * 2  # (nh,)
    attention_mask = torch.zeros(B, S, dtype=torch.long)  # (B, S)
    for b, n in enumerate(lengths):
        attention_mask[b, S - n:] = 1  # left padding
    return q, k, v, sinks, build_mask(T, S, attention_mask, window=window)


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 3), heads=st.sampled_from([(2, 2), (4, 2), (4, 1)]),
       S=st.integers(1, 30), cached=st.integers(0, 10), data=st.data(),
       window=st.sampled_from([None, 1, 3]), tile=st.sampled_from([8, 64, 1 << 20]),
       seed=st.integers(0, 99))
def test_every_path_gives_the_whole_paths_weights_and_context(
        B: int, heads: tuple[int, int], S: int, cached: int, data: st.DataObject,
        window: int | None, tile: int, seed: int) -> None:
    """Through left padding, windows, grouped-query heads and cached keys: the tiles (a
    forward without autograd), the traced weights, the streamed summaries (tiles that split
    the heads) all give what the whole path does, and the whole path's weights are the
    definition's."""
    nh, nkv = heads
    T = max(1, S - cached)
    lengths = data.draw(st.lists(st.integers(1, S), min_size=B, max_size=B))
    q, k, v, sinks, mask = _case(B, nh, nkv, T, S, lengths, window, seed)
    may_attend = mask.may_attend
    if may_attend is not None and mask.empty_rows is not None:  # as `attend` lets them through
        may_attend = may_attend | mask.empty_rows
    saved = summaries.TILE_BYTES["cpu"]
    summaries.TILE_BYTES["cpu"] = 4 * tile
    try:
        with torch.no_grad():
            whole = _whole(q, k, v, mask, may_attend, 0.3, 0.0, None, sinks)  # (B, nh, T, 8)
            tiled = tiled_attend(q, expand_kv(k, nh), expand_kv(v, nh), mask, may_attend, 0.3,
                                 None, sinks)  # (B, nh, T, 8)
            trace = Trace(names=["attn_weights"])
            traced = attend(q, k, v, mask, scale=0.3, trace=trace.layer(0), sinks=sinks)
            streamed = Trace(names=["attn_entropy", "attn_max", "attn_learned_sink"])
            attend(q, k, v, mask, scale=0.3, trace=streamed.layer(0), sinks=sinks)
    finally:
        summaries.TILE_BYTES["cpu"] = saved
    atol = 1e-6 * float(v.abs().max())
    torch.testing.assert_close(tiled, whole, atol=atol, rtol=1e-5)
    torch.testing.assert_close(traced, whole, atol=atol, rtol=1e-5)
    weights = trace.get("attn_weights", 0)  # (B, nh, T, S)
    scores = (q @ expand_kv(k, nh).transpose(-2, -1)) * 0.3  # (B, nh, T, S)
    expected = _by_definition(scores.masked_fill(~may_attend, float("-inf"))
                              if may_attend is not None else scores, sinks)
    if mask.empty_rows is not None:
        expected = expected.masked_fill(mask.empty_rows, 0.0)
    torch.testing.assert_close(weights.double(), expected, atol=1e-6, rtol=0)
    real = torch.ones(B, 1, T, 1, dtype=torch.bool) if mask.empty_rows is None else (
        ~mask.empty_rows)  # (B, 1, T, 1)
    entropy = -torch.where(weights > 0, weights * weights.log(), 0.0).sum(-1)  # (B, nh, T)
    torch.testing.assert_close(streamed.get("attn_entropy", 0) * real[..., 0],
                               entropy * real[..., 0], atol=1e-5, rtol=0)
    torch.testing.assert_close(streamed.get("attn_max", 0) * real[..., 0],
                               weights.amax(-1) * real[..., 0], atol=1e-6, rtol=0)
    # the sink's share by its own definition: exp(sink) / (sum_j exp(s_ij) + exp(sink))
    masked = scores if may_attend is None else scores.masked_fill(~may_attend, float("-inf"))
    sink = sinks.double().view(1, -1, 1)  # (1, nh, 1)
    share = torch.sigmoid(sink - masked.double().logsumexp(-1))  # (B, nh, T)
    torch.testing.assert_close(streamed.get("attn_learned_sink", 0).double(),
                               share * real[..., 0], atol=1e-6, rtol=0)


def _sinks_model() -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=4, n_kv_head=2,
                       n_embd=32, pos="rope", norm="rmsnorm", mlp="clamped_swiglu",
                       swiglu_limit=1.0, bias=True, attn_sinks=True, sliding_window=5,
                       window_layers=[0], init_std=0.3)
    return GPT(config).eval()


def test_the_sinks_learn_and_a_cached_decode_is_the_forward() -> None:
    model = _sinks_model()
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(1))
    model.train()
    out = model(ids[:, :-1], targets=ids[:, 1:])
    out.loss.backward()
    for block in model.blocks:
        assert block.attn.sinks.grad is not None and block.attn.sinks.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        full = model(ids).logits  # (B, T, V)
        assert torch.equal(model(ids, fused=False).logits, full)  # sinks: explicit either way
        cache = model.new_cache(2, 12)
        model(ids[:, :7], kv_cache=cache)
        steps = [model(ids[:, t:t + 1], kv_cache=cache).logits[:, 0] for t in range(7, 12)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 7:], atol=1e-5, rtol=1e-5)
    sunk = Trace(names=["attn_weights"])
    model(ids, trace=sunk)
    weights = sunk.get("attn_weights", 1)  # (B, nh, T, S)
    assert (weights.sum(-1) < 1).all() and weights.sum(-1).min() < 0.5  # the sink's shares
    padded = Trace(names=["attn_learned_sink"])  # a left pad's row gives its sink nothing
    model(ids, attention_mask=torch.tensor([[0, 0] + [1] * 10, [1] * 12]), trace=padded)
    shares = padded.get("attn_learned_sink", 1)  # (B, nh, T)
    assert (shares[0, :, :2] == 0).all() and (shares[0, :, 2:] > 0).all()
    plain, none = GPT(dataclasses.replace(model.config, attn_sinks=False)), Trace()
    plain(ids, trace=none)
    with pytest.raises(KeyError, match="has no learned sinks"):
        none.get("attn_learned_sink", 0)
    # a trace of one head alone (the others' context fused) and of some rows alone
    one, rows = Trace(names=["attn_weights"], heads=[2]), Trace(names=["attn_weights"],
                                                                rows=[3, 9])
    torch.testing.assert_close(model(ids, trace=one).logits, full, atol=1e-5, rtol=1e-5)
    model(ids, trace=rows)
    torch.testing.assert_close(one.get("attn_weights", 1)[:, 0], weights[:, 2], atol=1e-6,
                               rtol=0)
    torch.testing.assert_close(rows.get("attn_weights", 1), weights[:, :, [3, 9]], atol=1e-6,
                               rtol=0)


def test_the_heads_overview_shows_the_learned_sinks_share() -> None:
    """head_summaries (inspect --summary, show(summary=True), the viewer's overview) holds the
    mean share of each head's sink, equal to 1 - the weights' row sums; a share on 0..1."""
    from attnlab.interp.heads import extreme_heads, head_summaries
    from attnlab.viewer.payloads import overview_payload

    model = _sinks_model()
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(2))
    means = head_summaries(model, ids)  # {name: (n_layer, nh)}
    weights = Trace(names=["attn_weights"]).run(model, ids)
    for layer in range(2):
        expected = (1 - weights.get("attn_weights", layer).sum(-1)).mean(dim=(0, 2))  # (nh,)
        torch.testing.assert_close(means["attn_learned_sink"][layer], expected, atol=1e-6,
                                   rtol=0)
    data = overview_payload(means, [0, 1], [0, 1, 2, 3], rows=12)
    assert data["summary_labels"]["attn_learned_sink"] == "weight on the learned sink"
    assert "attn_learned_sink" in data["summary_shares"]
    assert any(what == "most weight on the learned sink" for what, _ in extreme_heads(means))


def test_the_steps_figure_names_the_sink() -> None:
    pytest.importorskip("matplotlib")
    from attnlab import viz

    model = _sinks_model()
    trace = Trace(names=["attn_scores", "masked_scores", "attn_weights"]).run(
        model, torch.arange(6)[None])
    fig = viz.plot_attention_steps(*(trace.get(n, 0)[0, 0] for n in (
        "attn_scores", "masked_scores", "attn_weights")), list("abcdef"), scale=0.25,
        sinks=True)
    assert fig.axes[2].get_title() == "softmax([masked × 0.25, sink])"


def test_a_sink_at_minus_infinity_is_no_sink() -> None:
    """Every sink set to -inf: the logits of the same weights' model without sinks, bit for
    bit on the explicit path (the intervention docs/interventions.md names)."""
    model = _sinks_model()
    plain = GPT(dataclasses.replace(model.config, attn_sinks=False)).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items()
                           if not k.endswith("attn.sinks")})
    ids = torch.randint(0, 40, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for block in model.blocks:
            block.attn.sinks.fill_(float("-inf"))
        assert torch.equal(model(ids).logits, plain(ids, fused=False).logits)
