"""interp/patching.py: full patches restore the clean run (1), no patch changes nothing (0), and a
hand-built two-layer model whose one head carries the answer puts the whole effect there;
attribution's estimates against patching and the derivative, and the metric's checks and
dtypes (how the patched runs are batched and restarted: test_patching_passes.py)."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab import GPT, GPTConfig, Trace
from attnlab.interp.edits import Edit, Edits, patch
from attnlab.interp.patching import (
    activation_patching,
    attribution_patching,
    logit_diff_metric,
    patch_effect,
)
from helpers import one_head_model


def _nano() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("nano", init_std=0.2)).eval()


def test_patching_everything_gives_one_and_nothing_gives_zero() -> None:
    model = _nano()
    gen = torch.Generator().manual_seed(0)
    clean, corrupt = torch.randint(0, 65, (2, 3, 7), generator=gen)
    metric = logit_diff_metric(answer=torch.tensor([1, 2, 3]), wrong=4)
    for layer in range(model.config.n_layer):
        def every_position(t, layer=layer):  # type: ignore[no-untyped-def]
            return Edits([patch(t, "resid_pre", layer)])

        assert patch_effect(model, clean, corrupt, metric, every_position) == 1.0
    assert patch_effect(model, clean, corrupt, metric, lambda t: Edits()) == 0.0
    result = activation_patching(model, clean, corrupt, metric)
    assert result.heads.shape == (2, 2) and result.resid.shape == (2, 7)
    # the last position's own input reaches the last logits directly
    assert result.resid[0, -1] != 0 and result.clean != result.corrupted


def test_one_answer_carrying_head_gets_the_whole_effect() -> None:
    model = one_head_model()
    clean, corrupt = torch.tensor([[1, 0, 0, 3]]), torch.tensor([[2, 0, 0, 3]])
    result = activation_patching(model, clean, corrupt, logit_diff_metric(1, 2))
    # the last query spreads 1/4 over 4 keys: clean logit diff 1/4, corrupted -1/4
    assert result.clean == pytest.approx(0.25) and result.corrupted == pytest.approx(-0.25)
    assert torch.equal(result.heads, torch.tensor([[0.0, 0.0], [1.0, 0.0]]))
    # only position 0 differs; layer 0 writes nothing, so both layers' inputs carry it there
    assert torch.equal(result.resid, torch.tensor([[1.0, 0, 0, 0], [1.0, 0, 0, 0]]))
    assert result.to_dict()["heads"] == [[0.0, 0.0], [1.0, 0.0]]


def test_clear_errors() -> None:
    model = one_head_model()
    metric = logit_diff_metric(1, 2)
    with pytest.raises(ValueError, match="same shape"):
        activation_patching(model, torch.tensor([[1, 0]]), torch.tensor([[2, 0, 0]]), metric)
    with pytest.raises(ValueError, match="score the same"):
        activation_patching(model, torch.tensor([[0, 3]]), torch.tensor([[0, 3]]), metric)
    with pytest.raises(ValueError, match="metric position 2 is out of range for 2 tokens"):
        activation_patching(model, torch.tensor([[1, 0]]), torch.tensor([[2, 0]]),
                            logit_diff_metric(1, 2, position=2))  # an IndexError before


def test_a_metric_that_reads_a_pad_is_refused_and_left_padding_works() -> None:
    """Right padding (many Hugging Face tokenizers' default) puts pads in the last column,
    where the default metric reads: an error naming the rows, never a number about a pad."""
    model = _nano()
    clean = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    corrupt = torch.tensor([[1, 7, 3, 4], [5, 8, 0, 0]])
    right = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    metric = logit_diff_metric(answer=1, wrong=2)
    with pytest.raises(ValueError, match=r"padded position .* rows \[1\]\); pad on the left"):
        activation_patching(model, clean, corrupt, metric, attention_mask=right)
    with pytest.raises(ValueError, match="padded position"):
        patch_effect(model, clean, corrupt, metric, lambda t: Edits(), attention_mask=right)
    left = right.flip(-1)
    effect = patch_effect(model, clean.flip(-1), corrupt.flip(-1), metric,
                          lambda t: Edits([patch(t, "resid_pre", 0)]), attention_mask=left)
    assert effect == pytest.approx(1.0)


def test_attribution_equals_patching_where_the_metric_is_linear() -> None:
    # uniform attention, no norm, no MLP: the logits are linear in every head output and
    # residual, so the first-order estimate is the patching effect itself
    model = one_head_model()
    clean, corrupt = torch.tensor([[1, 0, 0, 3]]), torch.tensor([[2, 0, 0, 3]])
    metric = logit_diff_metric(1, 2)
    exact = activation_patching(model, clean, corrupt, metric)
    estimate = attribution_patching(model, clean, corrupt, metric)
    torch.testing.assert_close(estimate.heads, exact.heads, atol=1e-6, rtol=0)
    torch.testing.assert_close(estimate.resid, exact.resid, atol=1e-6, rtol=0)
    assert (estimate.clean, estimate.corrupted) == (exact.clean, exact.corrupted)


def test_attribution_is_the_derivative_along_clean_minus_corrupted() -> None:
    """Each estimate is the directional derivative of the metric, at the corrupted run, along
    that value's clean - corrupted difference (central differences in float64, the metric
    too), with left padding; the parameters get no gradient, and frozen ones
    still give one."""
    model = _nano().double()
    for p in model.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(1)
    clean, corrupt = torch.randint(0, 65, (2, 2, 6), generator=gen)
    corrupt[:, -1] = clean[:, -1]
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    metric = logit_diff_metric(answer=torch.tensor([3, 4]), wrong=5)
    result = attribution_patching(model, clean, corrupt, metric, attention_mask=mask)
    trace = Trace(names=["context", "resid_pre"])
    model(clean, attention_mask=mask, trace=trace)

    def slope(name: str, layer: int, **where: tuple[int, ...]) -> float:
        """d metric / d step, moving `name`'s selected cells from corrupted toward clean."""
        toward, eps = trace.get(name, layer), 1e-3
        ends = []
        for step in (eps, -eps):
            edit = Edit(name, layer, lambda v, f, s=step: v + s * (toward - v), **where)
            with torch.no_grad():
                ends.append(float(metric(model(corrupt, attention_mask=mask,
                                               edits=Edits([edit])).logits)))
        return (ends[0] - ends[1]) / (2 * eps) / (result.clean - result.corrupted)

    for layer, head in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        assert slope("context", layer, heads=(head,)) == pytest.approx(
            float(result.heads[layer, head]), rel=1e-3, abs=1e-4)
    for layer, pos in [(0, 1), (0, 3), (1, 2), (1, 5)]:
        assert slope("resid_pre", layer, positions=(pos,)) == pytest.approx(
            float(result.resid[layer, pos]), rel=1e-3, abs=1e-4)
    assert result.heads.abs().min() > 1e-3 and result.resid[:, 2:5].abs().min() > 1e-3
    assert result.resid[0, 5] == 0  # the same last token: layer 0 sees no difference there
    assert all(p.grad is None and not p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="padded position"):
        attribution_patching(model, clean, corrupt, metric, attention_mask=mask.flip(-1))


