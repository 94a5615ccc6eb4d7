"""generate/sampling.py: each processor equals transformers' on the same logits (5.x's
logits_process.py), ties included: repetition penalty (left padding excluded), temperature,
top-k, top-p, min-p, in generate()'s order; and the token loop keeps the seen ids."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.generate import GenerationConfig, logits_to_probs
from attnlab.generate.sampling import SeenIds, sample, warp_logits

lp = pytest.importorskip("transformers.generation.logits_process")

# a handful of values, so that most ids tie with others, across the nucleus boundary too
TIED = st.sampled_from([-2.0, -1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 3.0])
TOP_P = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.75, 0.9]), st.floats(0.0, 1.0))


@st.composite
def tie_heavy(draw: Any, max_rows: int = 3) -> torch.Tensor:
    """(B, V) logits from a few values: V up to 300, where torch's sort no longer leaves
    ties in id order (it does for a handful of ids)."""
    B = draw(st.integers(1, max_rows))
    V = draw(st.integers(2, 300))
    values = draw(st.lists(TIED, min_size=B * V, max_size=B * V))
    return torch.tensor(values).view(B, V)  # (B, V)


@st.composite
def random_logits(draw: Any, max_rows: int = 3) -> torch.Tensor:
    B, V = draw(st.integers(1, max_rows)), draw(st.integers(2, 300))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    return torch.randn(B, V, generator=g) * draw(st.sampled_from([0.5, 3.0, 10.0]))  # (B, V)


def _kept(scores: torch.Tensor) -> list[list[int]]:
    return [row.isfinite().nonzero()[:, 0].tolist() for row in scores]


@settings(max_examples=300, deadline=None)
@given(logits=tie_heavy(), top_p=TOP_P)
def test_top_p_keeps_the_ids_transformers_keeps_among_ties(
    logits: torch.Tensor, top_p: float
) -> None:
    """Fails before: attnlab kept the lowest ids among ties at the boundary (and dropped by
    the mass before an id, not transformers' running sum <= 1 - top_p)."""
    expected = lp.TopPLogitsWarper(top_p)(None, logits.clone())  # (B, V)
    probs = logits_to_probs(logits, top_p=top_p)  # (B, V)
    assert _kept(probs.log()) == _kept(expected)
    torch.testing.assert_close(probs, torch.softmax(expected, -1), atol=1e-6, rtol=0)


def _transformers(input_ids: torch.Tensor, pads: torch.Tensor, logits: torch.Tensor,
                  **how: Any) -> torch.Tensor:
    """transformers' processors in `_get_logits_processor`'s order, as generate() builds them
    (prompt_ignore_length: each row's left padding)."""
    steps: list[Any] = []
    if how["repetition_penalty"] != 1.0:
        steps.append(lp.RepetitionPenaltyLogitsProcessor(how["repetition_penalty"],
                                                         prompt_ignore_length=pads))
    if how["temperature"] != 1.0:
        steps.append(lp.TemperatureLogitsWarper(how["temperature"]))
    if how["top_k"] != 0:
        steps.append(lp.TopKLogitsWarper(how["top_k"]))
    if how["top_p"] < 1.0:
        steps.append(lp.TopPLogitsWarper(how["top_p"]))
    steps.append(lp.MinPLogitsWarper(how["min_p"]))
    return lp.LogitsProcessorList(steps)(input_ids, logits.clone())  # (B, V)


@settings(max_examples=300, deadline=None)
@given(logits=st.one_of(tie_heavy(), random_logits()), data=st.data(),
       temperature=st.sampled_from([0.3, 0.7, 1.0, 1.5]), top_p=TOP_P,
       top_k=st.integers(0, 40), min_p=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
       penalty=st.sampled_from([1.0, 0.7, 1.3, 2.0]))
def test_processed_logits_equal_transformers_batch_1_and_left_padded(
    logits: torch.Tensor, data: Any, temperature: float, top_p: float, top_k: int,
    min_p: float, penalty: float,
) -> None:
    B, V = logits.shape
    P = data.draw(st.integers(1, 12))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    input_ids = torch.randint(0, V, (B, P), generator=g)  # (B, P): pads hold real ids too
    pads = torch.tensor([data.draw(st.integers(0, P - 1)) for _ in range(B)])  # (B,)
    keep = torch.arange(P)[None, :] >= pads[:, None]  # (B, P)
    how = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
               repetition_penalty=penalty)
    expected = _transformers(input_ids, pads, logits, **how)  # (B, V)
    penalized = SeenIds(input_ids, keep, V).penalize(logits, penalty)  # (B, V)
    ours = warp_logits(penalized, temperature, top_k, top_p, min_p)  # (B, V)
    assert _kept(ours) == _kept(expected)
    finite = expected.isfinite()
    torch.testing.assert_close(ours[finite], expected[finite], atol=1e-6, rtol=0)
    # greedy: transformers runs only the penalty, then argmax (the first of tied maxima)
    greedy = lp.RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=pads)(
        input_ids, logits.clone()) if penalty != 1.0 else logits
    assert torch.equal(sample(penalized, temperature=0.0), greedy.argmax(-1))


def test_the_penalty_skips_padding_and_counts_new_ids() -> None:
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0]])  # (1, V)
    ids = torch.tensor([[2, 3, 1]])  # (1, P): the first is a pad
    seen = SeenIds(ids, torch.tensor([[False, True, True]]), vocab_size=5)
    assert seen.penalize(logits, 2.0).tolist() == [[2.0, -4.0, 2.0, -4.0, 1.0]]
    seen.add(torch.tensor([0]))
    seen.add(torch.tensor([7]))  # past the vocabulary (a pad id): no column to mark
    assert seen.penalize(logits, 2.0).tolist() == [[1.0, -4.0, 2.0, -4.0, 1.0]]
    assert seen.penalize(logits[:, :3], 0.5).tolist() == [[4.0, -1.0, 2.0]]  # vocab_size cut
    assert seen.seen.shape == (1, 6)  # the same buffer throughout: (B, V + 1)


def test_a_huge_temperature_still_keeps_the_most_likely_id() -> None:
    """The one documented difference: dividing by 3.4e38 rounds these logits to equal scores,
    which transformers would see as a tie; attnlab orders them by the logits."""
    logits = torch.tensor([[0.0, 1e-7, -1e-7, 5e-8]])  # (1, V): argmax is id 1
    for filters in ({"top_k": 1}, {"top_p": 0.0}, {"min_p": 1.0, "top_p": 0.0}):
        probs = logits_to_probs(logits, temperature=3.4028235e38, **filters)
        assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]], filters


@pytest.mark.parametrize(("field", "value", "message"), [
    ("min_p", -0.1, r"min_p=-0.1 must be in \[0, 1\]"),
    ("min_p", 1.5, r"min_p=1.5 must be in \[0, 1\]"),
    ("repetition_penalty", 0.0, "repetition_penalty=0.0 must be finite and > 0"),
    ("repetition_penalty", float("inf"), "repetition_penalty=inf must be finite and > 0"),
])
def test_out_of_range_settings_are_named(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GenerationConfig(**{field: value})  # type: ignore[arg-type]
