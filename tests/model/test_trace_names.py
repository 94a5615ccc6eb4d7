"""Every name in trace.NAMES, against the issue's list: values, shapes, masks and filters.

tests/test_trace.py covers the nano model without a cache; this file adds seed 002's
minimal model (no output projection, no residual), grouped-query heads, KV-cache decode
steps, training-mode dropout and the filters' exact contents.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import GPT, CausalSelfAttention, GPTConfig, Trace
from attnlab.model.layers import GELUS
from attnlab.model.names import HEAD_NAMES, MODEL_NAMES, NAMES, absent_names
from attnlab.model.rope import apply_rotary
from attnlab.model.summaries import SUMMARY_NAMES
from helpers import modern_switches


def _model(name: str = "nano", **overrides: object) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name(name, **overrides)).eval()


def _ids(model: GPT, B: int, T: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, model.config.vocab_size, (B, T), generator=gen)


@pytest.mark.parametrize(
    "name, overrides",
    [("nano", {}), ("nano", {"n_head": 4, "n_kv_head": 2}),
     ("seed-minimal", {"vocab_size": 17, "n_embd": 5})],
)
def test_traced_logits_equal_untraced(name: str, overrides: dict) -> None:
    model = _model(name, **overrides)
    idx = _ids(model, 3, model.config.block_size)
    plain = model(idx).logits  # fused path
    for trace in (Trace(), Trace(layers=[0]), Trace(heads=[0], names=["attn_weights"])):
        traced = model(idx, trace=trace).logits  # explicit path where traced
        torch.testing.assert_close(traced, plain, atol=1e-5, rtol=0)


def test_traced_values_recompute_the_block() -> None:
    """The captured steps are the ones attention computed: each follows from the last."""
    model = _model("seed-minimal", vocab_size=17, n_embd=5)
    trace = Trace()
    out = model(_ids(model, 2, 4), trace=trace).logits
    get = trace.get
    torch.testing.assert_close(get("emb"), get("tok_emb") + get("pos_emb"))
    q, k, v = get("q", 0), get("k", 0), get("v", 0)
    torch.testing.assert_close(get("attn_scores", 0), q @ k.transpose(-2, -1))
    weights = torch.softmax(get("masked_scores", 0) * model.config.attn_scale, dim=-1)
    torch.testing.assert_close(get("attn_weights", 0), weights)
    torch.testing.assert_close(get("context", 0), weights @ v)
    # seed-minimal: no out_proj, no residual, so the block output is the heads' output
    assert (0, "attn_out") not in trace
    torch.testing.assert_close(get("block_out", 0), get("context", 0).transpose(1, 2).flatten(2))
    torch.testing.assert_close(out, model.lm_head(get("block_out", 0)))


@pytest.mark.parametrize("overrides", [{}, {"pos": "rope", "head_dim": 6, "rotary_pct": 0.34},
                                       {"pos": "rope", "norm": "gemma_rmsnorm",
                                        "sandwich_norm": True}])
def test_shapes_with_grouped_heads_and_a_kv_cache(overrides: dict) -> None:
    """Learned positions record pos_emb; rotary ones record q and k before rotation instead
    (here partial rotary: 2 of 6 dims, head_dim 6 with n_embd 16); sandwich norms record
    each branch's output after its post-norm too."""
    model = _model("nano", n_head=4, n_kv_head=2, **overrides)
    c, B = model.config, 2
    nh, nkv, hs, C = c.n_head, c.n_kv_heads, c.head_size, c.n_embd
    cache = model.new_cache(B, 8)
    model(_ids(model, B, 5), kv_cache=cache)  # prefill 5 tokens
    trace = Trace()
    T, S = 3, 8  # 3 new queries over 5 cached + 3 new keys
    model(_ids(model, B, T), kv_cache=cache, trace=trace)
    shapes = {
        "tok_emb": (B, T, C), "emb": (B, T, C),
        "q": (B, nh, T, hs), "k": (B, nkv, S, hs), "v": (B, nkv, S, hs),
        "attn_scores": (B, nh, T, S), "masked_scores": (B, nh, T, S),
        "attn_weights": (B, nh, T, S), "context": (B, nh, T, hs),
        "attn_out": (B, T, C), "block_out": (B, T, C), "logits": (B, T, c.vocab_size),
        "resid_pre": (B, T, C), "mlp_out": (B, T, C),
        "resid_mid": (B, T, C), "mlp_pre": (B, T, c.ff_size), "mlp_hidden": (B, T, c.ff_size),
        "attn_entropy": (B, nh, T), "attn_sink": (B, nh, T), "attn_received": (B, nh, S),
        "attn_distance": (B, nh, T), "attn_max": (B, nh, T),
    }
    if c.pos == "rope":
        shapes |= {"q_pre_rope": (B, nh, T, hs), "k_pre_rope": (B, nkv, T, hs)}
        not_recorded = {"pos_emb"}
    else:
        shapes |= {"pos_emb": (B, T, C)}
        not_recorded = {"q_pre_rope", "k_pre_rope"}
    if c.sandwich_norm:
        shapes |= {"attn_out_normed": (B, T, C), "mlp_out_normed": (B, T, C)}
    else:
        not_recorded |= {"attn_out_normed", "mlp_out_normed"}
    not_recorded |= {"router_logits", "expert_weights"}  # a mixture of experts' alone
    not_recorded |= {"attn_learned_sink"}  # a model's with learned attention sinks alone
    not_recorded |= {"kv_latent"}  # latent attention's alone (test_latent.py)
    assert set(shapes) == set(NAMES) - {"attn_weights_dropped"} - not_recorded  # eval
    for name, shape in shapes.items():
        layers = [None] if name in MODEL_NAMES else range(c.n_layer)
        for layer in layers:
            assert tuple(trace.get(name, layer).shape) == shape, (name, layer)
    model_names = [n for n in MODEL_NAMES if n in shapes]
    assert len(trace) == len(model_names) + c.n_layer * (len(shapes) - len(model_names))
    if c.pos == "rope":  # the scored q and new k are the recorded ones rotated; 4 dims pass
        positions = torch.arange(5, 8)[None]  # (1, T)
        assert model.rotary is not None
        cos, sin = model.rotary.cos_sin(positions)
        for layer in range(c.n_layer):
            q0, k0 = trace.get("q_pre_rope", layer), trace.get("k_pre_rope", layer)
            torch.testing.assert_close(trace.get("q", layer), apply_rotary(q0, cos, sin))
            torch.testing.assert_close(trace.get("k", layer)[:, :, 5:], apply_rotary(k0, cos, sin))
            if c.rotary_pct < 1:  # 2 of 6 dims rotate
                assert torch.equal(trace.get("q", layer)[..., 2:], q0[..., 2:])
            assert not torch.allclose(trace.get("q", layer)[..., :2], q0[..., :2])


