"""Gemma 2's soft caps (`GPTConfig.attn_logit_softcapping`, `final_logit_softcapping`) in
every path that computes attention scores or logits, against a reference written out here:
scores = q k^T * scale, cap * tanh(scores / cap), mask, softmax, @ v; logits capped as
cap * tanh(logits / cap). Attention's explicit path and the fused request that must take it,
the traced path (whole weights, scores, streamed summaries, kept heads and rows), the GPU
kernels' route-around, a model through a KV cache, the decode step and the static step, the
final cap, the lens, generation, training, the config's checks and the Hugging Face export's
refusal."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab.model.compiled_decode as compiled_mod
from attnlab import GPT, GPTConfig, Mask, Trace, attend, build_mask
from attnlab.checkpoint import save_checkpoint
from attnlab.cli import main
from attnlab.generate import generate
from attnlab.generate.sampling import sample
from attnlab.hf import family_for_config
from attnlab.interp.lens import logit_lens
from attnlab.model import summaries, summary_kernels, tf32x3, traced_attention
from attnlab.model.decode import decode_step
from attnlab.model.summaries import SUMMARY_NAMES
from helpers import assert_fixed_steps_match, interpreted, left_padded, make_tokenizer

TOL = dict(atol=1e-6, rtol=1e-6)  # float32


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, may_attend: torch.Tensor | None,
              scale: float, cap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(context (B, nh, T, hs), weights (B, nh, T, S)), step by step: q (B, nh, T, hs), k and
    v (B, nkv, S, hs) (each key/value head serves nh / nkv query heads); a row with no key to
    attend to is 0s."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, nh, S, hs)
    scores = q @ k.transpose(-2, -1) * scale  # (B, nh, T, S)
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    if may_attend is not None:
        scores = scores.masked_fill(~may_attend, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # (B, nh, T, S)
    return weights @ v, weights


def summaries_of(weights: torch.Tensor, padding: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The five summaries of weights (B, nh, T, S) from their definitions (summaries.py), in
    float64; padding (B, S) bool or None. Pad queries' rows are already 0s here."""
    w = weights.double()
    B, _, T, S = w.shape
    first = torch.zeros(B, dtype=torch.long) if padding is None else padding.int().argmax(-1)
    query = torch.arange(S - T, S)[:, None]  # (T, 1)
    key = torch.arange(S)[None, :]  # (1, S)
    return {
        "attn_entropy": -torch.special.xlogy(w, w).sum(-1),
        "attn_sink": w[torch.arange(B), :, :, first],  # (B, nh, T)
        "attn_received": w.sum(-2),
        "attn_distance": (w * (query - key)).sum(-1),
        "attn_max": w.amax(-1),
    }


class Keeps:
    """A LayerTrace that keeps what attention hands it of `names` (and of `heads`/`rows`)."""

    needs_weights = True

    def __init__(self, names: list[str], heads: list[int] | None = None,
                 rows: tuple[int, ...] | None = None) -> None:
        self.names, self.heads, self.rows = names, heads, rows
        self.values: dict[str, torch.Tensor] = {}

    def wants(self, name: str) -> bool:
        return name in self.names

    def record(self, name: str, value: torch.Tensor) -> torch.Tensor:
        self.values[name] = value.clone()
        return value

    def note_mask(self, mask: Mask) -> None:
        pass  # the tests rebuild their masks

    def named(self, name: str) -> bool:
        return name in self.names


PATHS = ["explicit", "fused", "weights", "scores", "summaries", "heads", "rows"]


