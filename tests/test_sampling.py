"""generate/sampling.py: each processor equals transformers' on the same logits (5.x's
logits_process.py), ties included: repetition penalty (left padding excluded), no-repeat
n-grams (left padding excluded: a row alone), temperature, top-k, top-p, min-p, typical-p, in
generate()'s order; and the token loop keeps the seen ids and each row's n-grams."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from attnlab import GPT, GPTConfig
from attnlab.generate import GenerationConfig, generate, logits_to_probs
from attnlab.generate.sampling import SeenIds, ban_repeated_ngrams, sample, warp_logits
from helpers import left_padded

lp = pytest.importorskip("transformers.generation.logits_process")

# a handful of values, so that most ids tie with others, across the nucleus boundary too
TIED = st.sampled_from([-2.0, -1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 3.0])
TOP_P = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 0.75, 0.9]), st.floats(0.0, 1.0))
TYPICAL_P = st.one_of(st.sampled_from([0.05, 0.2, 0.5, 0.9, 0.95]),
                      st.floats(0.0, 1.0, exclude_min=True, exclude_max=True))


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


@settings(max_examples=300, deadline=None)
@given(logits=st.one_of(tie_heavy(), random_logits()), typical_p=TYPICAL_P)
def test_typical_p_keeps_the_ids_transformers_keeps_among_ties(
    logits: torch.Tensor, typical_p: float
) -> None:
    """Fails before: warp_logits had no typical_p."""
    expected = lp.TypicalLogitsWarper(typical_p)(None, logits.clone())  # (B, V)
    ours = warp_logits(logits, typical_p=typical_p)  # (B, V)
    assert _kept(ours) == _kept(expected)
    assert torch.equal(ours, expected)  # the same calls on the same values: bit for bit


def _ngrams_alone(input_ids: torch.Tensor, pads: torch.Tensor, logits: torch.Tensor,
                  size: int) -> torch.Tensor:
    """transformers' NoRepeatNGramLogitsProcessor on each row without its left padding: what
    it bans the row alone (on the padded batch it would read the padding as ids)."""
    processor = lp.NoRepeatNGramLogitsProcessor(size)
    return torch.cat([processor(input_ids[b:b + 1, int(pads[b]):], logits[b:b + 1].clone())
                      for b in range(len(logits))])  # (B, V)


@settings(max_examples=300, deadline=None)
@given(logits=random_logits(), data=st.data(), size=st.integers(1, 5))
def test_the_ngram_ban_equals_transformers_on_each_row_alone(
    logits: torch.Tensor, data: Any, size: int
) -> None:
    """Fails before: there was no n-gram ban. Ids from a few values, so n-grams repeat; ids
    past the logits' width (a tokenizer smaller than the model) ban nothing there."""
    B, V = logits.shape
    P = data.draw(st.integers(1, 16))
    high = data.draw(st.sampled_from([2, 3, 5, V + 3]))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    input_ids = torch.randint(0, high, (B, P), generator=g)  # (B, P)
    expected = lp.NoRepeatNGramLogitsProcessor(size)(input_ids, logits.clone())  # (B, V)
    assert torch.equal(ban_repeated_ngrams(logits, input_ids, None, size), expected)
    pads = torch.tensor([data.draw(st.integers(0, P - 1)) for _ in range(B)])  # (B,)
    keep = torch.arange(P)[None, :] >= pads[:, None]  # (B, P)
    assert torch.equal(ban_repeated_ngrams(logits, input_ids, keep, size),
                       _ngrams_alone(input_ids, pads, logits, size))


def test_the_ngram_ban_skips_the_padding_transformers_reads() -> None:
    """The one difference from transformers' processor on a padded batch: its padding holds
    ids, which transformers reads as n-grams (here the pad 7 followed by 7 bans 7 after a
    7, and the bigram 7 5 bans 5); attnlab bans what the row alone would be banned."""
    logits = torch.zeros(1, 10)  # (1, V)
    ids = torch.tensor([[7, 7, 5, 7]])  # (1, P): two pads, then 5 7
    keep = torch.tensor([[False, False, True, True]])
    padded = lp.NoRepeatNGramLogitsProcessor(2)(ids, logits.clone())
    assert padded[0].isinf().nonzero()[:, 0].tolist() == [5, 7]
    assert ban_repeated_ngrams(logits, ids, keep, 2).isinf().sum() == 0  # 5 7 alone: no repeat
    assert ban_repeated_ngrams(logits, ids, None, 2).isinf().nonzero()[:, 1].tolist() == [5, 7]


