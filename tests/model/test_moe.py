"""model/moe.py: a sparse mixture of experts in place of the MLP. Each token's output is the
weighted sum of its top-k experts' outputs (against a token-at-a-time reference), the
weights are the router's softmax (renormalised or not), a trace reads and an edit replaces
them, it trains, and what cannot run it (a compiled decode step) says so. The cache, trace,
decode and padding properties draw it from `helpers.modern_switches`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import GPT, GPTConfig, Trace
from attnlab.generate import generate
from attnlab.interp.edits import zero_experts
from attnlab.model.moe import MoE, balance_loss


def _model(**overrides: object) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig.from_name("llama-tiny", n_experts=4, **overrides)
    return GPT(config).eval()


def _reference(moe: MoE, x: torch.Tensor, normalized: bool) -> torch.Tensor:
    """x (N, C) one token at a time: sum over its top-k experts of p_e * expert_e(x)."""
    rows = []
    for token in x:
        probs = moe.router(token).softmax(-1)  # (E,)
        top, chosen = probs.topk(moe.top_k)
        if normalized:
            top = top / top.sum()
        rows.append(sum(w * moe.experts[int(e)](token[None, None])[0, 0]
                        for w, e in zip(top, chosen, strict=True)))
    return torch.stack(rows)  # (N, C)


@settings(max_examples=10, deadline=None)
@given(k=st.integers(1, 4), normalized=st.booleans(), mlp=st.sampled_from(["swiglu", "gelu"]),
       top_logits=st.booleans(), seed=st.integers(0, 100))
def test_each_token_is_the_weighted_sum_of_its_top_experts(k: int, normalized: bool, mlp: str,
                                                           top_logits: bool, seed: int) -> None:
    """Renormalised or not; a softmax over the top logits alone (GraniteMoE's) is the
    renormalised probabilities, rounded otherwise."""
    model = _model(experts_per_token=k, experts_normalized=normalized, mlp=mlp,
                   experts_from_top_logits=normalized and top_logits)
    moe = model.blocks[0].mlp
    assert isinstance(moe, MoE)
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out = moe(x)  # (2, 5, C)
        expected = _reference(moe, x.view(10, 32), normalized).view(2, 5, 32)
        weights = moe.weights(x)  # (2, 5, E)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    assert ((weights != 0).sum(-1) == k).all()
    if normalized:
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5))
    else:  # the router's own probabilities: all of them when every expert is chosen
        assert (weights.sum(-1) < 1 + 1e-6).all() and (k < 4 or (weights.sum(-1) > 1 - 1e-6)
                                                       .all())


def test_a_trace_reads_the_router_and_an_edit_ablates_an_expert() -> None:
    model = _model(experts_per_token=2)
    ids = torch.randint(0, 65, (1, 12), generator=torch.Generator().manual_seed(1))
    trace = Trace(names=["router_logits", "expert_weights", "mlp_out"]).run(model, ids)
    weights = trace.get("expert_weights", layer=1)  # (1, 12, 4)
    assert trace.get("router_logits", layer=1).shape == (1, 12, 4)
    expert = int(weights[0, -1].argmax())  # the last token's first choice in layer 1
    edited = Trace(names=["mlp_out"])
    with torch.no_grad():
        model(ids, edits=zero_experts(1, expert, positions=[-1]), trace=edited)
    moe = model.blocks[1].mlp
    assert isinstance(moe, MoE)
    dropped = trace.get("mlp_out", 1)[0, -1] - edited.get("mlp_out", 1)[0, -1]  # (C,)
    ln_2 = model.blocks[1].ln_2
    assert ln_2 is not None
    h = Trace(names=["resid_mid"]).run(model, ids).get("resid_mid", 1)[:, -1:]  # (1, 1, C)
    with torch.no_grad():
        expected = moe.experts[expert](ln_2(h))[0, 0] * weights[0, -1, expert]
    torch.testing.assert_close(dropped, expected, atol=1e-6, rtol=0)
    # the other tokens' outputs stay (an expert's product over fewer rows may round apart)
    torch.testing.assert_close(trace.get("mlp_out", 1)[0, :-1], edited.get("mlp_out", 1)[0, :-1],
                               atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match=r"experts \[4\] out of range for layer 0's 4 "
                                         r"experts \(0 to 3\)"):
        model(ids, edits=zero_experts(0, 4))
    with pytest.raises(ValueError, match="its MLP is one dense MLP, not a mixture of experts"):
        GPT(GPTConfig.from_name("llama-tiny"))(ids, edits=zero_experts(0, 1))


def test_the_router_and_every_chosen_expert_learn() -> None:
    model = _model(experts_per_token=1).train()
    ids = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(2))
    trace = Trace(layers=[0], names=["expert_weights"])
    model(ids[:, :-1], targets=ids[:, 1:], trace=trace).loss.backward()
    chosen = set((trace.get("expert_weights", 0) != 0).nonzero()[:, -1].tolist())
    moe = model.blocks[0].mlp
    assert isinstance(moe, MoE)
    assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 0
    for e, expert in enumerate(moe.experts):
        grad = expert.proj.weight.grad
        assert (grad is not None and bool(grad.abs().sum() > 0)) == (e in chosen), e


def test_a_mixture_is_refused_where_it_cannot_run() -> None:
    model = _model()
    ids = torch.randint(0, 65, (1, 4))
    with pytest.raises(ValueError, match=r"a mixture of experts \(n_experts=4\) runs each "
                                         r"expert on the rows its router sends it"):
        generate(model, ids, max_new_tokens=2, compile=True)
    assert generate(model, ids, max_new_tokens=2, temperature=0).shape == (1, 6)
    for bad in ({"n_experts": 0}, {"n_experts": 2, "experts_per_token": 3},
                {"n_experts": 2, "mlp": "none"}):
        with pytest.raises(ValueError, match="1 <= experts_per_token <= n_experts"):
            GPTConfig(**bad)  # type: ignore[arg-type]


def test_the_balance_term_is_k_for_a_uniform_router_and_joins_the_training_loss() -> None:
    """n_experts * sum_e f_e * P_e with every P_e = 1/n_experts is sum_e f_e: the picks per
    token, k, whatever the picks; the loss adds router_aux_loss_coef times it in training."""
    model = _model(experts_per_token=2, router_aux_loss_coef=0.5).train()
    ids = torch.randint(0, 65, (2, 9), generator=torch.Generator().manual_seed(3))
    targets = ids.roll(-1, dims=1)
    with torch.no_grad():
        plain = GPT(GPTConfig.from_name("llama-tiny", n_experts=4)).train()  # no balance term
        for block in model.blocks:
            assert isinstance(block.mlp, MoE)
            block.mlp.router.weight.zero_()  # every expert equally probable
        plain.load_state_dict(model.state_dict())
        ce = plain(ids, targets=targets).loss
        loss = model(ids, targets=targets).loss
    torch.testing.assert_close(loss, ce + 0.5 * 2.0)
    moes = [block.mlp for block in model.blocks]
    with pytest.raises(ValueError, match="a mixture kept no routing"):
        balance_loss(moes, None)  # type: ignore[arg-type]  # used up by the forward
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(ids, targets=targets).loss, plain.eval()(ids, targets=targets)
                           .loss)  # not at evaluation


def test_a_trace_of_the_routing_is_counted_before_a_load() -> None:
    """The fit check counts router_logits and expert_weights as (B, T, n_experts) a layer."""
    from attnlab.model.memory import trace_use

    config = GPTConfig.from_name("llama-tiny", n_experts=4)
    plain = trace_use(config, 8, ["mlp_out"], layers=2, heads=4).elements
    routed = trace_use(config, 8, ["mlp_out", "router_logits", "expert_weights"], layers=2,
                       heads=4).elements
    assert routed - plain == 2 * 2 * 8 * 4  # two names, two layers, 8 tokens x 4 experts


def test_a_shared_expert_adds_its_gated_output_to_every_token() -> None:
    """Qwen2-MoE's: every token's output is its routed experts' plus sigmoid(gate x) times
    the shared expert's, in training too (where it learns)."""
    model = _model(experts_per_token=2, shared_expert_size=24)
    moe = model.blocks[0].mlp
    assert isinstance(moe, MoE) and moe.shared is not None and moe.shared_gate is not None
    assert moe.shared.fc.out_features == 24
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        routed = _reference(moe, x.view(10, 32), normalized=True)  # (10, C)
        shared = torch.sigmoid(moe.shared_gate(x.view(10, 32))) * moe.shared(x).view(10, 32)
        torch.testing.assert_close(moe(x).view(10, 32), routed + shared, atol=1e-6, rtol=0)
    model.train()
    ids = torch.randint(0, 65, (2, 9), generator=torch.Generator().manual_seed(5))
    model(ids, targets=ids.roll(-1, dims=1)).loss.backward()
    assert moe.shared_gate.weight.grad is not None and moe.shared.proj.weight.grad is not None


def test_a_recorded_training_step_refuses_a_mixture(tmp_path: Path) -> None:
    """--cuda_graph records one fixed step; a mixture's shapes change every step, so training
    refuses the pair by name, before any device check. (The CLI leaves the GPU recipe's
    cuda_graph off for a mixture: not run here, there is no GPU.)"""
    from attnlab.train.config import TrainConfig
    from attnlab.train.data import load_dataset
    from attnlab.train.loop import train

    dataset = load_dataset("copy")
    config = GPTConfig.from_name("llama-tiny", n_experts=4, vocab_size=dataset.tokenizer.vocab_size)
    with pytest.raises(ValueError, match="cuda_graph records one fixed training step, and a "
                                         "mixture of experts runs each expert"):
        train(config, TrainConfig(cuda_graph=True, max_iters=1), dataset, tmp_path / "run")
