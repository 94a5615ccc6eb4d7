"""model/compiled_decode.py's fixed-shape step, run eagerly (torch.compile replaced by the
identity, so no compilation): over the whole static buffer with a slot tensor and a mask,
it computes what `DecodeStep` computes over the filled prefix, for every config switch.
tests/test_generate_compile.py compiles it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab.model.compiled_decode as compiled_mod
from attnlab import GPT, GPTConfig
from attnlab.model.decode import decode_step
from helpers import assert_fixed_steps_match, left_padded, modern_switches


def _identity(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
    return fn


@settings(max_examples=20, deadline=None)
@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3), seed=st.integers(0, 99),
       switches=modern_switches())
def test_static_step_equals_the_decode_step(
    lengths: list[int], seed: int, switches: dict[str, object]
) -> None:
    torch.manual_seed(seed)
    model = GPT(GPTConfig.from_name("nano", n_head=4, init_std=0.3, **switches)).eval()
    ids, mask = left_padded(lengths, seed=seed)
    padded = bool((mask == 0).any())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled_mod.torch, "compile", _identity)
        static = compiled_mod.CompiledDecode(model, ids.shape[0], 16)  # 16 slots, P + 6 used
    assert_fixed_steps_match(model, static, ids, mask if padded else None)


def test_static_step_refuses_a_full_cache_and_a_wrong_shape() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano")).eval()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled_mod.torch, "compile", _identity)
        static = compiled_mod.CompiledDecode(model, 2, 4)
    step = decode_step(model)
    with pytest.raises(ValueError, match=r"of shape \(1, 1\); this compiled step takes \(2, 1\)"):
        static(step, torch.zeros(1, 1, dtype=torch.long))
    static.cache.seq_len = 4
    with pytest.raises(ValueError, match="holds 4 slots and all are filled"):
        static(step, torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="does not cover the 4 filled slots of 2 rows"):
        static.start(torch.ones(2, 3))


def test_the_decode_step_norms_queries_and_keys_each_with_its_own_weights() -> None:
    """QK-norm (Qwen3): q_norm and k_norm hold different weights once loaded or trained; the
    decode step must apply q_norm to q and k_norm to k, as the forward pass does (freshly
    built norms are all ones, so a swap shows only with distinct weights)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_head=4, init_std=0.3, norm="rmsnorm",
                                    pos="rope", qk_norm=True)).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q_norm.weight.uniform_(0.2, 3.0)
            block.attn.k_norm.weight.uniform_(0.2, 3.0)
    ids = torch.tensor([[3, 14, 15, 9, 2, 6]])
    with torch.inference_mode():
        expected = model(ids).logits[:, -1]  # (1, V)
        cache = model.new_cache(1, ids.shape[1])
        model(ids[:, :-1], kv_cache=cache)
        got = decode_step(model)(ids[:, -1:], None, cache)  # (1, V)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_static_step_started_again_forgets_the_last_prompts_padding() -> None:
    """A kept CompiledDecode is reused by the next generation of its shape: `start` must
    clear the key mask of the previous prompt's padding, or the new prompt's tokens in
    those slots are hidden."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_head=4, init_std=0.3)).eval()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled_mod.torch, "compile", _identity)
        static = compiled_mod.CompiledDecode(model, 2, 16)
    step = decode_step(model)
    padded_ids, padded_mask = left_padded([2, 6], seed=1)  # row 0: 4 padding slots
    ids, _ = left_padded([6, 6], seed=2)  # no padding
    with torch.inference_mode():
        model(padded_ids, attention_mask=padded_mask, kv_cache=static.cache)
        static.start(padded_mask)
        static(step, torch.ones(2, 1, dtype=torch.long))
        # the next generation of this shape, unpadded
        static.cache.seq_len = 0
        cache = model.new_cache(2, 8)
        logits = model(ids, kv_cache=cache).logits[:, -1]
        model(ids, kv_cache=static.cache)
        static.start(None)
        token = logits.argmax(-1, keepdim=True)  # (2, 1)
        torch.testing.assert_close(static(step, token), step(token, None, cache),
                                   atol=1e-5, rtol=1e-5)


def test_static_step_scales_the_scores_by_the_configs_attn_scale() -> None:
    """A config's attn_scale (Gemma's query_pre_attn_scalar, muP) replaces 1/sqrt(hs): the
    static step must pass it on, as the decode step does (the switches above keep the
    default, so only a scale of its own shows a step that drops it)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_head=4, init_std=0.3, attn_scale=0.9)).eval()
    ids, mask = left_padded([3, 5], seed=3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled_mod.torch, "compile", _identity)
        static = compiled_mod.CompiledDecode(model, 2, 16)
    assert_fixed_steps_match(model, static, ids, mask)


def test_a_model_cast_to_another_dtype_gets_a_compiled_step_of_that_dtype() -> None:
    """Compiled steps are kept per (batch size, cache length, dtype, device): after
    `model.double()` the float32 step's cache cannot hold the model's keys, so the next
    generation needs a step of its own and decodes the eager path's ids."""
    from attnlab.generate import generate

    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_head=4, init_std=0.3)).eval()
    ids, mask = left_padded([3, 5], seed=4)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled_mod.torch, "compile", _identity)
        generate(model, ids, mask, max_new_tokens=4, temperature=0, compile=True)
        model.double()
        compiled = generate(model, ids, mask, max_new_tokens=4, temperature=0, compile=True)
    assert torch.equal(compiled, generate(model, ids, mask, max_new_tokens=4, temperature=0))
    dtypes = {step.cache.layers[0].k.dtype for step in compiled_mod.compiled_decodes(model)}
    assert dtypes == {torch.float32, torch.float64}
