"""interp/heads.py: detector patterns and scores against hand computations of TransformerLens's
definitions, left-padded rows (pads never count), and the probe."""

from __future__ import annotations

import pytest
import torch

from attnlab import GPT, GPTConfig, Trace
from attnlab.interp.edits import uniform_attention
from attnlab.interp.heads import (
    DETECTORS,
    detect_heads,
    detection_pattern,
    head_scores,
    head_summaries,
    rank_heads,
    repeated_tokens,
)


def _uniform_causal(T: int, pad: int = 0) -> torch.Tensor:
    """(1, 1, T + pad, T + pad): real queries spread evenly over the real keys they may see."""
    n = T + pad
    A = torch.zeros(n, n)
    A[pad:, pad:] = torch.tril(torch.ones(T, T))
    A = A / A.sum(-1, keepdim=True).clamp(min=1)
    return A[None, None]


# ids [5, 7, 5, 7]; A uniform over the causal keys: row i gives 1/(i+1) to each key, sum(A) = 4
#   previous  (1,0) (2,1) (3,2)        1/2 + 1/3 + 1/4 = 13/12
#   duplicate (2,0) (3,1)              1/3 + 1/4       = 7/12
#   induction (2,1) (3,2)              1/3 + 1/4       = 7/12   (key after the earlier copy)
#   first     (0,0) (1,0) (2,0) (3,0)  1 + 1/2 + 1/3 + 1/4 = 25/12
BY_HAND = {
    "previous_token": ([(1, 0), (2, 1), (3, 2)], 13 / 48),
    "duplicate_token": ([(2, 0), (3, 1)], 7 / 48),
    "induction": ([(2, 1), (3, 2)], 7 / 48),
    "first_token": ([(0, 0), (1, 0), (2, 0), (3, 0)], 25 / 48),
}


@pytest.mark.parametrize("kind", DETECTORS)
def test_patterns_and_scores_by_hand_with_and_without_left_padding(kind: str) -> None:
    cells, score = BY_HAND[kind]
    ids = torch.tensor([[5, 7, 5, 7]])
    expected = torch.zeros(1, 4, 4)
    for i, j in cells:
        expected[0, i, j] = 1
    assert torch.equal(detection_pattern(kind, ids), expected)
    got = head_scores(_uniform_causal(4), expected)
    torch.testing.assert_close(got, torch.tensor([score]), atol=1e-6, rtol=0)

    # two pads whose id (5) equals a real token: they never count as targets
    padded_ids = torch.tensor([[5, 5, 5, 7, 5, 7]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1]])
    pattern = detection_pattern(kind, padded_ids, mask)
    assert torch.equal(pattern[:, 2:, 2:], expected) and pattern[:, :2].sum() == 0
    assert pattern[:, :, :2].sum() == 0
    got = head_scores(_uniform_causal(4, pad=2), pattern, mask)
    torch.testing.assert_close(got, torch.tensor([score]), atol=1e-6, rtol=0)


def _transformer_lens_patterns(tokens: list[int]) -> dict[str, torch.Tensor]:
    """TransformerLens's get_*_detection_pattern, step by step as its head_detector.py
    writes them (numpy equality matrix, zeroed diagonal, roll one key right, tril)."""
    t = torch.tensor(tokens)
    T = len(tokens)
    previous = torch.zeros(T, T)
    previous[1:, :-1] = torch.eye(T - 1)
    eq = (t.repeat(T, 1) == t.repeat(T, 1).T).int()
    eq.fill_diagonal_(0)
    duplicate = torch.tril(eq.float())
    shifted = torch.roll(duplicate, shifts=1, dims=1)
    induction = torch.tril(torch.cat([torch.zeros(T, 1), shifted[:, 1:]], dim=1))
    return {"previous_token": torch.tril(previous), "duplicate_token": duplicate,
            "induction": induction}


def test_patterns_equal_transformer_lens_on_random_sequences() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        tokens = torch.randint(0, 4, (9,), generator=gen).tolist()  # many repeats
        for kind, pattern in _transformer_lens_patterns(tokens).items():
            assert torch.equal(detection_pattern(kind, torch.tensor([tokens]))[0], pattern), kind


def test_batch_mean_and_exclusions() -> None:
    ids = torch.tensor([[5, 7, 5, 7], [1, 2, 3, 4]])
    A = _uniform_causal(4).expand(2, 3, 4, 4)
    pattern = detection_pattern("first_token", ids)
    # row 2 has the same attention and the same first-token targets: mean of equal scores
    torch.testing.assert_close(head_scores(A, pattern), torch.full((3,), 25 / 48))
    # exclude_bos zeroes key 0, which holds every first-token target
    assert torch.all(head_scores(A, pattern, exclude_bos=True) == 0)
    own = A.contiguous()  # float32 weights of its own: float() hands back this very tensor
    head_scores(own, pattern, exclude_bos=True)
    assert torch.equal(own, A)  # key 0's weights are zeroed in a copy, never in the input
    # exclude_current_token: A's diagonal goes, sum(A) = 4 - 25/12 = 23/12; previous = 13/12
    prev = detection_pattern("previous_token", ids)
    torch.testing.assert_close(head_scores(A, prev, exclude_current_token=True),
                               torch.full((3,), 13 / 23))


