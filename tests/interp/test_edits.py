"""interp/edits.py: the edit seam. Identity edits change nothing (bit for bit), edits agree on the
fused and explicit paths, cached generation with an edit equals recomputing the sequence,
left padding, patching, negative positions, neurons, and imported GPT-2 against Hugging Face
with the same head zeroed (the arguments edits take and refuse: test_edits_arguments.py)."""

from __future__ import annotations

import pytest
import torch

from attnlab import GPT, Trace
from attnlab.generate import generate
from attnlab.interp.edits import (
    Edit,
    Edits,
    ablate,
    check_heads,
    head_means,
    mean_heads,
    parse_heads,
    patch,
    scale_heads,
    set_attention,
    uniform_attention,
    zero_heads,
    zero_neurons,
)
from attnlab.model.names import MODEL_NAMES, NAMES, SUMMARIES, WEIGHT_NAMES, absent_names
from helpers import left_padded, random_ids, seeded_model

# nano with 4 heads; the Llama family (RoPE, RMSNorm, SwiGLU, grouped-query heads); and a
# GPT-NeoX-style parallel residual with partial rotary
FAMILIES = {
    "nano": {"n_head": 4},
    "llama-tiny": {},
    "neox-tiny": {"n_head": 4, "pos": "rope", "rotary_pct": 0.5, "parallel_residual": True},
}


def _family(name: str, **overrides: object) -> GPT:
    preset = "nano" if name == "neox-tiny" else name
    return seeded_model(preset, **{**FAMILIES[name], **overrides})


def _identity(name: str, layer: int | None, **select: object) -> Edit:
    return Edit(name, layer, lambda v, _: v, **select)  # type: ignore[arg-type]


@pytest.mark.parametrize("family", [*FAMILIES, "nano-gqa"])
@pytest.mark.parametrize("padded", [False, True])
def test_identity_edits_leave_logits_bit_for_bit(padded: bool, family: str) -> None:
    model = seeded_model(n_head=4, n_kv_head=2) if family == "nano-gqa" else _family(family)
    idx, mask = left_padded([7, 4, 7]) if padded else (random_ids(2, 7), None)
    fused = model(idx, attention_mask=mask).logits
    explicit = model(idx, attention_mask=mask, fused=False).logits
    absent = set(absent_names(model.config))  # edits there are refused (below)
    for name in sorted(set(NAMES) - {"attn_weights_dropped"} - SUMMARIES - absent):
        layers = [None] if name in MODEL_NAMES else [0, 1]
        edits = Edits(_identity(name, layer) for layer in layers)
        # scores and weights exist only on the explicit path, which the edit then runs
        plain = explicit if name in WEIGHT_NAMES else fused
        assert torch.equal(model(idx, attention_mask=mask, edits=edits).logits, plain), name
        heads = {"heads": (1,)} if name in ("q", "context", "attn_weights") else {}
        edits = Edits(_identity(name, layer, positions=(2, 5), **heads) for layer in layers)
        assert torch.equal(model(idx, attention_mask=mask, edits=edits).logits, plain), name
    edits = Edits([scale_heads(1, [0, 3], 1.0)])
    assert torch.equal(model(idx, attention_mask=mask, edits=edits).logits, fused)


