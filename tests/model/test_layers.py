"""model/layers.py and rope.py: RMSNorm math, MLP forms, RoPE frequencies (linear, llama3, yarn) and
yarn's attention factor, rotate-half."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.model.config import GPTConfig
from attnlab.model.layers import MLP, HeadsLayerNorm, RMSNorm, make_norm
from attnlab.model.rope import Rotary, apply_rotary, real_positions, rope_inv_freq, rotate_half
from helpers import assert_dropped

YARN_SCALING = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def test_rms_norm_is_x_over_root_mean_square_times_weight() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, generator=g)
    norm = RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8, generator=g))
    by_hand = torch.empty_like(x)
    for idx in range(6):
        row = x.view(6, 8)[idx]
        by_hand.view(6, 8)[idx] = row / math.sqrt(float((row ** 2).mean()) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), by_hand)
    # bfloat16: normalised in float32, cast back, then scaled (Llama's order)
    xb = x.bfloat16()
    x32 = xb.float()
    expected = norm.weight.bfloat16() * (
        x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
    normb = RMSNorm(8, 1e-6).bfloat16()
    with torch.no_grad():
        normb.weight.copy_(norm.weight)
    assert torch.equal(normb(xb), expected)
    # float64: normalised in float64, not rounded through float32
    xd, normd = x.double(), RMSNorm(8, 1e-6).double()
    with torch.no_grad():
        normd.weight.copy_(norm.weight)
    exact = xd / (xd ** 2).mean(-1, keepdim=True).add(1e-6).sqrt() * normd.weight  # (2, 3, 8)
    torch.testing.assert_close(normd(xd), exact, rtol=0, atol=1e-12)


def test_make_norm_kinds_and_eps() -> None:
    assert isinstance(make_norm("layernorm", 4, eps=1e-3), torch.nn.LayerNorm)
    assert make_norm("layernorm", 4, eps=1e-3).eps == 1e-3  # type: ignore[union-attr]
    assert make_norm("layernorm", 4, bias=False).bias is None  # type: ignore[union-attr]
    assert isinstance(make_norm("rmsnorm", 4), RMSNorm)
    assert isinstance(make_norm("none", 4), torch.nn.Identity)
    with pytest.raises(ValueError, match=r"norm='batch' must be one of"):
        make_norm("batch", 4)


@pytest.mark.parametrize("steps", ["cohere", "stablelm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_heads_layer_norm_norms_each_head_by_its_own_weight_row(dtype: torch.dtype,
                                                                 steps: str) -> None:
    """Each head's vector centred, over its root-mean-square (eps 1e-5), times that head's
    row of the (n, hs) weight, in float64 here; in bfloat16 rounded once from float32 (both
    ways of rounding: Cohere's and StableLM's)."""
    torch.manual_seed(0)
    norm = HeadsLayerNorm(3, 8, steps=steps)
    with torch.no_grad():
        norm.weight.normal_()
    norm = norm.to(dtype)
    x = torch.randn(2, 3, 5, 8).to(dtype)  # (B, n, T, hs)
    centred = x.double() - x.double().mean(-1, keepdim=True)
    want = centred / (centred.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * (
        norm.weight.double()[:, None])
    got = norm(x)
    assert got.dtype == dtype
    ulp = 2.0 ** -23 if dtype == torch.float32 else 2.0 ** -7  # one rounding at most
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=2 * ulp)
    with pytest.raises(ValueError, match="qk_norm_heads='cohere' says how QK-norm is made"):
        GPTConfig(qk_norm_heads="cohere")
    with pytest.raises(ValueError, match="one of qk_norm_whole and qk_norm_heads"):
        GPTConfig(qk_norm=True, qk_norm_whole=True, qk_norm_heads="stablelm")
    with pytest.raises(ValueError, match="qk_norm_heads='olmo' must be 'cohere', 'stablelm'"):
        GPTConfig(qk_norm=True, qk_norm_heads="olmo")
    saved = {**GPTConfig(qk_norm=True).to_dict(), "qk_norm_head_weights": True}
    del saved["qk_norm_heads"]  # a checkpoint of the commits that spelled it so
    assert GPTConfig.from_dict(saved).qk_norm_heads == "cohere"


def test_stablelms_steps_are_torchs_layer_norm_head_by_head_to_the_bit() -> None:
    """In float16, "stablelm" rounds as StableLM's StableLmLayerNormPerHead (torch's
    LayerNorm on each head) to the bit, which Cohere's float32 steps do not."""
    torch.manual_seed(0)
    x = torch.randn(3, 8, 17, 64).half()  # (B, n, T, hs)
    weight = (1 + 0.1 * torch.randn(8, 64)).half()
    norms = [torch.nn.LayerNorm(64, bias=False).half() for _ in range(8)]
    with torch.no_grad():
        for norm, row in zip(norms, weight, strict=True):
            norm.weight.copy_(row)
        theirs = torch.cat([norm(x[:, h:h + 1]) for h, norm in enumerate(norms)], dim=1)
        ours = {steps: HeadsLayerNorm(8, 64, steps=steps).half() for steps in ("stablelm",
                                                                             "cohere")}
        for norm in ours.values():
            norm.weight.copy_(weight)
        assert torch.equal(ours["stablelm"](x), theirs)
        assert not torch.equal(ours["cohere"](x), theirs)


