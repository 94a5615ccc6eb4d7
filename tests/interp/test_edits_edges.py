"""interp/edits.py at its edges: a given attention pattern and a patch in cached passes
(decode steps, a prompt fed in two chunks), the checks at their boundaries (the first block
a pass runs, grouped-query key heads), mean ablation per layer and over padded rows, and a
replacement of another dtype. (The seam's ordinary use: tests/interp/test_edits.py.)"""

from __future__ import annotations

import pytest
import torch

from attnlab import GPT, Trace
from attnlab.generate import generate
from attnlab.interp.edits import (
    Edit,
    Edits,
    ablate,
    head_means,
    mean_heads,
    patch,
    set_attention,
    zero_heads,
)
from helpers import left_padded, random_ids, seeded_model


@torch.no_grad()
def _recomputed(model: GPT, idx: torch.Tensor, edits: Edits, n: int) -> torch.Tensor:
    """Greedy ids from the whole sequence recomputed at every step, no cache."""
    for _ in range(n):
        logits = model(idx, edits=edits).logits[:, -1]  # (B, V)
        idx = torch.cat([idx, logits.argmax(-1, keepdim=True)], dim=1)
    return idx


def test_a_set_pattern_in_cached_generation_equals_recomputing() -> None:
    """A decode step computes the last query's row alone: it must take the pattern's row
    of its own column, not the first row."""
    model = seeded_model(n_head=4, init_std=0.2)
    S = model.config.block_size
    pattern = torch.zeros(S, S)  # each query: half on the first token, half on itself
    pattern[:, 0] = 0.5
    pattern[torch.arange(S), torch.arange(S)] += 0.5
    edits = Edits([set_attention(0, [0, 1, 2, 3], pattern), set_attention(1, [1, 3], pattern)])
    idx = random_ids(2, 5, seed=3)
    cached = generate(model, idx, max_new_tokens=6, temperature=0, edits=edits)
    assert torch.equal(cached, _recomputed(model, idx, edits, 6))


@pytest.mark.parametrize(("name", "layer"), [("resid_pre", 1), ("context", 0), ("k", 1)])
def test_a_patch_over_a_prompt_fed_in_two_chunks_equals_one_pass(
        name: str, layer: int) -> None:
    """The second chunk starts inside the source's columns and runs past them: its patched
    columns take the source's columns of the same absolute positions."""
    model = seeded_model(n_head=4)
    source = Trace()
    model(random_ids(2, 5, seed=9), trace=source)  # columns 0..4
    edits = Edits([patch(source, name, layer, positions=[1, 3, 4])])
    ids = random_ids(2, 7, seed=2)
    with torch.no_grad():
        whole = model(ids, edits=edits).logits  # (B, 7, V)
        cache = model.new_cache(2, 7)
        first = model(ids[:, :3], kv_cache=cache, edits=edits).logits
        second = model(ids[:, 3:], kv_cache=cache, edits=edits).logits  # columns 3..6
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole, atol=1e-5, rtol=0)
    assert not torch.allclose(whole, model(ids).logits, atol=1e-4)  # the patch did something


def test_an_edit_just_before_the_first_block_a_pass_runs_is_refused() -> None:
    config = seeded_model(n_layer=3).config
    with pytest.raises(ValueError, match=r"at layer 1: this pass starts at block 2"):
        Edits([zero_heads(1, 0)]).check(config, start=2)
    Edits([zero_heads(2, 0)]).check(config, start=2)  # the first block it runs: fine


def test_key_and_value_heads_are_checked_against_the_key_value_head_count() -> None:
    """Grouped-query attention: 4 query heads share 2 key/value heads, so "k" and "v" have
    heads 0 and 1 only; head 3 is refused before any pass, as a query head 4 is."""
    config = seeded_model(n_head=4, n_kv_head=2).config
    for name in ("k", "v"):
        with pytest.raises(ValueError, match=rf"edit heads \[3\] out of range for 2 heads "
                                             rf"in '{name}'"):
            Edit(name, 0, lambda v, _: v, heads=(3,)).check(config)
    Edit("q", 0, lambda v, _: v, heads=(3,)).check(config)


def test_head_means_of_a_padded_batch_average_its_real_tokens_only() -> None:
    model = seeded_model(n_head=4)
    idx, mask = left_padded([6, 2, 4], seed=5)
    trace = Trace(names=["context"]).run(model, idx, mask)
    means = head_means(model, idx, mask)
    real = mask.bool()
    for layer, mean in enumerate(means):
        context = trace.get("context", layer)  # (B, nh, T, hs)
        expected = context.permute(0, 2, 1, 3)[real].mean(dim=0)  # (nh, hs)
        torch.testing.assert_close(mean, expected, atol=1e-6, rtol=0)


def test_mean_ablation_takes_each_layers_own_means() -> None:
    model = seeded_model(n_head=4)
    idx = random_ids(2, 6)
    means = head_means(model, random_ids(4, 6, seed=8))
    assert not torch.allclose(means[0], means[1])
    ablated = model(idx, edits=ablate([(1, 2), (0, 1)], "mean", means)).logits
    by_hand = Edits([mean_heads(0, [1], means[0]), mean_heads(1, [2], means[1])])
    assert torch.equal(ablated, model(idx, edits=by_hand).logits)


def test_a_replacement_of_another_dtype_takes_the_values_dtype() -> None:
    """A replacement made in float32 (torch's default) for a float64 model is cast to the
    value's dtype, selecting cells or not: the pass stays in float64."""
    model = seeded_model(n_head=4).double()
    idx = random_ids(2, 6)

    def zeros(v: torch.Tensor, _: int) -> torch.Tensor:
        return torch.zeros(v.shape)  # float32

    for select in ({}, {"positions": (2,)}):
        edited = model(idx, edits=Edit("mlp_hidden", 0, zeros, **select)).logits
        assert edited.dtype == torch.float64
        same = Edit("mlp_hidden", 0, lambda v, _: torch.zeros_like(v), **select)
        assert torch.equal(edited, model(idx, edits=same).logits)