def test_an_edit_changes_only_what_it_selects_and_the_trace_sees_it() -> None:
    model = seeded_model(n_head=4)
    idx = random_ids(2, 6)
    clean = Trace()
    model(idx, trace=clean)
    trace = Trace()
    model(idx, trace=trace, edits=Edits([zero_heads(1, 2, positions=[3, 4])]))
    context = trace.get("context", 1)  # (B, nh, T, hs)
    assert torch.all(context[:, 2, 3:5] == 0)
    keep = torch.ones(4, 6, dtype=torch.bool)
    keep[2, 3:5] = False
    torch.testing.assert_close(context[:, keep], clean.get("context", 1)[:, keep],
                               atol=1e-6, rtol=0)
    # layer 0 is untouched; positions before 3 in layer 1's output are too (causal)
    torch.testing.assert_close(trace.get("block_out", 0), clean.get("block_out", 0),
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(trace.get("block_out", 1)[:, :3], clean.get("block_out", 1)[:, :3],
                               atol=1e-6, rtol=0)
    assert not torch.allclose(trace.get("logits")[:, 3:], clean.get("logits")[:, 3:])


def _edit_cases(model: GPT, idx: torch.Tensor, mask: torch.Tensor | None) -> dict[str, Edits]:
    source = Trace()
    model(random_ids(*idx.shape, seed=7), attention_mask=mask, trace=source)
    means = head_means(model, idx, mask)
    pattern = torch.eye(idx.shape[1])  # each query reads only itself: allowed for every row
    return {
        "zero": Edits([zero_heads(0, [1]), zero_heads(1, [0, 3], positions=[4])]),
        "scale": Edits([scale_heads(1, 2, 3.0)]),
        "mean": Edits([mean_heads(0, [0, 2], means[0])]),
        "patch-head": Edits([patch(source, "context", 1, heads=[1], positions=[2, 5])]),
        "patch-resid": Edits([patch(source, "resid_pre", 1, positions=[3])]),
        "patch-mlp": Edits([patch(source, "mlp_out", 0)]),
        "uniform": Edits([uniform_attention(1, [0, 2])]),
        "set": Edits([set_attention(0, 3, pattern)]),
    }


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True])
def test_edits_agree_fused_and_explicit(padded: bool, family: str) -> None:
    model = _family(family, init_std=0.2)  # peaked attention, so a uniform one differs
    idx, mask = left_padded([8, 5], seed=3) if padded else (random_ids(2, 8), None)
    plain = model(idx, attention_mask=mask).logits
    for case, edits in _edit_cases(model, idx, mask).items():
        fused = model(idx, attention_mask=mask, edits=edits).logits
        explicit = model(idx, attention_mask=mask, edits=edits, fused=False).logits
        torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0, msg=case)
        assert not torch.allclose(fused, plain, atol=1e-4), f"{case} changed nothing"


def test_uniform_attention_spreads_over_allowed_keys_only() -> None:
    model = seeded_model(n_head=4)
    idx, mask = left_padded([6, 3], seed=2)
    trace = Trace(layers=[1], names=["attn_weights"])
    model(idx, attention_mask=mask, trace=trace, edits=Edits([uniform_attention(1, 2)]))
    weights = trace.get("attn_weights", 1)[:, 2]  # (B, T, S)
    may_attend = torch.tril(torch.ones(6, 6, dtype=torch.bool)) & mask.bool()[:, None, :]
    may_attend &= mask.bool()[:, :, None]  # pad queries attend to nothing
    counts = may_attend.sum(-1, keepdim=True).clamp(min=1)
    assert torch.equal(weights, may_attend / counts)


@torch.no_grad()
def _recomputed(model: GPT, idx: torch.Tensor, mask: torch.Tensor | None, edits: Edits,
                n: int) -> torch.Tensor:
    """Greedy ids from the full sequence recomputed at every step, no cache."""
    for _ in range(n):
        logits = model(idx, attention_mask=mask, edits=edits).logits[:, -1]  # (B, V)
        idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], dim=1)
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return idx


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padded", [False, True])
def test_cached_generation_with_edits_equals_recomputing(padded: bool, family: str) -> None:
    model = _family(family, init_std=0.2)  # peaked logits: argmax never hinges on 1e-6
    idx, mask = left_padded([5, 3], seed=4) if padded else (random_ids(2, 5), None)
    cases = _edit_cases(model, torch.zeros(2, 14, dtype=torch.long), None)
    unedited = generate(model, idx, mask, max_new_tokens=9, temperature=0)
    changed = []
    for case in ("zero", "scale", "uniform"):
        edits = cases[case] + Edits([zero_heads(0, 2, positions=[8])])  # a column decoded later
        cached = generate(model, idx, mask, max_new_tokens=9, temperature=0, edits=edits)
        assert torch.equal(cached, _recomputed(model, idx, mask, edits, 9)), case
        changed += [case] if not torch.equal(cached, unedited) else []
    assert changed, "no edit changed a generated token: the comparison proves nothing"


