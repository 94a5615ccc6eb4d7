"""Latent attention's own cache (`kv_cache.LatentLayerCache`, `latent.py`): the latents and
RoPE parts alone, expanded into the heads' k and v or attended to in the latent space
(absorbed), against the forward without a cache and the per-head cache; what each costs; and
the edits only a per-head cache can keep."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import GPT, Trace
from attnlab.generate import generate, generation_memory
from attnlab.interp.edits import Edit
from attnlab.model.decode import DecodeStep
from attnlab.model.kv_cache import LatentLayerCache
from attnlab.model.latent import LatentAttention
from helpers import latent_config

WAYS = {"absorbed": True, "expanded": False, "by cost": None}


def _latents(model: GPT) -> list[LatentAttention]:
    return [block.attn for block in model.blocks]  # type: ignore[misc]


@settings(max_examples=20, deadline=None)
@given(q_latent=st.sampled_from([None, 6]), v_head_dim=st.sampled_from([None, 5]),
       pairs=st.booleans(), way=st.sampled_from(sorted(WAYS)), B=st.integers(1, 3),
       T=st.integers(2, 12), data=st.data(), seed=st.integers(0, 99))
def test_each_way_through_the_latent_cache_gives_the_forwards_logits(
        q_latent: int | None, v_head_dim: int | None, pairs: bool, way: str, B: int, T: int,
        data: st.DataObject, seed: int) -> None:
    """A left-padded prefill, then steps of one or more tokens over the latent cache: absorbed,
    expanded or either by cost, the logits of the forward over the whole sequence, as a
    per-head cache gives them."""
    torch.manual_seed(seed)
    model = GPT(latent_config(q_latent, v_head_dim, pairs)).eval()
    for attn in _latents(model):
        attn.absorb = WAYS[way]
    lengths = data.draw(st.lists(st.integers(1, T), min_size=B, max_size=B))
    keep = torch.zeros(B, T, dtype=torch.long)  # (B, T) left padding
    for b, n in enumerate(lengths):
        keep[b, T - n:] = 1
    cuts = [*sorted(set(data.draw(st.lists(st.integers(1, T - 1), max_size=3)))), T]
    ids = torch.randint(0, 41, (B, T), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        whole = model(ids, attention_mask=keep).logits  # (B, T, V)
        for per_head in (False, True):
            cache, start, pieces = model.new_cache(B, T, per_head=per_head), 0, []
            for end in cuts:
                pieces.append(model(ids[:, start:end], attention_mask=keep[:, :end],
                                    kv_cache=cache).logits)
                start = end
            assert isinstance(cache.layers[0], LatentLayerCache) != per_head
            real = keep.bool()
            torch.testing.assert_close(torch.cat(pieces, 1)[real], whole[real], atol=2e-5,
                                       rtol=1e-5)


def test_the_cache_holds_the_latents_and_rope_parts_alone() -> None:
    """n_layer x B x positions x (kv_latent + rd) numbers, as generation_memory counts them;
    the per-head cache 2 x nh x hs a position; DeepSeek-V2-Lite's 576 against 6,144."""
    model = GPT(latent_config()).eval()
    cache, heads = model.new_cache(3, 20), model.new_cache(3, 20, per_head=True)
    assert cache.nbytes() == 2 * 3 * 20 * (7 + 4) * 4
    assert heads.nbytes() == 2 * 2 * 3 * 20 * 3 * 10 * 4
    counted = generation_memory(model, 3, 20)[0]
    assert counted.elements * 4 == cache.nbytes()
    assert repr(cache) == "KVCache(2 layers, seq_len=0, max_len=20, padded=False)"


def test_attending_in_the_latent_space_is_chosen_where_it_costs_less() -> None:
    """DeepSeek-V2-Lite's shape: one new token over a long cache absorbs, a prefill expands; a
    model's `absorb` decides where set."""
    attn = LatentAttention(2048, 16, 192, kv_latent=512, q_latent=None, rope_head_dim=64,
                           v_head_dim=128)
    assert attn.absorbs(1, 4096) and attn.absorbs(8, 4096)
    assert not attn.absorbs(4096, 4096) and not attn.absorbs(1024, 1024)
    attn.absorb = False
    assert not attn.absorbs(1, 4096)
    attn.absorb = True
    assert attn.absorbs(4096, 4096)