def test_a_metric_that_is_not_one_number_is_refused() -> None:
    """A per-row metric (B,) used to fail inside float() with "only one element tensors can
    be converted to Python scalars", which names neither the metric nor the fix."""
    model = _nano()
    gen = torch.Generator().manual_seed(0)
    clean, corrupt = torch.randint(0, 65, (2, 2, 5), generator=gen)

    def per_row(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1, 1] - logits[:, -1, 2]  # (B,): not reduced

    for method in (activation_patching, attribution_patching):
        with pytest.raises(ValueError, match=r"metric returned a tensor of shape \(2,\).*mean"):
            method(model, clean, corrupt, per_row)
    with pytest.raises(ValueError, match=r"metric returned a str; it must return one number"):
        activation_patching(model, clean, corrupt, lambda logits: "0.5")  # type: ignore
    # a batch of one's (1,) and a Python float are one number: the same effects as a 0-d
    one, other = clean[:1], corrupt[:1]
    expected = activation_patching(model, one, other, lambda lg: per_row(lg).sum())
    for same in (per_row, lambda lg: float(per_row(lg))):
        got = activation_patching(model, one, other, same)  # type: ignore[arg-type]
        assert got.heads.tolist() == expected.heads.tolist()


def test_attribution_without_a_gradient_says_why() -> None:
    """A metric with no gradient (one that detaches its value, say) and a call under
    torch.inference_mode used to end in autograd's "element 0 of tensors does not require
    grad"."""
    model = _nano()
    gen = torch.Generator().manual_seed(0)
    clean, corrupt = torch.randint(0, 65, (2, 1, 5), generator=gen)
    diff = logit_diff_metric(1, 2)

    def read_out(logits: torch.Tensor) -> torch.Tensor:
        return diff(logits).detach()  # the value, without its graph

    with pytest.raises(ValueError, match="no gradient with respect to the logits"):
        attribution_patching(model, clean, corrupt, read_out)
    with torch.inference_mode(), pytest.raises(ValueError, match="inference_mode"):
        attribution_patching(model, clean, corrupt, logit_diff_metric(1, 2))