@st.composite
def attention_cases(draw: Any) -> dict[str, Any]:
    """q, k, v and a mask: grouped-query heads, cached keys, left padding, a sliding window."""
    B, nkv, group = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2])), draw(
        st.sampled_from([1, 2]))
    T, P, hs = draw(st.integers(1, 9)), draw(st.integers(0, 5)), draw(st.sampled_from([4, 8]))
    S = P + T
    g = torch.Generator().manual_seed(draw(st.integers(0, 999)))
    # scores of a few units: a cap of 0.3 saturates them, one of 2 bends them
    q = 2 * torch.randn(B, nkv * group, T, hs, generator=g)
    k, v = 2 * torch.randn(2, B, nkv, S, hs, generator=g)
    padding = None
    if draw(st.booleans()):
        padding = torch.ones(B, S, dtype=torch.long)
        for b in range(B):
            padding[b, :draw(st.integers(0, S - 1))] = 0
    window = draw(st.sampled_from([None, 1, 2, 4]))
    return dict(q=q, k=k, v=v, mask=build_mask(T, S, padding, window=window),
                cap=draw(st.sampled_from([0.3, 2.0])), scale=draw(st.sampled_from([0.5, 0.3])))


def _attend(path: str, case: dict[str, Any]) -> tuple[torch.Tensor, Keeps | None]:
    """attnlab's context along `path`, and the trace that saw it (None: untraced)."""
    nh = case["q"].shape[1]
    trace = {"weights": Keeps(["attn_weights"]),
             "scores": Keeps(["attn_scores", "masked_scores", "attn_weights"]),
             "summaries": Keeps(list(SUMMARY_NAMES)),
             "heads": Keeps(["attn_weights"], heads=[nh - 1]),
             "rows": Keeps(["attn_weights"], rows=(-1,))}.get(path)
    context = attend(case["q"], case["k"], case["v"], case["mask"], scale=case["scale"],
                     softcap=case["cap"], fused=path != "explicit", trace=trace)
    return context, trace


@settings(max_examples=80, deadline=None)
@given(case=attention_cases(), path=st.sampled_from(PATHS), small=st.booleans())
def test_every_attention_path_equals_the_capped_reference(case: dict[str, Any], path: str,
                                                          small: bool) -> None:
    """small: blocks of 2 query rows and tiles of 64 weights (several blocks, tiles of a
    few rows or heads), else one block and one tile."""
    mask = case["mask"]
    expected, weights = reference(case["q"], case["k"], case["v"], mask.may_attend,
                                  case["scale"], case["cap"])
    with pytest.MonkeyPatch.context() as patch:
        if small:
            patch.setattr(traced_attention, "BLOCK_ROWS", 2)
            patch.setitem(summaries.TILE_BYTES, "cpu", 256)
        context, trace = _attend(path, case)
    torch.testing.assert_close(context, expected, **TOL)
    if trace is None:
        return
    kept = trace.values
    if path == "summaries":
        for name, value in summaries_of(weights, mask.padding).items():
            torch.testing.assert_close(kept[name].double(), value, atol=1e-5, rtol=1e-5)
        return
    if path == "heads":
        weights = weights[:, -1:]
    elif path == "rows":
        weights = weights[:, :, -1:]
    torch.testing.assert_close(kept["attn_weights"], weights, **TOL)
    if path == "scores":  # the raw scores stay q k^T: the cap comes after the scale
        group = case["q"].shape[1] // case["k"].shape[1]
        raw = case["q"] @ case["k"].repeat_interleave(group, 1).transpose(-2, -1)
        torch.testing.assert_close(kept["attn_scores"], raw, **TOL)


def test_a_cap_changes_attention_and_a_huge_cap_changes_nothing() -> None:
    """The sanity check both ways: cap 0.3 moves the output far from uncapped attention,
    cap 1e9 leaves it within float rounding, on the explicit and the fused requests."""
    g = torch.Generator().manual_seed(0)
    q, k, v = 2 * torch.randn(3, 2, 4, 7, 8, generator=g)
    mask = build_mask(7, 7, torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7]))
    plain = attend(q, k, v, mask, fused=False)
    for fused in (False, True):
        capped = attend(q, k, v, mask, softcap=0.3, fused=fused)
        assert (capped - plain).abs().max() > 0.1
        torch.testing.assert_close(attend(q, k, v, mask, softcap=1e9, fused=fused), plain,
                                   atol=1e-6, rtol=1e-6)