def test_future_cells_are_exactly_zero_in_prefill_and_decode() -> None:
    model = _model()
    cache = model.new_cache(1)
    prefill, step = Trace(names=["attn_weights", "masked_scores"]), Trace(names=["attn_weights"])
    model(_ids(model, 1, 6), kv_cache=cache, trace=prefill)
    model(_ids(model, 1, 1), kv_cache=cache, trace=step)
    future = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    for layer in range(model.config.n_layer):
        weights = prefill.get("attn_weights", layer)[0]  # (nh, T, T)
        assert torch.all(weights[:, future] == 0.0)
        assert torch.all(weights[:, ~future] > 0.0)
        assert torch.all(prefill.get("masked_scores", layer)[0][:, future] == float("-inf"))
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
        decode = step.get("attn_weights", layer)[0, :, 0]  # (nh, S=7): the new token sees all
        assert decode.shape == (model.config.n_head, 7) and torch.all(decode > 0)


def test_dropped_weights_only_in_training() -> None:
    model = _model(dropout=0.5)
    idx = _ids(model, 2, 8)
    trace = Trace(layers=[0], names=["attn_weights", "attn_weights_dropped"])
    model.train()
    torch.manual_seed(0)
    model(idx, trace=trace)
    kept, dropped = trace.get("attn_weights", 0), trace.get("attn_weights_dropped", 0)
    assert torch.any(dropped == 0) and not torch.equal(kept, dropped)
    survivors = dropped != 0
    torch.testing.assert_close(dropped[survivors], kept[survivors] * 2)  # 1 / (1 - p)
    model.eval()
    trace.clear()
    model(idx, trace=trace)
    assert list(trace) == [(0, "attn_weights")]


def test_filters_keep_exactly_what_was_asked_and_memory_adds_up() -> None:
    model = _model("nano", n_layer=3, n_head=4)
    idx = _ids(model, 2, 6)
    full = Trace()
    model(idx, trace=full)
    trace = Trace(layers=[0, 2], heads=[3, 1], names=["q", "attn_weights", "block_out", "emb"])
    model(idx, trace=trace)
    assert set(trace) == {(None, "emb"), *((la, n) for la in (0, 2)
                                           for n in ("q", "attn_weights", "block_out"))}
    for layer in (0, 2):
        for name in ("q", "attn_weights"):
            assert name in HEAD_NAMES
            # heads come back sorted: [1, 3]. Layer 1 is untraced, so it ran the fused path
            # and layer 2 sees its input to float rounding, not bit for bit.
            torch.testing.assert_close(trace.get(name, layer), full.get(name, layer)[:, [1, 3]],
                                       atol=1e-6, rtol=0)
        torch.testing.assert_close(trace.get("block_out", layer), full.get("block_out", layer),
                                   atol=1e-6, rtol=0)
    expected = sum(t.numel() * t.element_size() for t in trace.to_dict().values())
    assert trace.nbytes() == expected
    assert trace.nbytes() < full.nbytes() / 3
    assert set(full.to_dict()) >= {"emb", "0.q", "2.attn_weights", "logits"}
    with pytest.raises(ValueError, match=r"Trace\(heads=\[9\]\): the model has 4 heads"):
        model(idx, trace=Trace(heads=[9]))