def test_patching_every_position_of_the_clean_run_gives_the_clean_logits() -> None:
    model = seeded_model()
    clean_ids, corrupt_ids = random_ids(2, 6, seed=1), random_ids(2, 6, seed=2)
    clean = Trace()
    clean_logits = model(clean_ids, trace=clean).logits
    for name, layer in [("resid_pre", 0), ("resid_pre", 1), ("block_out", 1), ("emb", None)]:
        patched = model(corrupt_ids, edits=Edits([patch(clean, name, layer)])).logits
        torch.testing.assert_close(patched, clean_logits, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="does not cover"):
        model(random_ids(3, 6), edits=Edits([patch(clean, "context", 0)]))


def test_ablate_zero_and_mean_and_head_lists() -> None:
    model = seeded_model(n_head=4)
    idx = random_ids(4, 8)
    trace = Trace(names=["context"])
    model(idx, trace=trace, edits=ablate([(1, 3), (0, 1), (1, 3)]))
    assert torch.all(trace.get("context", 0)[:, 1] == 0) and torch.all(
        trace.get("context", 1)[:, 3] == 0)
    means = head_means(model, idx)
    model(idx, trace=trace, edits=ablate([(0, 2)], "mean", means))
    assert torch.allclose(trace.get("context", 0)[:, 2], means[0][2].expand(4, 8, -1))
    assert parse_heads("1.0, 0.3") == [(1, 0), (0, 3)]
    with pytest.raises(ValueError, match=r"LAYER\.HEAD"):
        parse_heads("1:0")
    with pytest.raises(ValueError, match=r"\(layer, head\) \(2, 0\) do not exist"):
        check_heads([(2, 0)], 2, 4)
    with pytest.raises(ValueError, match="needs means"):
        ablate([(0, 0)], "mean")


@torch.no_grad()
def test_imported_gpt2_ablation_equals_hugging_face_with_the_head_zeroed(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    from attnlab.hf import load_hf_gpt2

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2,
                                      n_head=4, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                                      attn_implementation="eager")
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(tmp_path)
    ours = load_hf_gpt2(tmp_path).eval()
    layer, head, hs = 1, 2, 8

    def zero_head(_module: torch.nn.Module, args: tuple) -> tuple:
        merged = args[0].clone()  # (B, T, nh * hs): heads concatenated before c_proj
        merged[..., head * hs:(head + 1) * hs] = 0
        return (merged,)

    idx, mask = left_padded([9, 6], vocab=97, seed=5)
    handle = hf.transformer.h[layer].attn.c_proj.register_forward_pre_hook(zero_head)
    try:
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # HF's convention for left padding
        expected = hf(idx, attention_mask=mask, position_ids=positions).logits
    finally:
        handle.remove()
    got = ours(idx, attention_mask=mask, edits=ablate([(layer, head)])).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(got[real], ours(idx, attention_mask=mask).logits[real], atol=1e-3)

    # the rest of the toolkit on the imported model: cached generation with the head ablated
    # equals recomputation, detectors score every head, a full residual patch gives 1
    from attnlab.interp.heads import detect_heads
    from attnlab.interp.patching import logit_diff_metric, patch_effect

    edits = ablate([(layer, head)])
    cached = generate(ours, idx, mask, max_new_tokens=6, temperature=0, edits=edits)
    assert torch.equal(cached, _recomputed(ours, idx, mask, edits, 6))
    scores = detect_heads(ours)
    assert all(s.shape == (2, 4) and bool(((s >= 0) & (s <= 1)).all()) for s in scores.values())
    clean, corrupt = idx[:1], idx[1:]
    effect = patch_effect(ours, clean, corrupt, logit_diff_metric(3, 4),
                          lambda t: Edits([patch(t, "resid_pre", 1)]))
    assert effect == 1.0


