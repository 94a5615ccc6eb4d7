"""Multi-head latent attention (`model/latent.py`, DeepSeek-V2 / V3's) against its definition
written out here in float64, and every path through it (fused, explicit, traced, a KV cache
token by token, left padding, edits, training, checkpoints, generation) giving one model.
transformers' DeepseekV2 / V3 are compared in tests/hf (test_hf_families.py's "deepseek_*")."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import GPT, GPTConfig, Trace
from attnlab.generate import generate
from attnlab.interp.edits import Edit
from attnlab.model.latent import LatentAttention
from attnlab.model.names import absent_names
from attnlab.model.rope import Rotary
from helpers import latent_config


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _by_definition(attn: LatentAttention, x: torch.Tensor, positions: torch.Tensor,
                   rotary: Rotary, keep: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V2's equations in float64: c_kv = norm(W_dkv x); k_i = [W_uk c_kv, rot(W_kr x)];
    v_i = W_uv c_kv; q_i = [q_nope, rot(q_rope)] from norm(W_dq x) (or x); causal softmax over
    the real keys (`keep` (B, T)), scaled by 1/sqrt(hs); out = W_o [heads' contexts]."""
    B, T, _ = x.shape
    nh, hs, rd, vs = attn.n_head, attn.head_size, attn.rope_dims, attn.v_size
    W = {name: p.detach().double() for name, p in attn.named_parameters()}
    x = x.double()
    q_in = x if attn.query is not None else _rms(x @ W["q_down.weight"].T,
                                                 W["q_latent_norm.weight"])
    q = (q_in @ W["query.weight" if attn.query is not None else "q_up.weight"].T).view(
        B, T, nh, hs)
    latent, k_rot = (x @ W["kv_down.weight"].T).split([attn.kv_latent, rd], dim=-1)
    kv = (_rms(latent, W["kv_latent_norm.weight"]) @ W["kv_up.weight"].T).view(B, T, nh, -1)
    k_nope, v = kv.split([hs - rd, vs], dim=-1)
    inv = rotary.inv_freq.double()  # (rd / 2,)
    angles = positions.double()[..., None] * inv  # (B, T, rd / 2)
    cos, sin = angles.cos()[:, :, None], angles.sin()[:, :, None]  # (B, T, 1, rd / 2)

    def turned(z: torch.Tensor) -> torch.Tensor:  # pairs (z0, z1), (z2, z3), ... by angle
        a, b = (z[..., 0::2], z[..., 1::2]) if attn.rope_how[1] else z.chunk(2, dim=-1)
        out = (a * cos - b * sin, b * cos + a * sin)
        return torch.stack(out, -1).flatten(-2) if attn.rope_how[1] else torch.cat(out, -1)

    q = torch.cat((q[..., :hs - rd], turned(q[..., hs - rd:])), -1)  # (B, T, nh, hs)
    k = torch.cat((k_nope, turned(k_rot[:, :, None]).expand(-1, -1, nh, -1)), -1)
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(hs)  # (B, nh, T, T)
    allowed = torch.ones(T, T, dtype=torch.bool).tril() & keep[:, None, None, :].bool()
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    context = torch.einsum("bhij,bjhd->bihd", weights, v).reshape(B, T, nh * vs)
    return context @ W["out_proj.weight"].T  # (B, T, C)


@settings(max_examples=25, deadline=None)
@given(q_latent=st.sampled_from([None, 6]), v_head_dim=st.sampled_from([None, 5]),
       pairs=st.booleans(), B=st.integers(1, 3), T=st.integers(1, 12), data=st.data(),
       seed=st.integers(0, 99))
def test_every_path_is_the_definition_through_left_padding_and_a_cache(
        q_latent: int | None, v_head_dim: int | None, pairs: bool, B: int, T: int,
        data: st.DataObject, seed: int) -> None:
    """The first block's attention by the equations, for each row at its real positions; the
    fused, explicit and traced paths and a cache filled token by token give the model's
    logits."""
    torch.manual_seed(seed)
    model = GPT(latent_config(q_latent, v_head_dim, pairs)).eval()
    lengths = data.draw(st.lists(st.integers(1, T), min_size=B, max_size=B))
    keep = torch.zeros(B, T, dtype=torch.long)  # (B, T) left padding
    for b, n in enumerate(lengths):
        keep[b, T - n:] = 1
    ids = torch.randint(0, 41, (B, T), generator=torch.Generator().manual_seed(seed))
    trace = Trace(names=["attn_out", "attn_weights"])
    with torch.no_grad():
        fused = model(ids, attention_mask=keep).logits  # (B, T, V)
        explicit = model(ids, attention_mask=keep, fused=False).logits
        traced = model(ids, attention_mask=keep, trace=trace).logits
        x = model.blocks[0].ln_1(model.wte(ids))  # (B, T, C)
        positions = (keep.cumsum(-1) - 1).clamp(min=0)  # (B, T)
        assert model.rotary is not None
        expected = _by_definition(model.blocks[0].attn, x, positions, model.rotary, keep)
        cache = model.new_cache(B, T)
        steps = [model(ids[:, :t + 1][:, -1:], attention_mask=keep[:, :t + 1],
                       kv_cache=cache).logits[:, 0] for t in range(T)]  # (B, V) each
    real = keep.bool()
    torch.testing.assert_close(trace.get("attn_out", 0)[real].double(), expected[real],
                               atol=1e-5, rtol=1e-5)
    for other in (explicit, traced, torch.stack(steps, 1)):
        torch.testing.assert_close(other[real], fused[real], atol=2e-5, rtol=1e-5)
    weights = trace.get("attn_weights", 1)  # (B, nh, T, T)
    torch.testing.assert_close(weights.sum(-1)[real[:, None].expand(-1, 3, -1)],
                               torch.ones(B, 3, T)[real[:, None].expand(-1, 3, -1)])