def test_a_standalone_attention_records_at_layer_none() -> None:
    torch.manual_seed(0)
    attn = CausalSelfAttention(8, n_head=2, out_proj=False)
    trace = Trace()
    y = attn(torch.randn(1, 4, 8), trace=trace)
    assert {name for _, name in trace} == {"q", "k", "v", "attn_scores", "masked_scores",
                                          "attn_weights", "context", *SUMMARY_NAMES}
    assert all(layer is None for layer, _ in trace)
    torch.testing.assert_close(y, trace.get("context").transpose(1, 2).flatten(2))


def test_tracing_leaves_no_state_on_the_modules() -> None:
    model = _model()
    model(_ids(model, 1, 4), trace=Trace())
    model(_ids(model, 1, 4))
    stored = [(type(m).__name__, k) for m in model.modules() for k, v in vars(m).items()
              if isinstance(v, torch.Tensor)]
    assert stored == []


def test_pre_rope_queries_are_after_qk_norm() -> None:
    """With QK-norm (Qwen3), q_pre_rope is the normed query (TransformerLens's hook_q_normed,
    not its hook_q): the name's doc said only "before rotary embedding"."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("llama-tiny", qk_norm=True)).eval()
    trace = Trace(layers=0, names=["resid_pre", "q_pre_rope", "q"])
    model(_ids(model, 2, 5), trace=trace)
    attn = model.blocks[0].attn
    with torch.no_grad():
        q = attn.query(model.blocks[0].ln_1(trace.get("resid_pre", 0)))  # (B, T, nh * hs)
        q = q.view(2, 5, attn.n_head, -1).transpose(1, 2)  # (B, nh, T, hs)
        torch.testing.assert_close(trace.get("q_pre_rope", 0), attn.q_norm(q))
    assert not torch.allclose(trace.get("q_pre_rope", 0), q)


@settings(max_examples=25, deadline=None)
@given(switches=modern_switches(), residual=st.booleans(), out_proj=st.booleans())
def test_the_block_names_add_up_and_absent_names_are_the_unrecorded_ones(
    switches: dict, residual: bool, out_proj: bool
) -> None:
    """resid_mid, mlp_hidden and mlp_out recomputed from their neighbours, over every family
    switch; the names a model records are exactly those `absent_names` leaves."""
    head_dim = None if out_proj else 4  # without out_proj the heads must fill n_embd (16)
    model = _model("nano", n_head=4, **{**switches, "head_dim": head_dim, "residual": residual,
                                        "attn_out_proj": out_proj,
                                        "sandwich_norm": switches["sandwich_norm"] and residual})
    c = model.config
    trace = Trace()
    model(_ids(model, 2, 6), trace=trace)
    made = {name for _, name in trace}
    assert made == set(NAMES) - {"attn_weights_dropped"} - set(absent_names(c))
    for name in absent_names(c):  # never empty: learned or no positions have no rotary
        with pytest.raises(KeyError, match="never computes it, as it"):
            trace.get(name, None if name in MODEL_NAMES else 0)
    # a trace of absent names alone would come back empty: refused before the pass
    with pytest.raises(ValueError, match=r"Trace\(names=\[.*\]\) would keep nothing: this "
                                         r"model never computes (it|them) \("):
        Trace(names=sorted(absent_names(c))).run(model, _ids(model, 1, 3))


@pytest.mark.parametrize("overrides", [
    {}, {"mlp": "swiglu", "norm": "rmsnorm", "pos": "rope", "bias": False},
    {"parallel_residual": True}, {"residual": False}, {"gelu": "exact", "n_kv_head": 1},
    {"norm": "gemma_rmsnorm", "mlp": "geglu", "pos": "rope", "sandwich_norm": True},
])
def test_resid_mid_and_the_mlp_names_are_what_the_block_computes(overrides: dict) -> None:
    """Each block name recomputed from its neighbours; with sandwich norms (Gemma 2 / 3) the
    branches' outputs through their post-norms are what the residual adds."""
    model = _model("nano", **overrides)
    c = model.config
    if c.sandwich_norm:  # Gemma's norms start as the identity scale: give them values to map
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 1:
                    p.normal_(0.0, 0.5)
    trace = Trace()
    model(_ids(model, 2, 6), trace=trace)
    for layer, block in enumerate(model.blocks):
        get = functools.partial(lambda name, at: trace.get(name, at), at=layer)
        assert block.mlp is not None and block.ln_2 is not None
        if c.parallel_residual:
            mlp_in = get("resid_pre")
            assert (layer, "resid_mid") not in trace
        else:
            attn = get("attn_out")
            if block.ln_attn_post is not None:
                torch.testing.assert_close(get("attn_out_normed"), block.ln_attn_post(attn))
                attn = get("attn_out_normed")
            torch.testing.assert_close(get("resid_mid"),
                                       get("resid_pre") + attn if c.residual else attn)
            mlp_in = get("resid_mid")
        x = block.ln_2(mlp_in)  # (B, T, C)
        if block.mlp.gate is not None:  # SwiGLU, GeGLU
            pre = block.mlp.gate(x)  # (B, T, d_ff)
            act = F.silu if c.mlp == "swiglu" else functools.partial(
                F.gelu, approximate=GELUS[c.gelu])
            hidden = act(pre) * block.mlp.fc(x)
        else:
            pre = block.mlp.fc(x)  # (B, T, d_ff)
            hidden = F.gelu(pre, approximate=GELUS[c.gelu])
        torch.testing.assert_close(get("mlp_pre"), pre)
        torch.testing.assert_close(get("mlp_hidden"), hidden)
        torch.testing.assert_close(get("mlp_out"), block.mlp.proj(get("mlp_hidden")))
        mlp = get("mlp_out")
        if block.ln_mlp_post is not None:
            torch.testing.assert_close(get("mlp_out_normed"), block.ln_mlp_post(mlp))
            mlp = get("mlp_out_normed")
            assert not torch.allclose(mlp, get("mlp_out"))  # the norm did something
        if not c.parallel_residual:
            out = get("resid_mid") + mlp if c.residual else mlp
            torch.testing.assert_close(get("block_out"), out)