def _transformers(input_ids: torch.Tensor, pads: torch.Tensor, logits: torch.Tensor,
                  **how: Any) -> torch.Tensor:
    """transformers' processors in `_get_logits_processor`'s order, as generate() builds them
    (prompt_ignore_length: each row's left padding; the n-gram ban on each row alone)."""
    if how["repetition_penalty"] != 1.0:
        logits = lp.RepetitionPenaltyLogitsProcessor(
            how["repetition_penalty"], prompt_ignore_length=pads)(input_ids, logits.clone())
    if how["no_repeat_ngram_size"] > 0:
        logits = _ngrams_alone(input_ids, pads, logits, how["no_repeat_ngram_size"])
    steps: list[Any] = []
    if how["temperature"] != 1.0:
        steps.append(lp.TemperatureLogitsWarper(how["temperature"]))
    if how["top_k"] != 0:
        steps.append(lp.TopKLogitsWarper(how["top_k"]))
    if how["top_p"] < 1.0:
        steps.append(lp.TopPLogitsWarper(how["top_p"]))
    steps.append(lp.MinPLogitsWarper(how["min_p"]))
    if how["typical_p"] < 1.0:
        steps.append(lp.TypicalLogitsWarper(how["typical_p"]))
    return lp.LogitsProcessorList(steps)(input_ids, logits.clone())  # (B, V)


@settings(max_examples=300, deadline=None)
@given(logits=st.one_of(tie_heavy(), random_logits()), data=st.data(),
       temperature=st.sampled_from([0.3, 0.7, 1.0, 1.5]), top_p=TOP_P,
       top_k=st.integers(0, 40), min_p=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
       penalty=st.sampled_from([1.0, 0.7, 1.3, 2.0]),
       typical_p=st.one_of(st.just(1.0), TYPICAL_P), ngram=st.sampled_from([0, 0, 1, 2, 3]))
