"""model/kv_cache.py: cached decoding equals full recomputation; static == concatenating cache."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import GPT, DecodeStep, GPTConfig, KVCache
from helpers import left_padded, modern_switches


def _model(**switches: object) -> GPT:
    torch.manual_seed(0)
    # multi-query unless the switches say otherwise (latent attention: a k and v per head)
    return GPT(GPTConfig.from_name("nano", **{"n_kv_head": 1, **switches})).eval()  # type: ignore[arg-type]


@settings(max_examples=20, deadline=None)
@given(
    prompt_lens=st.lists(st.integers(1, 8), min_size=1, max_size=3),
    steps=st.integers(1, 6),
    concat=st.booleans(),
    mask_once=st.booleans(),
    seed=st.integers(0, 999),
    switches=modern_switches(latent=True),
)
def test_cached_decode_equals_recomputation(
    prompt_lens: list[int], steps: int, concat: bool, mask_once: bool, seed: int,
    switches: dict[str, object],
) -> None:
    """mask_once: the steps after the prefill give no mask, as a nanoGPT-style loop does; the
    cache keeps the prefill's pads."""
    model = _model(n_head=4, **switches)
    g = torch.Generator().manual_seed(seed)
    idx, mask = left_padded(prompt_lens, seed=seed)  # (B, P) each
    B, P = idx.shape
    cache = KVCache.concat(2) if concat else model.new_cache(B, P + steps)
    with torch.no_grad():
        logits = model(idx, attention_mask=mask, kv_cache=cache).logits[:, -1]
        for _ in range(steps):
            nxt = torch.randint(0, 65, (B, 1), generator=g)
            idx = torch.cat([idx, nxt], dim=1)
            mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.long)], dim=1)
            given = None if mask_once else mask
            logits = model(nxt, attention_mask=given, kv_cache=cache).logits[:, -1]
            full = model(idx, attention_mask=mask).logits[:, -1]
            torch.testing.assert_close(logits, full, atol=1e-5, rtol=0)
    assert cache.seq_len == P + steps


def test_static_cache_memory_is_exactly_the_buffers() -> None:
    model = _model()
    cache = model.new_cache(3, 20)
    c = model.config
    assert cache.nbytes() == 2 * c.n_layer * 3 * c.n_kv_heads * 20 * c.head_size * 4


def test_cache_overflow_and_wrong_layers_are_clear_errors() -> None:
    model = _model()
    cache = model.new_cache(1, 4)
    with pytest.raises(ValueError, match="does not fit max_len=4"):
        model(torch.zeros(1, 5, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ValueError, match="exceeds block_size"):
        model.new_cache(1, 64)
    with pytest.raises(ValueError, match="kv_cache has 3 layers, model has 2"):
        model(torch.zeros(1, 2, dtype=torch.long), kv_cache=KVCache.concat(3))
    concat = KVCache.concat(2)
    with pytest.raises(ValueError, match="can only append"):
        concat.layers[0].update(3, torch.zeros(1, 1, 1, 8), torch.zeros(1, 1, 1, 8))


def test_the_cache_keeps_a_padded_prefills_mask_for_steps_that_give_none() -> None:
    """After a left-padded prefill, DecodeStep and GPT.forward steps without a mask, in any
    order, equal the whole padded batch recomputed; the cache says it is padded."""
    model = _model(n_head=4)
    idx, mask = left_padded([2, 5, 3], seed=3)  # (B, P)
    B, P = idx.shape
    cache = model.new_cache(B, P + 4)
    step = DecodeStep(model)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        model(idx, attention_mask=mask, kv_cache=cache)
        assert "padded=True" in repr(cache)
        for use_step in (True, False, True, False):
            nxt = torch.randint(0, 65, (B, 1), generator=g)
            idx = torch.cat([idx, nxt], dim=1)
            mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.long)], dim=1)
            got = step(nxt, None, cache) if use_step else model(nxt, kv_cache=cache).logits[:, -1]
            full = model(idx, attention_mask=mask).logits[:, -1]
            torch.testing.assert_close(got, full, atol=1e-5, rtol=0)
        # reset: the next sequence, unpadded, as on a new cache
        cache.reset()
        assert (cache.seq_len, cache.attention_mask) == (0, None)
        torch.testing.assert_close(model(idx[:, :3], kv_cache=cache).logits,
                                   model(idx[:, :3]).logits, atol=1e-6, rtol=0)


def test_key_mask_counts_columns_written_without_a_mask_as_real() -> None:
    """A step that writes the cache without updating its kept mask (the compiled decode step
    does: CompiledDecode advances seq_len alone) leaves the kept mask short; the next call
    without a mask must still cover every cached column: kept pads, then real tokens."""
    cache = KVCache.concat(1)
    cache.key_mask(torch.tensor([[0, 1, 1], [1, 1, 1]]), 3)
    cache.seq_len = 5  # 3 from the padded call, 2 written since without a mask
    got = cache.key_mask(None, 1)
    assert got.tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]


def test_a_step_after_unmasked_writes_equals_recomputation() -> None:
    """The same through the model: a padded prefill, one step that leaves the kept mask as
    the prefill's (as a compiled step does), then GPT.forward without a mask equals the whole
    padded batch recomputed."""
    model = _model(n_head=4)
    idx, mask = left_padded([2, 5, 3], seed=3)
    B, P = idx.shape
    cache = model.new_cache(B, P + 2)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        model(idx, attention_mask=mask, kv_cache=cache)
        kept = cache.attention_mask
        for _ in range(2):
            nxt = torch.randint(0, 65, (B, 1), generator=g)
            idx = torch.cat([idx, nxt], dim=1)
            mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.long)], dim=1)
            if cache.seq_len == P:  # the first step: a write the kept mask never hears of
                DecodeStep(model)(nxt, None, cache)
                cache.attention_mask = kept
                continue
            got = model(nxt, kv_cache=cache).logits[:, -1]
            full = model(idx, attention_mask=mask).logits[:, -1]
            torch.testing.assert_close(got, full, atol=1e-5, rtol=0)


def test_a_concatenating_cache_refuses_a_write_before_its_end() -> None:
    """Rewriting earlier positions (a re-prefill from 0, as generate's window crop does with
    seq_len = 0) cannot work on a cache that only appends: refused, not appended."""
    layer = KVCache.concat(1).layers[0]
    layer.update(0, torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8))
    with pytest.raises(ValueError, match="can only append"):
        layer.update(0, torch.zeros(1, 1, 1, 8), torch.zeros(1, 1, 1, 8))