def test_an_edit_of_a_post_norm_output_is_what_the_residual_adds() -> None:
    """Zeroing attn_out_normed / mlp_out_normed (sandwich norms) removes that branch from
    the stream: resid_mid is then resid_pre, block_out resid_mid."""
    from attnlab.interp.edits import Edit

    model = _model("nano", norm="gemma_rmsnorm", mlp="geglu", pos="rope", sandwich_norm=True)
    ids = _ids(model, 2, 5)
    plain = model(ids).logits  # (B, T, V)
    for name, before, after in (("attn_out_normed", "resid_pre", "resid_mid"),
                                ("mlp_out_normed", "resid_mid", "block_out")):
        zero = Edit(name, 1, lambda value, first: torch.zeros_like(value))
        trace = Trace(layers=[1], names=[before, after])
        edited = model(ids, trace=trace, edits=zero).logits
        torch.testing.assert_close(trace.get(after, 1), trace.get(before, 1), atol=0, rtol=0)
        assert not torch.allclose(edited, plain)


def test_the_fused_gelu_is_taken_apart_only_where_mlp_pre_may_be_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fused GELU (`Linear.activated`: the product and its activation in one kernel, never
    holding the pre-activations) runs in every layer unless the trace keeps mlp_pre there or
    an edit touches the layer: a trace of other names keeps it in every layer, a trace of
    mlp_pre in layer 1 alone keeps it in layer 0; the logits are the same either way."""
    from attnlab.interp.edits import Edit
    from attnlab.model.layers import Linear

    model = _model("nano")  # GELU, 2 layers
    fused: list[int] = []
    activated = Linear.activated

    def counted(self: Linear, x: torch.Tensor, act: str, approximate: str) -> torch.Tensor:
        fused.append(1)
        return activated(self, x, act, approximate)

    monkeypatch.setattr(Linear, "activated", counted)
    ids = _ids(model, 2, 5)
    plain = model(ids).logits  # (B, T, V)
    assert len(fused) == 2
    unchanged = Edit("mlp_out", 1, lambda value, first: value)
    for trace, edits, layers in [(Trace(names=["mlp_hidden", "context"]), None, 2),
                                 (Trace(names=["mlp_pre"]), None, 0),
                                 (Trace(names=["mlp_pre"], layers=[1]), None, 1),
                                 (None, unchanged, 1)]:
        fused.clear()
        logits = model(ids, trace=trace, edits=edits).logits
        assert len(fused) == layers, (trace, edits)
        torch.testing.assert_close(logits, plain, atol=1e-6, rtol=0)
