"""interp/edits.py's arguments: one Edit, a sum and nested Edits act as the Edits of them, one
layer, head, name or pair stands for a list of one, edits the model never reaches and shapes
or ids that cannot fit are refused by name, and traces, edits and checkpoints read in one
line."""

from __future__ import annotations

import pytest
import torch

from attnlab import Trace
from attnlab.generate import generate, stream
from attnlab.interp.edits import (
    Edit,
    Edits,
    ablate,
    head_means,
    scale_heads,
    set_attention,
    uniform_attention,
    zero_heads,
)
from helpers import random_ids, seeded_model


def test_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown edit name 'z'"):
        Edit("z", 0, lambda v, _: v)
    with pytest.raises(ValueError, match="has no head dimension"):
        Edit("resid_pre", 0, lambda v, _: v, heads=(0,))
    with pytest.raises(ValueError, match="needs layer=None"):
        Edit("logits", 0, lambda v, _: v)
    model = seeded_model()
    with pytest.raises(ValueError, match=r"edit heads \[5\] out of range for 2 heads"):
        model(random_ids(1, 4), edits=Edits([zero_heads(0, 5)]))


def test_edits_the_model_never_reaches_are_refused() -> None:
    """An edit at a layer the model lacks, a negative layer or position, or a position past
    block_size would leave every output unchanged (read as "this head does not matter"):
    each is refused. A position past this call's columns stays allowed: a later, longer
    call reaches it."""
    model = seeded_model()  # nano: 2 layers, 2 heads, block_size 32
    idx = random_ids(1, 6)
    for edits, message in [
        (ablate([(5, 0)]), r"at layer 5: the model has 2 layers \(0 to 1\)"),
        (Edits([uniform_attention(2, 0)]), "at layer 2: the model has 2 layers"),
        (Edits([scale_heads(0, 0, 0.0, positions=[32])]), r"positions \[32\]: the model "
         r"reads at most block_size=32 columns"),
    ]:
        with pytest.raises(ValueError, match=message):
            model(idx, edits=edits)
        with pytest.raises(ValueError, match=message):
            generate(model, idx, max_new_tokens=2, temperature=0, edits=edits)
    with pytest.raises(ValueError, match="at layer -1: layers are integers from 0"):
        ablate([(-1, 0)])
    with pytest.raises(ValueError, match=r"positions \[-33\]: .* or -1 to -32 from the last"):
        model(idx, edits=scale_heads(0, 0, 0.0, positions=[-33]))
    with pytest.raises(ValueError, match=r"edit heads \[7\] out of range for 2 heads"):
        model(idx, edits=ablate([(0, 7)]))
    # stream checks its edits when called, before the first step (a CLI prints nothing yet)
    for bad in (ablate([(5, 0)]), ablate([(0, 7)])):
        with pytest.raises(ValueError, match=r"the model has 2 layers|out of range for 2 heads"):
            stream(model, idx, max_new_tokens=2, edits=bad)
    later = Edits([zero_heads(0, 0, positions=[8])])  # column 8: computed by a longer call
    assert torch.equal(model(idx, edits=later).logits, model(idx).logits)


def test_one_layer_head_name_or_pair_stands_for_a_list_of_one() -> None:
    """Trace(names="attn_weights") read the string as nine one-letter names; layers=0 and
    ablate((0, 1)) raised bare TypeErrors; Edits + Edit raised an AttributeError."""
    from attnlab.interp.heads import detect_heads

    model, idx = seeded_model(), random_ids(1, 6)
    one, listed = Trace(layers=0, heads=1, names="attn_weights"), Trace([0], [1], ["attn_weights"])
    model(idx, trace=one)
    model(idx, trace=listed)
    assert [key for key in one] == [key for key in listed] == [(0, "attn_weights")]
    assert torch.equal(one.get("attn_weights", 0), listed.get("attn_weights", 0))
    assert torch.equal(model(idx, edits=ablate((0, 1))).logits,
                       model(idx, edits=ablate([(0, 1)])).logits)
    both = ablate([(0, 1)]) + zero_heads(1, 0)
    assert isinstance(both, Edits) and len(both) == 2
    assert list(detect_heads(model, detectors="induction")) == ["induction"]