def test_swiglu_and_gelu_mlps() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6)
    swiglu = MLP(6, 10, gated=True, bias=False)
    assert swiglu.gate is not None
    expected = swiglu.proj(torch.nn.functional.silu(swiglu.gate(x)) * swiglu.fc(x))
    torch.testing.assert_close(swiglu(x), expected)
    gelu = MLP(6, 10, gelu="exact")
    assert gelu.gate is None and gelu.fc.weight.shape == (10, 6)
    torch.testing.assert_close(gelu(x), gelu.proj(torch.nn.functional.gelu(gelu.fc(x))))


def test_the_mlp_drops_its_output_in_training_only() -> None:
    """The MLP's dropout is on its output, the residual branch (GPT-2's resid_pdrop)."""
    torch.manual_seed(0)
    mlp = MLP(16, 32, dropout=0.5)
    x = torch.randn(4, 8, 16)
    whole = mlp.eval()(x)  # (B, T, C)
    torch.manual_seed(1)
    assert_dropped(mlp.train()(x), whole, 0.5)


def test_default_and_linear_inv_freq() -> None:
    inv = rope_inv_freq(8, 500.0)
    torch.testing.assert_close(inv, torch.tensor([500.0 ** (-i / 8) for i in (0, 2, 4, 6)]))
    linear = rope_inv_freq(8, 500.0, {"rope_type": "linear", "factor": 4.0})
    torch.testing.assert_close(linear, inv / 4)


def test_llama3_inv_freq_matches_the_formula_by_hand() -> None:
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    dims, theta = 16, 10000.0
    got = rope_inv_freq(dims, theta, scaling)
    expected = []
    for i in range(0, dims, 2):
        f = 1.0 / theta ** (i / dims)
        wavelen = 2 * math.pi / f
        if wavelen < 64 / 4:  # high frequency: kept
            expected.append(f)
        elif wavelen > 64 / 1:  # low frequency: divided by factor
            expected.append(f / 8)
        else:  # between: blended
            smooth = (64 / wavelen - 1) / (4 - 1)
            expected.append((1 - smooth) * f / 8 + smooth * f)
    torch.testing.assert_close(got, torch.tensor(expected), rtol=1e-6, atol=0)
    # the three bands all occur at these sizes, so the test checks each branch
    plain = rope_inv_freq(dims, theta)
    assert (got == plain).any() and (got == plain / 8).any()
    assert ((got != plain) & (got != plain / 8)).any()


@pytest.mark.parametrize(
    "scaling, message",
    [({"rope_type": "longrope", "factor": 2.0},
      r"rope_scaling of rope_type='longrope' lacks \['short_factor', 'long_factor', "
      r"'original_max_position_embeddings'\]; add them"),
     ({"rope_type": "dynamic", "factor": 2.0},
      r"rope_scaling rope_type='dynamic' is not supported: it rescales RoPE only past "
      r"max_position_embeddings"),
     ({"rope_type": "ntk", "factor": 2.0},
      r"rope_scaling rope_type='ntk' is not supported; supported types"),
     ({"rope_type": "yarn", "factor": 2.0},
      r"rope_scaling of rope_type='yarn' lacks \['original_max_position_embeddings'\]"),
     ({"rope_type": "llama3", "factor": 8.0},
      r"rope_scaling of rope_type='llama3' lacks \['low_freq_factor'"),
     ("linear", r"rope_scaling='linear' must be a dict")],
)
def test_unsupported_rope_scaling_is_refused_by_name(scaling: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rope_inv_freq(8, 10000.0, scaling)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "scaling, message",
    [({"rope_type": "linear", "factor": 0},
      r"^rope_scaling\.factor=0: expected a finite number > 0$"),
     ({"rope_type": "linear", "factor": -2.0}, r"^rope_scaling\.factor=-2\.0: expected"),
     ({"rope_type": "linear", "factor": "2"}, r"^rope_scaling\.factor='2': expected"),
     ({"rope_type": "linear", "factor": math.inf}, r"^rope_scaling\.factor=inf: expected"),
     ({"rope_type": "linear", "factor": True}, r"^rope_scaling\.factor=True: expected"),
     ({**LLAMA3_SCALING, "low_freq_factor": "1"},
      r"^rope_scaling\.low_freq_factor='1': expected a finite number > 0$"),
     ({**LLAMA3_SCALING, "original_max_position_embeddings": 64.5},
      r"^rope_scaling\.original_max_position_embeddings=64\.5: expected a positive integer$"),
     ({**LLAMA3_SCALING, "high_freq_factor": 1.0},
      r"^rope_scaling\.high_freq_factor=1\.0: expected more than low_freq_factor=1\.0"),
     ({**YARN_SCALING, "attention_factor": 0.0},
      r"^rope_scaling\.attention_factor=0\.0: expected a finite number > 0$"),
     ({**YARN_SCALING, "beta_slow": -1},
      r"^rope_scaling\.beta_slow=-1: expected a finite number >= 0 \(0 or null: transformers' "
      r"default\)$"),
     ({**YARN_SCALING, "mscale": True}, r"^rope_scaling\.mscale=True: expected a finite"),
     ({**YARN_SCALING, "truncate": None}, r"^rope_scaling\.truncate=None: expected true or "
                                          r"false$")],
)
def test_rope_scaling_values_the_math_cannot_use_are_refused_by_name(
        scaling: dict[str, object], message: str) -> None:
    """A factor of 0 divided by zero (NaN logits); a string raised a bare TypeError."""
    with pytest.raises(ValueError, match=message):
        rope_inv_freq(8, 10000.0, scaling)
    with pytest.raises(ValueError, match=message):
        GPTConfig(pos="rope", rope_scaling=scaling)


