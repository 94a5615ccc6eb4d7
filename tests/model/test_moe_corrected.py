"""ERNIE 4.5's routing in model/moe.py and its GPTConfig fields: router_scoring=
"softmax_corrected" (softmax probabilities of float32 logits, picked with a correction bias,
weighed without it), router_norm_min (the renormalising sum's floor) and mixture_layers (the
blocks that hold the mixture), each against a token-at-a-time reference, with what they
cannot combine with refused by name. The cache, trace, decode and padding properties draw
them from `helpers.modern_switches`."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.model.moe import MoE, idle_parameters
from attnlab.model.names import absent_names


def _config(**overrides: Any) -> GPTConfig:
    return GPTConfig.from_name("llama-tiny", **{"n_experts": 6, "experts_per_token": 2,
                                                **overrides})


def _reference(moe: MoE, x: torch.Tensor, norm_min: float) -> torch.Tensor:
    """x (N, C) one token at a time: the top k of p + bias, weighed by p / max(sum, floor)."""
    bias = moe.router.e_score_correction_bias  # (E,)
    rows = []
    for token in x:
        probs = torch.nn.functional.linear(token, moe.router.weight).softmax(-1)  # (E,)
        chosen = (probs + bias).topk(moe.top_k).indices  # (k,)
        top = probs[chosen] / probs[chosen].sum().clamp(min=norm_min)  # (k,)
        rows.append(sum(w * moe.experts[int(e)](token[None, None])[0, 0]
                        for w, e in zip(top, chosen, strict=True)))
    return torch.stack(rows)  # (N, C)


@pytest.mark.parametrize("norm_min", [0.0, 0.7])
@torch.no_grad()
def test_a_corrected_softmax_picks_with_the_bias_and_weighs_without_it(norm_min: float) -> None:
    torch.manual_seed(0)
    model = GPT(_config(router_scoring="softmax_corrected", router_norm_min=norm_min)).eval()
    moe = model.blocks[0].mlp
    assert isinstance(moe, MoE)
    moe.router.weight.mul_(40)  # peaked probabilities, whose picks' sums spread out
    moe.router.e_score_correction_bias.copy_(torch.tensor([0.3, -0.2, 0.0, 0.1, -0.4, 0.25]))
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1))
    expected = _reference(moe, x.view(14, 32), norm_min).view(2, 7, 32)
    torch.testing.assert_close(moe(x), expected, atol=1e-6, rtol=0)
    weights = moe.weights(x)  # (2, 7, E)
    probs = moe.router(x).softmax(-1)  # (2, 7, E)
    picked = (weights != 0).float()  # (2, 7, E)
    assert not torch.equal(picked, torch.zeros_like(probs).scatter_(
        -1, probs.topk(2, -1).indices, 1.0))  # the bias moved some token's picks
    total = (probs * picked).sum(-1)  # (2, 7)
    if norm_min:
        assert (total < norm_min).any() and (total > norm_min).any()
    torch.testing.assert_close(weights.sum(-1), total / total.clamp(min=norm_min))


@torch.no_grad()
def test_the_floor_clamps_a_plain_softmax_routers_sum_too() -> None:
    """Mixtral's router with router_norm_min: the top 2 of 6 renormalised by their sum, that
    sum no less than the floor."""
    torch.manual_seed(0)
    model = GPT(_config(router_norm_min=0.8)).eval()
    moe = model.blocks[0].mlp
    moe.router.weight.mul_(40)  # peaked probabilities, whose top two's sums spread out
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(2))
    top = moe.router(x).softmax(-1).topk(2, -1).values.sum(-1)  # (3, 5)
    assert (top < 0.8).any() and (top > 0.8).any()
    torch.testing.assert_close(moe.weights(x).sum(-1), top / top.clamp(min=0.8))


def test_mixture_layers_name_the_mixtures_and_the_rest_are_dense() -> None:
    config = _config(n_layer=4, mixture_layers=[1, 3], dense_d_ff=40)
    model = GPT(config)
    kinds = [type(block.mlp).__name__ for block in model.blocks]
    assert kinds == ["MLP", "MoE", "MLP", "MoE"]
    assert model.blocks[0].mlp.fc.out_features == 40  # type: ignore[union-attr]
    assert [config.has_mixture(i) for i in range(4)] == [False, True, False, True]
    per_expert = 3 * 32 * config.ff_size  # SwiGLU: gate, up, down
    assert idle_parameters(config) == 2 * (6 - 2) * per_expert
    assert "mlp_pre" not in absent_names(config)  # the dense layers compute it
    assert "mlp_pre" in absent_names(_config(n_layer=4))
    # one spelling of the layers for `computed`: the first two dense, either way said
    assert _config(n_layer=4, mixture_layers=[2, 3]).computed() == _config(
        n_layer=4, dense_layers=2).computed()


@pytest.mark.parametrize("overrides,message", [
    (dict(router_scoring="softmax_biased"),
     r"router_scoring='softmax_biased' must be one of \['softmax', 'sigmoid', "
     r"'softmax_corrected', 'softmax_float32', 'sigmoid_input'\]"),
    (dict(router_scoring="softmax_corrected", router_bias=True),
     r"router_scoring='softmax_corrected' is .* set router_bias=False"),
    (dict(router_norm_min=-1e-3), r"router_norm_min=-0.001 must be a finite number >= 0"),
    (dict(router_norm_min=float("nan")), r"router_norm_min=nan must be a finite number"),
    (dict(router_norm_min=0.5, router_scoring="sigmoid"),
     r"router_norm_min=0.5 floors .* it needs router_scoring 'softmax' or "),
    (dict(router_norm_min=0.5, experts_normalized=False),
     r"router_norm_min=0.5 .* experts_normalized=True"),
    (dict(mixture_layers=[1, 1]), r"mixture_layers=\[1, 1\] names .* increasing list"),
    (dict(mixture_layers=[2, 1]), r"mixture_layers=\[2, 1\]"),
    (dict(mixture_layers=[]), r"mixture_layers=\[\] names .* non-empty"),
    (dict(mixture_layers=[4]), r"mixture_layers=\[4\] .* within 0..3"),
    (dict(mixture_layers=[1, 3], dense_layers=1), r"mixture_layers=\[1, 3\] .* dense_layers=0"),
    (dict(mixture_layers=[1], n_experts=None), r"mixture_layers=\[1\] .* beside n_experts"),
])
def test_what_the_new_fields_cannot_say_is_refused_by_name(overrides: dict[str, Any],
                                                          message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _config(n_layer=4, **overrides)


def test_the_balance_loss_keeps_the_unbiased_picks_as_transformers_does() -> None:
    """ERNIE 4.5's auxiliary loss is Mixtral's on the router's logits: its picks the top k
    of the probabilities, not those the correction bias made."""
    torch.manual_seed(0)
    model = GPT(_config(router_scoring="softmax_corrected", router_aux_loss_coef=0.01))
    moe = model.blocks[0].mlp
    assert isinstance(moe, MoE)
    with torch.no_grad():
        moe.router.e_score_correction_bias.copy_(torch.tensor([5.0, 5.0, 0, 0, 0, 0]))
    x = torch.randn(1, 6, 32)
    moe.weights(x)
    assert moe.routing is not None
    probs, chosen = moe.routing  # (N, E), (N, k)
    torch.testing.assert_close(probs, moe.router(x)[0].float().softmax(-1))
    assert torch.equal(chosen, probs.topk(2, -1).indices)
    assert not torch.equal(chosen.sort(-1).values, torch.tensor([[0, 1]] * 6))