def test_detect_heads_on_a_model_and_the_probe() -> None:
    probe = repeated_tokens(50, 6, batch=3, seed=1)
    assert probe.shape == (3, 12) and torch.equal(probe[:, :6], probe[:, 6:])
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano")).eval()
    scores = detect_heads(model)
    assert set(scores) == set(DETECTORS)
    for kind, s in scores.items():
        assert s.shape == (2, 2) and torch.all((s >= 0) & (s <= 1)), kind
    # a random-init nano model spreads attention about evenly: first-token share near the
    # uniform share of key 0, sum(1/(i+1))/T, on the probe's T = block_size = 32 tokens
    uniform = sum(1 / (i + 1) for i in range(32)) / 32
    assert torch.allclose(scores["first_token"], torch.tensor(uniform), atol=0.05)
    assert rank_heads(torch.tensor([[0.1, 0.9], [0.5, 0.9]])) == [(0, 1), (1, 1), (1, 0), (0, 0)]
    assert rank_heads(torch.tensor([[0.1, 0.9]]), descending=False) == [(0, 0), (0, 1)]
    with pytest.raises(ValueError, match="unknown detectors"):
        detect_heads(model, detectors=("copying",))
    with pytest.raises(ValueError, match="unknown detector 'x'"):
        detection_pattern("x", probe)
    with pytest.raises(ValueError, match=r"2 or more tokens per row, got ids of shape \(3, 1\)"):
        detect_heads(model, probe[:, :1])  # scored 0 for every head before


def test_right_padded_rows_score_as_each_row_alone() -> None:
    """Right padding (Hugging Face tokenizers' default side) was taken for left padding: the
    first-token column and exclude_bos counted pads from the left, and a right pad's query,
    which attends to the real tokens before it, added its weights to the denominator."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_head=4)).eval()
    row = repeated_tokens(65, 4, batch=1, seed=2)[0]  # (8,)
    ids = torch.stack([row, torch.cat([row[:6], torch.zeros(2, dtype=torch.long)])])  # (2, 8)
    mask = torch.tensor([[1] * 8, [1] * 6 + [0] * 2])
    for exclude_bos in (False, True):
        padded = detect_heads(model, ids, mask, exclude_bos=exclude_bos)
        full = detect_heads(model, ids[:1], exclude_bos=exclude_bos)
        short = detect_heads(model, ids[1:, :6], exclude_bos=exclude_bos)
        for kind in DETECTORS:
            torch.testing.assert_close(padded[kind], (full[kind] + short[kind]) / 2,
                                       atol=1e-6, rtol=0, msg=f"{kind} {exclude_bos}")


def test_a_row_with_no_attention_left_is_left_out_of_the_mean() -> None:
    """exclude_bos and exclude_current_token leave a left-padded row of 2 real tokens no
    attention at all: it used to score 0 and halve the batch's mean; now the batch scores
    as its full row alone, and a batch of such rows scores NaN (TransformerLens's 0 / 0)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_head=4)).eval()
    row = repeated_tokens(65, 4, batch=1, seed=2)[0]  # (8,)
    ids = torch.stack([row, torch.cat([torch.zeros(6, dtype=torch.long), row[:2]])])  # (2, 8)
    mask = torch.tensor([[1] * 8, [0] * 6 + [1] * 2])
    both = {"exclude_bos": True, "exclude_current_token": True}
    padded = detect_heads(model, ids, mask, **both)
    full = detect_heads(model, ids[:1], **both)
    short = detect_heads(model, ids[1:, 6:], **both)
    for kind in DETECTORS:
        if kind != "first_token":  # exclude_bos takes all of first_token's targets: 0
            assert torch.all(full[kind] > 0), kind  # so half of it would show
        torch.testing.assert_close(padded[kind], full[kind], atol=1e-6, rtol=0, msg=kind)
        assert torch.all(short[kind].isnan()), kind
    # one exclusion leaves the short row attention to score: it counts again
    one = detect_heads(model, ids, mask, exclude_bos=True)
    alone = detect_heads(model, ids[1:, 6:], exclude_bos=True)
    torch.testing.assert_close(
        one["previous_token"],
        (detect_heads(model, ids[:1], exclude_bos=True)["previous_token"]
         + alone["previous_token"]) / 2, atol=1e-6, rtol=0)
    # a row of one real token, with no exclusion, attends only to itself: left out too
    one_token = torch.stack([row, torch.cat([torch.zeros(7, dtype=torch.long), row[:1]])])
    lone = detect_heads(model, one_token, torch.tensor([[1] * 8, [0] * 7 + [1]]))
    for kind in DETECTORS:
        torch.testing.assert_close(lone[kind], detect_heads(model, ids[:1])[kind], atol=1e-6,
                                   rtol=0, msg=kind)  # it scored 0 (1 for first_token) before
    # heads with nothing to score rank last
    nan = float("nan")
    assert rank_heads(torch.tensor([[nan, 0.2], [0.7, nan]])) == [(1, 0), (0, 1), (0, 0), (1, 1)]
    assert rank_heads(torch.tensor([[nan, 0.2, 0.7]]), descending=False) == [(0, 1), (0, 2),
                                                                            (0, 0)]


def test_head_summaries_are_means_over_the_real_query_rows() -> None:
    """head_summaries' (n_layer, nh) means equal the trace's per-row summaries averaged by
    hand over the real rows (a left-padded row's pads left out); extreme_heads ranks them."""
    from attnlab import Trace
    from attnlab.interp.heads import SUMMARY_MEANS, extreme_heads, head_summaries, summary_means

    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_head=4)).eval()
    ids = torch.randint(0, 65, (2, 7))
    mask = torch.tensor([[1] * 7, [0, 0, 0, 1, 1, 1, 1]])
    means = head_summaries(model, ids, mask)
    trace = Trace(names=list(SUMMARY_MEANS)).run(model, ids, mask)
    assert set(means) == set(SUMMARY_MEANS) - {"attn_learned_sink"}  # no sinks: absent
    for name, value in means.items():
        assert value.shape == (2, 4)
        for layer in range(2):
            rows = trace.get(name, layer)  # (B, nh, T)
            by_hand = (rows[0].sum(-1) + rows[1, :, 3:].sum(-1)) / 11  # 7 + 4 real rows
            torch.testing.assert_close(value[layer], by_hand)
    one = summary_means(trace, [1], row=1)["attn_entropy"]  # row 1 alone, layer 1
    torch.testing.assert_close(one[0], trace.get("attn_entropy", 1)[1, :, 3:].mean(-1))
    rows = dict(extreme_heads(means, k=2))
    (la, h, v), _ = rows["most weight on the first token"]
    assert v == means["attn_sink"].max().item() and means["attn_sink"][la, h] == v
    (la, h, v), _ = rows["lowest entropy (nats): most peaked"]
    assert v == means["attn_entropy"].min().item()