def test_yarn_on_a_base_of_one_is_refused_by_name() -> None:
    """yarn's ramp divides by log(rope_theta): transformers raises ZeroDivisionError."""
    message = (r"^rope_scaling rope_type 'yarn' with rope_theta=1\.0: its frequency ramp "
               r"divides by log\(rope_theta\)")
    with pytest.raises(ValueError, match=message):
        rope_inv_freq(8, 1.0, YARN_SCALING)
    with pytest.raises(ValueError, match=message):
        GPTConfig(pos="rope", rope_theta=1.0, rope_scaling=YARN_SCALING)


def test_yarn_attention_factor_scales_cos_and_sin() -> None:
    """Factor 4 with nothing else given: 0.1 ln 4 + 1 (YaRN's sqrt(1/t)), on cos and sin."""
    rotary = Rotary(8, theta=10000.0, rope_scaling=YARN_SCALING)
    assert rotary.attention_factor == 0.1 * math.log(4.0) + 1.0
    positions = torch.arange(20)[None]  # (1, T)
    freqs = positions[:, None, :, None].float() * rotary.inv_freq  # (1, 1, T, rd/2)
    cos, sin = rotary.cos_sin(positions)
    emb = torch.cat((freqs, freqs), dim=-1)  # (1, 1, T, rd)
    assert torch.equal(cos, emb.cos() * rotary.attention_factor)
    assert torch.equal(sin, emb.sin() * rotary.attention_factor)


def test_rotate_half() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert torch.equal(rotate_half(x), torch.tensor([-3.0, -4.0, 1.0, 2.0]))


def test_partial_rotary_passes_the_other_dims_through_and_keeps_norms() -> None:
    rotary = Rotary(8, rotary_pct=0.5, theta=100.0)
    assert rotary.dims == 4 and rotary.inv_freq.shape == (2,)
    x = torch.randn(2, 3, 5, 8)  # (B, heads, T, hs)
    cos, sin = rotary.cos_sin(torch.arange(5)[None])  # (1, 1, T, 4)
    assert cos.shape == (1, 1, 5, 4) and cos.dtype == torch.float32
    y = apply_rotary(x, cos, sin)
    assert torch.equal(y[..., 4:], x[..., 4:])
    assert torch.equal(y[:, :, 0], x[:, :, 0])  # position 0: no rotation
    # each (i, i + rd/2) pair is rotated: its length is kept
    pairs = lambda t: t[..., :2] ** 2 + t[..., 2:4] ** 2  # noqa: E731
    torch.testing.assert_close(pairs(y), pairs(x))


def test_rotary_scores_depend_only_on_the_distance() -> None:
    rotary = Rotary(8, theta=10000.0)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8, generator=g), torch.randn(1, 1, 1, 8, generator=g)

    def score(i: int, j: int) -> float:
        qi = apply_rotary(q, *rotary.cos_sin(torch.tensor([[i]])))
        kj = apply_rotary(k, *rotary.cos_sin(torch.tensor([[j]])))
        return float((qi * kj).sum())

    assert score(7, 3) == pytest.approx(score(24, 20), abs=1e-5)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-3)


def test_real_positions_of_left_padded_rows() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert real_positions(mask, 2).tolist() == [[1, 2], [3, 4]]
    assert real_positions(mask, 5)[0].tolist() == [0, 0, 0, 1, 2]