def test_the_logit_difference_keeps_float64() -> None:
    """The metric cast every logit to float32, so a float64 model's logit difference kept ~7
    digits: 1 + 1e-12 against 1 gave 0. Half precision still comes back as float32."""
    logits = torch.tensor([[[1.0 + 1e-12, 1.0]]], dtype=torch.float64)  # (1, 1, 2)
    value = logit_diff_metric(0, 1)(logits)
    assert value.dtype == torch.float64 and float(value) == pytest.approx(1e-12, rel=1e-3)
    assert logit_diff_metric(0, 1)(logits.bfloat16()).dtype == torch.float32


def test_a_float64_model_gets_float64_effects() -> None:
    # effects were float32 whatever the model: a float64 study got 7 digits back
    model = _nano().double()
    gen = torch.Generator().manual_seed(2)
    clean, corrupt = torch.randint(0, 65, (2, 1, 5), generator=gen)
    metric = logit_diff_metric(3, 4)
    for patching in (activation_patching, attribution_patching):
        result = patching(model, clean, corrupt, metric)
        assert result.heads.dtype == result.resid.dtype == torch.float64, patching.__name__
    assert activation_patching(_nano(), clean, corrupt, metric).heads.dtype == torch.float32


def test_no_change_over_a_negative_gap_is_zero_not_minus_zero() -> None:
    """An effect is (patched - corrupted) / (clean - corrupted): a patch that changes nothing,
    over a clean run that scores below the corrupted one, is 0.0 / a negative gap = -0.0,
    which patch.json would write as -0.0 and a plain format print as -0.00; it is +0.0."""
    model = one_head_model()
    clean, corrupt = torch.tensor([[1, 0, 0, 3]]), torch.tensor([[2, 0, 0, 3]])
    result = activation_patching(model, clean, corrupt, logit_diff_metric(2, 1))  # swapped
    assert result.clean == pytest.approx(-0.25) and result.corrupted == pytest.approx(0.25)
    assert torch.equal(result.heads, torch.tensor([[0.0, 0.0], [1.0, 0.0]]))
    assert not torch.signbit(result.heads).any() and not torch.signbit(result.resid).any()
    assert "-0.0" not in json.dumps(result.to_dict())



def test_a_metric_used_on_batches_of_other_sizes_reads_every_row() -> None:
    """logit_diff_metric keeps its checked ids per batch size: one metric used on 2 rows and
    then on 3 reads all 3 rows, not the 2 whose ids it kept first."""
    logits = torch.randn(3, 4, 7, generator=torch.Generator().manual_seed(0))  # (B, T, V)
    metric = logit_diff_metric(1, 2)
    two = metric(logits[:2])
    torch.testing.assert_close(two, (logits[:2, -1, 1] - logits[:2, -1, 2]).mean().to(two))
    three = metric(logits)
    torch.testing.assert_close(three, (logits[:, -1, 1] - logits[:, -1, 2]).mean().to(three))