def test_the_trace_names_hold_transformers_shapes_and_edits_of_v_and_the_latent_apply() -> None:
    """The latent (B, T, kv_latent); q and k (B, nh, S, hs) as transformers' query_states and
    key_states, v (B, nh, S, vs) without the cache's padding, the context (B, nh, T, vs); zero
    values, or a zero latent, leave the output projection nothing to add."""
    torch.manual_seed(0)
    model = GPT(latent_config()).eval()
    ids = torch.arange(9)[None]
    trace = Trace(names=["kv_latent", "q_pre_rope", "k_pre_rope", "q", "k", "v", "context"]
                  ).run(model, ids)
    shapes = {name: tuple(trace.get(name, 0).shape) for name in trace.names}
    assert shapes == {"kv_latent": (1, 9, 7), "q_pre_rope": (1, 3, 9, 10),
                      "k_pre_rope": (1, 3, 9, 10),
                      "q": (1, 3, 9, 10), "k": (1, 3, 9, 10), "v": (1, 3, 9, 5),
                      "context": (1, 3, 9, 5)}
    k_pre, k = trace.get("k_pre_rope", 0), trace.get("k", 0)
    assert torch.equal(k_pre[..., :6], k[..., :6])  # the dims without RoPE pass unturned
    assert torch.equal(k[:, 0, :, 6:], k[:, 2, :, 6:])  # one RoPE part for every head
    zeroed = Trace(names=["attn_out"])
    with torch.no_grad():
        model(ids, trace=zeroed, edits=Edit("v", 0, lambda v, first: torch.zeros_like(v)))
    assert torch.equal(zeroed.get("attn_out", 0), torch.zeros(1, 9, 24))
    # a zero latent leaves each head's k its RoPE part alone and its v zero
    blank = Trace(names=["k", "attn_out"])
    with torch.no_grad():
        model(ids, trace=blank, edits=Edit("kv_latent", 0, lambda z, first: torch.zeros_like(z)))
    assert torch.equal(blank.get("k", 0)[..., :6], torch.zeros(1, 3, 9, 6))
    assert torch.equal(blank.get("attn_out", 0), torch.zeros(1, 9, 24))
    assert "kv_latent" in absent_names(dataclasses.replace(model.config, kv_latent=None))


def test_it_trains_saves_loads_and_generates_through_its_forward(tmp_path: Path) -> None:
    from attnlab.checkpoint import load_attnlab_checkpoint, save_checkpoint
    from attnlab.model.decode import DecodeStep
    from attnlab.tokenizers import CharTokenizer

    torch.manual_seed(0)
    model = GPT(latent_config(dropout=0.1))
    ids = torch.randint(0, 41, (2, 16), generator=torch.Generator().manual_seed(1))
    model(ids[:, :-1], targets=ids[:, 1:]).loss.backward()
    names = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.any()}
    assert {f"blocks.0.attn.{m}.weight" for m in ("q_down", "q_latent_norm", "q_up", "kv_down",
                                                  "kv_latent_norm", "kv_up")} <= names
    model.eval()
    save_checkpoint(tmp_path / "ckpt", model, CharTokenizer([chr(65 + i) for i in range(41)]))
    loaded = load_attnlab_checkpoint(tmp_path / "ckpt").model
    assert loaded.config == model.config
    greedy = generate(loaded, ids[:1, :5], max_new_tokens=8, temperature=0.0)  # (1, 13)
    assert torch.equal(loaded.state_dict()["blocks.1.attn.kv_up.weight"],
                       model.state_dict()["blocks.1.attn.kv_up.weight"])
    with torch.no_grad():
        for t in range(5, 13):  # each id the argmax of the whole sequence's forward
            assert greedy[0, t] == loaded(greedy[:, :t]).logits[0, -1].argmax()
    with pytest.raises(ValueError, match=r"latent attention .* decode it through its forward"):
        DecodeStep(loaded)
    with pytest.raises(ValueError, match=r"latent attention \(kv_latent=7\) or attention "
                                         r"matrices kept FP8 decode through"):
        generate(loaded, ids[:1, :5], max_new_tokens=2, compile=True)


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(rope_head_dim=3), "rope_head_dim=3 must be an even integer >= 2 below head_size 10"),
    (dict(rope_head_dim=10), "rope_head_dim=10 must be an even integer"),
    (dict(v_head_dim=12), "v_head_dim=12 is wider than head_size 10"),
    (dict(n_kv_head=1), "n_kv_head=1 with kv_latent=7: latent attention projects k and v"),
    (dict(qk_norm=True), "kv_latent=7 with qk_norm: latent attention"),
    (dict(kv_latent=0), r"GPTConfig.kv_latent=0 must be a positive integer or None"),
])
def test_what_latent_attention_cannot_be_is_refused_by_name(overrides: dict[str, object],
                                                             message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(latent_config(), **overrides)  # type: ignore[arg-type]


def test_the_fields_are_idle_without_a_latent_and_rotary_pct_idle_with_one() -> None:
    plain = GPTConfig(pos="rope", rope_head_dim=8, v_head_dim=4)
    assert plain.computed() == GPTConfig(pos="rope").computed()
    latent = latent_config()
    assert latent.rotary_dims == 4
    assert dataclasses.replace(latent, rotary_pct=0.5).computed() == latent.computed()