def test_heads_of_an_edited_model_are_scored_as_edited() -> None:
    """edits= scores the model so edited: a head made uniform scores as a uniform pattern
    does, by detector and by summary; the other heads as without the edit."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_head=4)).eval()
    ids = repeated_tokens(65, 8, seed=1)  # (B, 16)
    edit = uniform_attention(1, 2)
    plain, edited = detect_heads(model, ids), detect_heads(model, ids, edits=edit)
    weights = Trace(names="attn_weights").run(model, ids, edits=edit).get("attn_weights", 1)
    for kind in DETECTORS:
        pattern = detection_pattern(kind, ids, None)
        torch.testing.assert_close(edited[kind][1], head_scores(weights, pattern, None))
        assert torch.equal(edited[kind][0], plain[kind][0])
    entropy = head_summaries(model, ids, edits=edit)["attn_entropy"]
    T = ids.shape[1]
    uniform = torch.log(torch.arange(1, T + 1, dtype=torch.float32)).mean()  # row i: log(i+1)
    torch.testing.assert_close(entropy[1, 2], uniform)


def test_summary_means_of_a_cached_pass_read_the_masks_last_columns() -> None:
    """A trace of T new queries after P cached ones holds the (B, P + T) mask; its real
    query rows are the mask's last T columns, so a row padded into the new tokens leaves
    those pads out (its first T columns would be another set of rows)."""
    from attnlab.interp.heads import SUMMARY_MEANS, summary_means

    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_head=4)).eval()
    P, T = 3, 6
    ids = torch.randint(0, 65, (2, P + T), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, P + T, dtype=torch.long)
    mask[1, :P + 2] = 0  # row 1: the cached columns and the first 2 new ones are pads
    cache = model.new_cache(2, P + T)
    model(ids[:, :P], attention_mask=mask[:, :P], kv_cache=cache)
    trace = Trace(names=list(SUMMARY_MEANS))
    model(ids[:, P:], attention_mask=mask, kv_cache=cache, trace=trace)
    means = summary_means(trace, [0, 1])  # the trace's own (B, P + T) mask
    for name, value in means.items():
        for layer in range(2):
            rows = trace.get(name, layer)  # (B, nh, T)
            by_hand = (rows[0].sum(-1) + rows[1, :, 2:].sum(-1)) / (T + T - 2)
            torch.testing.assert_close(value[layer], by_hand)