def test_processed_logits_equal_transformers_batch_1_and_left_padded(
    logits: torch.Tensor, data: Any, temperature: float, top_p: float, top_k: int,
    min_p: float, penalty: float, typical_p: float, ngram: int,
) -> None:
    B, V = logits.shape
    P = data.draw(st.integers(1, 12))
    high = data.draw(st.sampled_from([3, V]))  # a few ids: n-grams repeat
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    input_ids = torch.randint(0, high, (B, P), generator=g)  # (B, P): pads hold real ids too
    pads = torch.tensor([data.draw(st.integers(0, P - 1)) for _ in range(B)])  # (B,)
    keep = torch.arange(P)[None, :] >= pads[:, None]  # (B, P)
    how = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
               typical_p=typical_p, repetition_penalty=penalty, no_repeat_ngram_size=ngram)
    expected = _transformers(input_ids, pads, logits, **how)  # (B, V)
    penalized = SeenIds(input_ids, keep, V).penalize(logits, penalty)  # (B, V)
    penalized = ban_repeated_ngrams(penalized, input_ids, keep, ngram)  # (B, V)
    assume(bool(penalized.isfinite().any(-1).all()))  # every id banned: NaN rows, both sides
    ours = warp_logits(penalized, temperature, top_k, top_p, min_p, typical_p)  # (B, V)
    assert _kept(ours) == _kept(expected)
    finite = expected.isfinite()
    torch.testing.assert_close(ours[finite], expected[finite], atol=1e-6, rtol=0)
    # greedy: transformers runs only the penalty and the n-gram ban, then argmax (the first
    # of tied maxima)
    greedy = _transformers(input_ids, pads, logits, **{**how, "temperature": 1.0, "top_k": 0,
                                                        "top_p": 1.0, "min_p": 0.0,
                                                        "typical_p": 1.0})
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
    ("typical_p", 0.0, r"typical_p=0.0 must be in \(0, 1\]"),
    ("typical_p", 1.5, r"typical_p=1.5 must be in \(0, 1\]"),
    ("typical_p", float("nan"), r"typical_p=nan must be in \(0, 1\]"),
    ("no_repeat_ngram_size", -1, "no_repeat_ngram_size=-1 must be an integer >= 0"),
    ("no_repeat_ngram_size", 2.0, "no_repeat_ngram_size=2.0 must be an integer >= 0"),
])
def test_out_of_range_settings_are_named(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GenerationConfig(**{field: value})  # type: ignore[arg-type]


@settings(max_examples=10, deadline=None)
@given(pad_id=st.integers(0, 64), size=st.integers(1, 3), seed=st.integers(0, 99))
def test_greedy_without_repeated_ngrams_equals_each_row_alone(
    pad_id: int, size: int, seed: int
) -> None:
    """Fails before: generate() took no no_repeat_ngram_size. Each row of a left-padded batch
    (its padding filled with any id) is what rerunning that row alone gives under
    transformers' processor, which sees the prompt and every id generated since."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=12)).eval()  # few ids: n-grams recur
    lengths, steps = [2, 7, 4], 16
    ids, mask = left_padded(lengths, vocab=12, seed=seed)
    ids = ids.masked_fill(mask == 0, pad_id % 12)  # (B, P)
    out = generate(model, ids, mask, max_new_tokens=steps, temperature=0,
                   no_repeat_ngram_size=size)
    ban = lp.NoRepeatNGramLogitsProcessor(size)
    for b, n in enumerate(lengths):
        row = ids[b:b + 1, -n:]  # (1, n)
        for _ in range(steps):
            with torch.no_grad():
                logits = model(row).logits[:, -1]  # (1, V)
            row = torch.cat([row, ban(row, logits).argmax(-1, keepdim=True)], dim=1)
        assert torch.equal(out[b:b + 1, -(n + steps):], row), (b, pad_id)


def test_greedy_with_the_ngram_ban_never_repeats_what_plain_greedy_repeats() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=12, block_size=64)).eval()
    ids, mask = left_padded([3, 6], vocab=12, seed=1)
    plain = generate(model, ids, mask, max_new_tokens=30, temperature=0)
    banned = generate(model, ids, mask, max_new_tokens=30, temperature=0, no_repeat_ngram_size=3)

    def trigrams(row: list[int]) -> list[tuple[int, ...]]:
        return [tuple(row[i:i + 3]) for i in range(len(row) - 2)]

    for b, n in enumerate([3, 6]):
        assert len(set(trigrams(plain[b, -(n + 30):].tolist()))) < 30 + n - 2  # it repeats
        grams = trigrams(banned[b, -(n + 30):].tolist())
        assert len(set(grams)) == len(grams)


def test_row_seeds_sample_each_row_with_typical_p_as_alone() -> None:
    """The per-row draws (row_seeds: --prompt-file with --seed) take typical_p and the
    n-gram ban too: each row of the batch equals its prompt alone drawn from a generator
    seeded alike (one generator, the other path)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=12, block_size=64)).eval()
    ids, mask = left_padded([3, 6], vocab=12, seed=1)
    how: dict[str, Any] = dict(max_new_tokens=20, temperature=1.5, typical_p=0.3,
                               no_repeat_ngram_size=2)
    batch = generate(model, ids, mask, row_seeds=[4, 5], **how)
    for b, (n, seed) in enumerate(zip([3, 6], [4, 5], strict=True)):
        alone = generate(model, ids[b:b + 1, -n:], seed=seed, **how)
        assert torch.equal(batch[b, -(n + 20):], alone[0])
        plain = generate(model, ids[b:b + 1, -n:], seed=seed, max_new_tokens=20,
                         temperature=1.5)
        assert not torch.equal(plain, alone)


def test_sampling_with_every_id_banned_names_the_row_and_the_setting() -> None:
    # 5 ids and no repeated 1-gram: the fourth new token has nothing left to draw
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=16, vocab_size=5)).eval()
    with pytest.raises(ValueError, match=r"row\(s\) \[0\] have no id left.*no_repeat_ngram_size"):
        generate(model, torch.tensor([[1, 2]]), max_new_tokens=4, temperature=1.0,
                 no_repeat_ngram_size=1, seed=0)