def test_patching_a_prompt_then_generating_past_it() -> None:
    """A patch from a trace of the prompt, applied while generating: positions inside the prompt
    give the same tokens cached and recomputed (recomputing refused the longer run before), and
    patching every position names the generated columns the source lacks (a bare torch error
    from `narrow` before)."""
    model = seeded_model(init_std=0.2)
    idx, corrupt = random_ids(2, 6, seed=1), random_ids(2, 6, seed=2)
    clean = Trace(names=["resid_pre"])
    model(idx, trace=clean)
    edits = Edits([patch(clean, "resid_pre", 1, positions=[2, 5])])
    cached = generate(model, corrupt, max_new_tokens=5, temperature=0, edits=edits)
    assert torch.equal(cached, _recomputed(model, corrupt, None, edits, 5))
    assert not torch.equal(cached, generate(model, corrupt, max_new_tokens=5, temperature=0))
    every = Edits([patch(clean, "resid_pre", 1)])
    with pytest.raises(ValueError, match=r"holds columns 0 to 5, and this run patches columns "
                                         r"\[6\] too; pass positions inside the source"):
        generate(model, corrupt, max_new_tokens=2, temperature=0, edits=every)


@torch.no_grad()
@pytest.mark.parametrize("family", ["nano", "llama-tiny"])
def test_a_negative_position_counts_from_each_passs_last_column(family: str) -> None:
    """positions=[-1] edits a prompt's last token, as positions=[T - 1] does, and in
    generation each step's new token (TransformerLens's pos=-1); patch takes it too."""
    model = _family(family)
    idx = random_ids(2, 6)
    for make in (lambda p: zero_heads(0, 1, positions=p), lambda p: uniform_attention(1, 0, p)):
        assert torch.equal(model(idx, edits=make([-1])).logits,
                           model(idx, edits=make([5])).logits)
        assert torch.equal(model(idx, edits=make([-2, -6])).logits,
                           model(idx, edits=make([4, 0])).logits)
    clean = Trace(names="resid_pre").run(model, random_ids(2, 6, seed=2))
    assert torch.equal(model(idx, edits=patch(clean, "resid_pre", 1, positions=[-1])).logits,
                       model(idx, edits=patch(clean, "resid_pre", 1, positions=[5])).logits)
    # generation: -1 is every step's newest column, so each new token is edited as it comes
    out = generate(model, idx, max_new_tokens=3, temperature=0,
                   edits=zero_heads(0, 1, positions=[-1]))
    for step in range(3):
        T = 6 + step
        expected = model(out[:, :T], edits=zero_heads(0, 1, positions=list(range(5, T)))
                         ).logits[:, -1].argmax(-1)
        assert torch.equal(out[:, T], expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_neurons_equals_removing_their_down_projection_columns(family: str) -> None:
    """Zeroing hidden activations n at some positions is the model whose down projection lost
    columns n, at those positions: checked against that weight surgery, row by row."""
    model = _family(family)
    idx, neurons, layer = random_ids(2, 7), [0, 5, 17], 1
    edited = model(idx, edits=zero_neurons(layer, neurons)).logits
    surgery = _family(family)
    with torch.no_grad():
        surgery.blocks[layer].mlp.proj.weight[:, neurons] = 0  # (C, d_ff): their columns
    torch.testing.assert_close(edited, surgery(idx).logits, atol=1e-6, rtol=0)
    assert not torch.allclose(edited, model(idx).logits, atol=1e-4)
    at_three = model(idx, edits=zero_neurons(layer, neurons, positions=[3])).logits
    torch.testing.assert_close(at_three[:, :3], model(idx).logits[:, :3], atol=0, rtol=0)
    torch.testing.assert_close(at_three[:, 3], surgery(idx).logits[:, 3], atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_an_edit_of_the_mlp_pre_activations_reaches_the_model(family: str) -> None:
    """The fused GELU never holds "mlp_pre"; an edit of it takes the product and the
    activation apart. gelu(0) = silu(0) = 0, so zeroing neurons' pre-activations zeroes
    their hidden activations (`zero_neurons`); a trace of mlp_pre alone changes no logit."""
    model = _family(family)
    idx, neurons, layer = random_ids(2, 7), [0, 5, 17], 1

    def zero_pre(value: torch.Tensor, first: int) -> torch.Tensor:
        value = value.clone()  # (B, T, d_ff)
        value[..., neurons] = 0.0
        return value

    edited = model(idx, edits=Edit("mlp_pre", layer, zero_pre)).logits
    torch.testing.assert_close(edited, model(idx, edits=zero_neurons(layer, neurons)).logits,
                               atol=1e-6, rtol=0)
    assert not torch.allclose(edited, model(idx).logits, atol=1e-4)
    trace = Trace(names=["mlp_pre"])
    torch.testing.assert_close(model(idx, trace=trace).logits, model(idx).logits, atol=1e-6,
                               rtol=0)
    assert [name for _, name in trace] == ["mlp_pre"] * model.config.n_layer


def test_neuron_and_absent_name_edits_are_refused_in_words() -> None:
    import numpy as np

    model = seeded_model()
    for where in (None, [20]):  # checked before the pass, even where no column is computed
        with pytest.raises(ValueError, match=r"neurons \[999\] out of range for layer 0's 64 "
                                             r"MLP neurons \(0 to 63\)"):
            model(random_ids(1, 3), edits=zero_neurons(0, [1, 999], positions=where))
    for bad in ([], 1.5, [True], [2.0], "3"):
        with pytest.raises(ValueError, match=r"zero_neurons\(neurons="):
            zero_neurons(0, bad)  # type: ignore[arg-type]
    one = model(random_ids(1, 3), edits=zero_neurons(0, 3)).logits
    for same in (torch.tensor(3), np.array(3), np.int64(3), [torch.tensor(3)]):  # 0-d: one
        assert torch.equal(model(random_ids(1, 3), edits=zero_neurons(0, same)).logits, one)
    # a float position or layer was truncated (1.5 edited column 1); an empty list edited
    # nothing; a negative position past the first column was skipped
    for bad, message in (({"positions": [1.5]}, r"Edit\(positions=\[1.5\]\): positions are "
                                                r"integers, not 1.5"),
                         ({"positions": "3"}, r"positions are integers, not '3'"),
                         ({"positions": []}, r"Edit\(positions=\[\]\) would keep nothing"),
                         ({"heads": []}, r"Edit\(heads=\[\]\) would keep nothing")):
        with pytest.raises(ValueError, match=message):
            Edit("context", 0, lambda v, _: v, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"at layer 1\.0: layers are integers"):
        zero_neurons(1.0, [1])  # type: ignore[arg-type]
    assert zero_neurons(np.int64(1), 2, positions=(np.int32(-1),)).positions == (-1,)
    with pytest.raises(ValueError, match=r"positions \[-4\]: they count back from the last of "
                                         r"this pass's 3 columns, past its first; count from -1 "
                                         r"\(the last\) to -3"):
        model(random_ids(1, 3), edits=zero_neurons(0, 1, positions=[-1, -4]))
    neox = _family("neox-tiny")
    with pytest.raises(ValueError, match=r"'resid_mid'.*never computes it, as its MLP reads "
                                         r"resid_pre \(parallel_residual=True\)"):
        neox(random_ids(1, 3), edits=_identity("resid_mid", 0))
    with pytest.raises(ValueError, match=r"'pos_emb'.*never computes it, as its positions"):
        neox(random_ids(1, 3), edits=_identity("pos_emb", None))