def test_the_capped_attention_has_the_references_gradients() -> None:
    """Training: the cap is differentiable and its gradients are the reference's (float64:
    gradcheck too), on the path an untraced training forward takes."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (2 * torch.randn(2, 2, 5, 4, generator=g, dtype=torch.float64)
               for _ in range(3))
    mask = build_mask(5, 5, torch.tensor([[0, 1, 1, 1, 1], [1] * 5]))
    inputs = [t.requires_grad_() for t in (q, k, v)]
    torch.autograd.gradcheck(
        lambda *x: attend(*x, mask, softcap=0.7, training=True), inputs)
    ours = torch.autograd.grad(attend(*inputs, mask, softcap=0.7, training=True).sum(), inputs)
    theirs = torch.autograd.grad(
        reference(*inputs, mask.may_attend, 0.5, 0.7)[0].sum(), inputs)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)


def test_attend_refuses_a_cap_that_is_not_positive() -> None:
    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match=r"softcap=0.0 must be > 0 \(None: no cap\)"):
        attend(q, q, q, softcap=0.0)


# ----------------------------------------------------------------------------- models


def _model(**overrides: Any) -> GPT:
    """Llama's wiring with grouped-query heads, a window on layer 0, both caps."""
    torch.manual_seed(0)
    values: dict[str, Any] = dict(
        n_head=4, n_kv_head=2, init_std=0.3, sliding_window=3, window_layers=[0],
        attn_logit_softcapping=0.5, final_logit_softcapping=5.0)
    return GPT(GPTConfig.from_name("llama-tiny", **{**values, **overrides})).eval()


def _capped_logits(model: GPT, resid: torch.Tensor) -> torch.Tensor:
    """The head of the reference: final norm, unembedding, cap * tanh(logits / cap)."""
    logits = model.lm_head(model.ln_f(resid))  # (B, T, V)
    cap = model.config.final_logit_softcapping
    return logits if cap is None else cap * torch.tanh(logits / cap)


@torch.no_grad()
def test_a_models_attention_and_logits_equal_the_reference_through_a_cache() -> None:
    """Left padding, grouped-query heads, a window on layer 0, a prefill and then a traced
    continuation over the cache: every layer's weights and context equal the reference on
    the layer's own q, k, v; the logits are the final norm's, unembedded and capped; the
    untraced forward over the same cache gives the traced forward's logits."""
    model = _model()
    ids, mask = left_padded([9, 5, 3], seed=2)
    P = 6
    cache, plain = model.new_cache(3, 9), model.new_cache(3, 9)
    for kv in (cache, plain):
        model(ids[:, :P], attention_mask=mask[:, :P], kv_cache=kv)
    trace = Trace(names=["q", "k", "v", "attn_weights", "context", "block_out", "logits"])
    model(ids[:, P:], attention_mask=mask, kv_cache=cache, trace=trace)
    c = model.config
    for layer in range(c.n_layer):
        may = build_mask(9 - P, 9, mask, window=c.window_of(layer)).may_attend
        context, weights = reference(trace.get("q", layer), trace.get("k", layer),
                                     trace.get("v", layer), may, c.score_scale,
                                     c.attn_logit_softcapping)
        torch.testing.assert_close(trace.get("attn_weights", layer), weights, **TOL)
        torch.testing.assert_close(trace.get("context", layer), context, **TOL)
    logits = trace.get("logits")
    expected = _capped_logits(model, trace.get("block_out", c.n_layer - 1))
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    untraced = model(ids[:, P:], attention_mask=mask, kv_cache=plain).logits
    torch.testing.assert_close(untraced, logits, atol=1e-5, rtol=1e-5)


def test_a_huge_cap_gives_the_uncapped_model() -> None:
    ids, mask = left_padded([8, 4], seed=3)
    plain = _model(attn_logit_softcapping=None, final_logit_softcapping=None)
    huge = _model(attn_logit_softcapping=1e9, final_logit_softcapping=1e9)
    capped = _model()
    with torch.no_grad():
        expected = plain(ids, attention_mask=mask).logits
        torch.testing.assert_close(huge(ids, attention_mask=mask).logits, expected,
                                   atol=1e-5, rtol=1e-5)
        assert (capped(ids, attention_mask=mask).logits - expected).abs().max() > 0.1