def test_shapes_and_ids_that_cannot_fit_are_named() -> None:
    """set_attention, mean ablation, ablate, plot_attention, logit_attribution and
    logit_diff_metric raised bare torch or Python errors for these."""
    from attnlab.interp.lens import logit_attribution
    from attnlab.interp.patching import logit_diff_metric

    model, idx = seeded_model(), random_ids(1, 6)
    with pytest.raises(ValueError, match=r"must be \(S, S\) or \(B, S, S\).*got shape \(6,\)"):
        set_attention(0, 1, torch.ones(6))
    with pytest.raises(ValueError, match="cover 5 columns, this forward pass 6"):
        model(idx, edits=Edits([set_attention(0, 1, torch.eye(5))]))
    with pytest.raises(ValueError, match=r"ids must be a \(B, T\) integer tensor, got shape"):
        logit_attribution(model, idx[0], 3)
    with pytest.raises(ValueError, match=r"answer ids \[99\] outside the model's 65 token ids"):
        logit_diff_metric(99, 3)(model(idx).logits)
    # a count of ids, patterns, means or pairs that does not fit: torch's expand errors before
    with pytest.raises(ValueError, match=r"target has shape \(3,\): pass one id, or \(1,\)"):
        logit_attribution(model, idx, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"wrong has shape \(1, 1\): pass one id, or \(1,\)"):
        logit_diff_metric(1, torch.tensor([[2]]))(model(idx).logits)
    with pytest.raises(ValueError, match="weights hold 3 rows' patterns, this forward pass 1"):
        model(idx, edits=Edits([set_attention(0, 1, torch.eye(6).expand(3, 6, 6))]))
    with pytest.raises(ValueError, match=r"mean has shape \(1, 8\), layer 0's heads \(2, 8\)"):
        model(idx, edits=ablate((0, 1), "mean", [m[:1] for m in head_means(model, idx)]))
    with pytest.raises(ValueError, match=r"\(layer, head\) pairs.*got 1 in \[1, 2\]"):
        ablate([1, 2])
    assert torch.equal(model(idx, edits=ablate([[0, 1], [1, 0]])).logits,  # JSON's lists
                       model(idx, edits=ablate([(0, 1), (1, 0)])).logits)
    pytest.importorskip("matplotlib")
    from attnlab import viz
    weights = torch.full((2, 4, 4), 0.25)
    with pytest.raises(ValueError, match=r"one \(T, S\) matrix, got shape \(2, 4, 4\)"):
        viz.plot_attention(weights, list("abcd"))
    with pytest.raises(ValueError, match=r"3 query and 3 key labels for a \(4, 4\) matrix"):
        viz.plot_attention(weights[0], list("abc"))


def test_traces_edits_and_checkpoints_read_in_one_line() -> None:
    """What a notebook shows for them (a bare object address, or a module tree and the whole
    meta, before)."""
    from attnlab.checkpoint import Checkpoint
    from attnlab.tokenizers import CharTokenizer

    model = seeded_model()
    trace = Trace(layers=0, names=["attn_weights", "q"])
    assert repr(trace) == "Trace(layers=[0], names=['attn_weights', 'q']; nothing captured yet)"
    model(random_ids(1, 5), trace=trace)
    assert repr(trace) == ("Trace(layers=[0], names=['attn_weights', 'q']; 2 values: layers "
                           "[0], names ['attn_weights', 'q'], 0.5 kB)")  # 520 bytes
    assert repr(ablate([(1, 0)]) + scale_heads(0, 1, 0.5, positions=[3])) == (
        "Edits([Edit('context', layer=1, heads=(0,), positions=None, replace=zero_heads), "
        "Edit('context', layer=0, heads=(1,), positions=(3,), replace=scale_heads)])")
    ckpt = Checkpoint(model, CharTokenizer(list("ab")), {"step": 7}, None)
    assert repr(ckpt) == ("Checkpoint(2 layers, 2 heads, 16 dims, vocab 65, "
                          "tokenizer=CharTokenizer(name='char', vocab_size=2), step=7)")


@torch.no_grad()
def test_one_edit_a_sum_and_nested_sets_act_as_edits_of_them() -> None:
    """An Edit alone, `a + b` and Edits holding Edits give what Edits([...]) gives, bit for
    bit, in a forward pass (one edit needing the explicit path) and in generation; a list
    or a stray value is refused by name."""
    model, ids = seeded_model(), random_ids(2, 6)
    heads, spread = zero_heads(0, 1), uniform_attention(1, 0)
    whole = Edits([heads, spread])
    expected = model(ids, edits=whole).logits
    assert torch.equal(model(ids, edits=Edits([heads])).logits,
                       model(ids, edits=heads).logits)
    assert torch.equal(model(ids, edits=Edits([spread])).logits,
                       model(ids, edits=spread).logits)
    for same in (heads + spread, Edits([Edits([heads]), spread]), Edits(heads) + spread):
        assert len(same) == 2
        assert torch.equal(model(ids, edits=same).logits, expected)
    assert not torch.equal(model(ids, edits=spread).logits, expected)
    assert torch.equal(generate(model, ids, max_new_tokens=4, temperature=0, edits=heads),
                       generate(model, ids, max_new_tokens=4, temperature=0,
                                edits=Edits([heads])))
    with pytest.raises(TypeError, match=r"edits is a list, not an Edit or Edits; join"):
        model(ids, edits=[heads])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Edits holds Edit and Edits values, not 3"):
        Edits([heads, 3])  # type: ignore[list-item]