def test_a_trace_over_the_latent_cache_sees_each_heads_keys_and_values() -> None:
    """A traced step over the latent cache expands every cached latent: its k, v and weights
    are the per-head cache's."""
    torch.manual_seed(0)
    model = GPT(latent_config()).eval()
    ids = torch.randint(0, 41, (2, 9), generator=torch.Generator().manual_seed(3))
    seen = []
    with torch.no_grad():
        for per_head in (False, True):
            cache = model.new_cache(2, 9, per_head=per_head)
            model(ids[:, :8], kv_cache=cache)
            trace = Trace(names=["k", "v", "attn_weights"])
            model(ids[:, 8:], kv_cache=cache, trace=trace)
            seen.append(trace)
    for name in ("k", "v", "attn_weights"):
        torch.testing.assert_close(seen[0].get(name, 1), seen[1].get(name, 1))
    assert seen[0].get("k", 1).shape == (2, 3, 9, 10)


def test_an_edit_of_a_heads_keys_needs_the_per_head_cache_which_generate_then_makes() -> None:
    """An edit of k_pre_rope cannot be kept in latents: refused over a latent cache by name;
    `generate` with one makes a per-head cache, and its greedy ids are those of the edited
    forward over each whole sequence."""
    torch.manual_seed(0)
    model = GPT(latent_config()).eval()
    ids = torch.randint(0, 41, (1, 5), generator=torch.Generator().manual_seed(2))
    edit = Edit("k_pre_rope", 1, lambda k, first: -2.0 * k)
    with torch.no_grad(), pytest.raises(ValueError, match=r"an edit of k_pre_rope .*"
                                                          r"new_cache\(B, max_len, per_head"):
        model(ids, kv_cache=model.new_cache(1, 5), edits=edit)
    greedy = generate(model, ids, max_new_tokens=6, temperature=0.0, edits=edit)  # (1, 11)
    with torch.no_grad():
        for t in range(5, 11):
            assert greedy[0, t] == model(greedy[:, :t], edits=edit).logits[0, -1].argmax()


def test_a_latent_cache_is_refused_where_no_latent_attention_reads_it() -> None:
    latent = GPT(latent_config()).eval()
    plain = GPT(latent_config(kv_latent=None)).eval()
    with pytest.raises(ValueError, match="kv_cache holds latents"):
        plain(torch.zeros(1, 3, dtype=torch.long), kv_cache=latent.new_cache(1, 5))
    with pytest.raises(ValueError, match="a latent-attention cache for a decode step"):
        DecodeStep(plain)(torch.zeros(1, 1, dtype=torch.long), None, latent.new_cache(1, 5))
    with pytest.raises(ValueError, match=r"latent of shape \(2, 3, 7\) .* do not fit"):
        latent(torch.zeros(2, 3, dtype=torch.long), kv_cache=latent.new_cache(1, 5))


def test_in_bfloat16_the_absorbed_step_is_as_close_to_float32_as_the_expanded() -> None:
    """Another order of products, rounded in bfloat16: a decode step over 40 cached tokens
    absorbed stays within twice the bfloat16 forward's distance from float32's logits (the
    expanded step's is the forward's, to the bit)."""
    torch.manual_seed(0)
    model = GPT(latent_config(q_latent=None, n_embd=48, block_size=48)).eval()
    ids = torch.randint(0, 41, (1, 41), generator=torch.Generator().manual_seed(5))
    steps = {}
    with torch.no_grad():
        wide = model(ids).logits[0, -1]  # (V,) float32
        model = model.to(torch.bfloat16)
        whole = model(ids).logits[0, -1].float()
        for absorb in (True, False):
            for attn in _latents(model):
                attn.absorb = absorb
            cache = model.new_cache(1, 41)
            model(ids[:, :40], kv_cache=cache)
            steps[absorb] = model(ids[:, 40:], kv_cache=cache).logits[0, -1].float()
    assert torch.equal(steps[False], whole)
    forward_error = (whole - wide).abs().max()
    assert 0 < (steps[True] - wide).abs().max() <= 2 * forward_error