@torch.no_grad()
def test_the_decode_step_equals_the_full_forward() -> None:
    """The KV-cache decode step (its attention closure and its head) caps as the forward."""
    model = _model()
    ids, mask = left_padded([7, 3], seed=4)
    cache = model.new_cache(2, 12)
    model(ids, attention_mask=mask, kv_cache=cache)
    step = decode_step(model)
    tokens = torch.randint(0, 65, (4, 2, 1), generator=torch.Generator().manual_seed(4))
    for token in tokens:  # (B, 1)
        ids = torch.cat([ids, token], dim=1)
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        logits = step(token, mask, cache)  # (B, V)
        full = model(ids, attention_mask=mask).logits[:, -1]
        torch.testing.assert_close(logits, full, atol=1e-5, rtol=1e-5)


def _identity(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    return fn


def test_the_static_step_equals_the_decode_step() -> None:
    """compiled_decode's step over the whole static buffer, run eagerly (compiling it:
    tests/test_generate_compile.py's Llama-shaped model has both caps)."""
    model = _model()
    ids, mask = left_padded([6, 2, 4], seed=5)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled_mod.torch, "compile", _identity)
        static = compiled_mod.CompiledDecode(model, 3, 16)
    assert_fixed_steps_match(model, static, ids, mask)


def test_capped_traces_keep_away_from_the_gpu_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary and weight kernels (summary_kernels, CUDA only) have no cap: with the
    kernels said to be available, a capped trace of summaries alone or of weights alone
    still takes the torch tiles and gives the reference; an uncapped one reaches them."""
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a kernel without the cap ran")

    monkeypatch.setattr(summary_kernels, "available", lambda q: True)
    monkeypatch.setattr(summary_kernels, "WEIGHTS_FROM_LSE", frozenset({torch.float32}))
    for name in ("layer_summaries", "attend_and_summarise", "attention_weights"):
        monkeypatch.setattr(summary_kernels, name, kernel)
    g = torch.Generator().manual_seed(6)
    q, k, v = 2 * torch.randn(3, 2, 2, 6, 8, generator=g)
    mask = build_mask(6, 6, torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6]))
    context, weights = reference(q, k, v, mask.may_attend, 0.5, 0.4)
    for names in (list(SUMMARY_NAMES), ["attn_weights"]):
        trace = Keeps(names)
        torch.testing.assert_close(attend(q, k, v, mask, scale=0.5, softcap=0.4, trace=trace),
                                   context, **TOL)
        if names == ["attn_weights"]:
            torch.testing.assert_close(trace.values["attn_weights"], weights, **TOL)
        with pytest.raises(AssertionError, match="a kernel without the cap ran"):
            attend(q, k, v, mask, scale=0.5, trace=Keeps(names))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_the_tf32x3_scores_are_capped_before_they_are_masked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """tf32x3's causal product writes -inf past the diagonal itself, which a cap would turn
    into -cap: a capped trace has the product compute every score and masks after the cap
    (the kernel under Triton's interpreter on CPU tensors, as tests/model/test_tf32x3.py)."""
    g = torch.Generator().manual_seed(10)
    q, k, v = 2 * torch.randn(3, 1, 2, 70, 16, generator=g)
    mask = build_mask(70, 70)
    context, weights = reference(q, k, v, mask.may_attend, 0.25, 0.4)
    with interpreted(monkeypatch, "attnlab.model.tf32x3_triton") as kernels:
        monkeypatch.setattr(tf32x3, "ENABLED", True)
        monkeypatch.setattr(tf32x3, "DEVICES", {"cpu"})
        diagonals: list[int | None] = []
        matmul = kernels.matmul

        def counted(*args: Any, **kw: Any) -> torch.Tensor:
            diagonals.append(kw.get("diagonal"))
            return matmul(*args, **kw)

        monkeypatch.setattr(kernels, "matmul", counted)
        trace = Keeps(["attn_weights"])
        with torch.no_grad():
            out = attend(q, k, v, mask, scale=0.25, softcap=0.4, trace=trace)
    assert diagonals[0] is None and len(diagonals) == 2  # the scores, then weights @ v
    torch.testing.assert_close(trace.values["attn_weights"], weights, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, context, atol=1e-5, rtol=1e-5)


def test_the_final_cap_reaches_the_lens_and_the_loss() -> None:
    """Every lens row is the reference head (norm, unembedding, cap) of its residual, the
    last the model's logits; the loss is the cross-entropy of the capped logits, with
    gradients through both caps."""
    model = _model()
    ids, mask = left_padded([8, 5], seed=7)
    with torch.no_grad():
        lens = logit_lens(model, ids, mask)
        trace = Trace(names=["emb", "block_out"]).run(model, ids, mask)
        resids = [trace.get("emb")] + [trace.get("block_out", i) for i in range(2)]
        for row, resid in zip(lens, resids, strict=True):
            torch.testing.assert_close(row, _capped_logits(model, resid), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lens[-1], model(ids, attention_mask=mask).logits)
    model.train()
    targets = torch.roll(ids, -1, dims=1)
    out = model(ids, targets, attention_mask=mask)
    expected = F.cross_entropy(out.logits[mask == 1], targets[mask == 1])
    torch.testing.assert_close(out.loss, expected)
    assert out.logits.abs().max() < 5.0
    out.loss.backward()
    assert all(p.grad is not None and bool(p.grad.isfinite().all())
               for p in model.parameters())


@torch.no_grad()
def test_sampling_reads_the_capped_logits_before_the_temperature() -> None:
    """transformers' order: the model's forward caps, and temperature and top-k act on the
    capped logits. A model with only the final cap samples what a reference loop samples
    from the uncapped twin's logits, capped, then tempered."""
    capped = _model(attn_logit_softcapping=None, final_logit_softcapping=1.0)
    twin = _model(attn_logit_softcapping=None, final_logit_softcapping=None)
    ids, mask = left_padded([5, 3], seed=8)
    out = generate(capped, ids, mask, max_new_tokens=6, temperature=0.3, top_k=20,
                   generator=torch.Generator().manual_seed(9))
    g, expected = torch.Generator().manual_seed(9), ids
    for _ in range(6):
        logits = twin(expected, attention_mask=mask).logits[:, -1]
        nxt = sample(1.0 * torch.tanh(logits / 1.0), 0.3, 20, generator=g)  # (B,)
        expected = torch.cat([expected, nxt[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(nxt[:, None])], dim=1)
    assert torch.equal(out, expected)
    uncapped = generate(twin, ids, mask[:, :5], max_new_tokens=6, temperature=0.3, top_k=20,
                        generator=torch.Generator().manual_seed(9))
    assert not torch.equal(uncapped, expected)  # the cap matters at this temperature


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("name", ["attn_logit_softcapping", "final_logit_softcapping",
                                  "qkv_clip"])
@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "50", True])
def test_the_config_refuses_a_cap_that_is_not_a_positive_number(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"GPTConfig.{name}={value!r} must be a positive "
                                         r"finite number .* or None for no cap"):
        GPTConfig.from_name("nano", **{name: value})


def test_caps_default_to_none_and_round_trip() -> None:
    assert GPTConfig().attn_logit_softcapping is None
    assert GPTConfig().final_logit_softcapping is None
    config = GPTConfig.from_name("nano", attn_logit_softcapping=50, final_logit_softcapping=30.0)
    assert GPTConfig.from_dict(config.to_dict()) == config


def test_a_capped_model_is_no_family_without_caps() -> None:
    """No supported Hugging Face family has the caps: an export would drop them."""
    config = GPTConfig.from_name("llama-tiny", final_logit_softcapping=30.0)
    with pytest.raises(ValueError, match="llama needs final_logit_softcapping=None"):
        family_for_config(config)
    assert family_for_config(GPTConfig.from_name("llama-tiny")).name == "llama"


def test_info_shows_the_caps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    config = GPTConfig.from_name("nano", vocab_size=tokenizer.vocab_size,
                                 attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    path = save_checkpoint(tmp_path / "ckpt", GPT(config).eval(), tokenizer)
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "attn_logit_softcapping=50.0" in out and "final_logit_softcapping=30.0" in out
