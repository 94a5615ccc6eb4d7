"""decode.half_weights: matrices rounded to float16, streamed as float16 by decode (fbgemm)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnlab.generate as generate_mod
from attnlab import GPT, GPTConfig, half_weights
from attnlab.generate import generate
from attnlab.interp.edits import Edits
from attnlab.model.decode import FLOAT16_MAX, DecodeStep, decode_step
from attnlab.model.decode_parts import Packed16
from helpers import left_padded

pytestmark = pytest.mark.skipif(
    "fbgemm" not in torch.backends.quantized.supported_engines,
    reason="this PyTorch build has no fbgemm (x86 CPUs only)",
)

CONFIGS = {
    "gpt2-style": {},  # tied head, biases, GELU
    "llama-style": {"norm": "rmsnorm", "pos": "rope", "mlp": "swiglu", "bias": False,
                    "tie_weights": False, "n_kv_head": 2},
    "qwen3-neox": {"norm": "rmsnorm", "pos": "rope", "qk_norm": True, "qkv_bias": True,
                   "parallel_residual": True, "tie_weights": False},
    # a mixture of 3 experts, top 2: each expert's matrices packed, the router rounded
    "mixtral-style": {"norm": "rmsnorm", "pos": "rope", "mlp": "swiglu", "bias": False,
                      "tie_weights": False, "n_experts": 3, "experts_per_token": 2},
    # and Qwen2-MoE's shared expert beside them, rounded as every matrix
    "qwen2-moe-style": {"norm": "rmsnorm", "pos": "rope", "mlp": "swiglu", "bias": False,
                        "n_experts": 3, "experts_per_token": 1, "shared_expert_size": 24},
}


def _model(**overrides: object) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("nano", n_head=4, init_std=0.3, **overrides)).eval()


def _representable(t: torch.Tensor) -> bool:
    return torch.equal(t, t.half().float())


@pytest.mark.parametrize("flags", CONFIGS.values(), ids=list(CONFIGS))
def test_decode_streams_what_the_rounded_model_computes(flags: dict[str, object]) -> None:
    """After half_weights every matrix holds float16 values (biases, norms and an untied
    token table keep theirs), and the packed decode step equals GPT.forward of the rounded
    model, padding and cache included, while both moved away from the float32 model."""
    model, original = _model(**flags), _model(**flags)
    assert not all(_representable(m.weight) for m in model.modules() if isinstance(m, nn.Linear))
    half_weights(model)
    for (name, mine), theirs in zip(model.named_parameters(), original.parameters(),
                                    strict=True):
        is_matrix = name.endswith(".weight") and isinstance(
            model.get_submodule(name.removesuffix(".weight")), nn.Linear)
        tied_table = name == "wte.weight" and model.config.tie_weights
        if is_matrix or tied_table:
            assert _representable(mine) and torch.equal(mine, theirs.half().float()), name
        else:
            assert torch.equal(mine, theirs), name
    ids, mask = left_padded([5, 3], seed=1)  # (B, P)
    B, P = ids.shape
    step = decode_step(model)
    assert step.weights == "float16"
    assert all(isinstance(m, Packed16) for layer in step.layers for expert in layer.experts
               for m in expert if m is not None)  # a mixture's experts are packed too
    caches = [model.new_cache(B, P + 3) for _ in range(3)]
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for cache, m in zip(caches, (model, model, original), strict=True):
            m(ids, attention_mask=mask, kv_cache=cache)
        for _ in range(3):
            token = torch.randint(0, 65, (B, 1), generator=gen)  # (B, 1)
            mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype)], dim=1)
            expected = model(token, attention_mask=mask, kv_cache=caches[0]).logits[:, -1]
            float32 = original(token, attention_mask=mask, kv_cache=caches[2]).logits[:, -1]
            got = step(token, mask, caches[1])  # (B, V)
            torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
            assert (got - float32).abs().max() > 1e-4  # the rounding is there to see


def test_generation_runs_the_packed_step_and_agrees_with_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Greedy ids of the packed decode == those of GPT.forward over the cache (the edits
    path), on the rounded model; the step is packed once and kept."""
    model = half_weights(_model(**CONFIGS["llama-style"]))
    ids = torch.randint(0, 65, (2, 6), generator=torch.Generator().manual_seed(3))
    packed = decode_step(model)
    steps: list[DecodeStep] = []
    monkeypatch.setattr(generate_mod, "decode_step", lambda m: steps.append(decode_step(m))
                        or steps[-1])
    fast = generate(model, ids, max_new_tokens=12, temperature=0)
    assert steps == [packed]  # generate ran the kept packed step, no new packing
    slow = generate(model, ids, max_new_tokens=12, temperature=0, edits=Edits())
    assert torch.equal(fast, slow)


def test_a_changed_weight_is_packed_again() -> None:
    model = half_weights(_model())
    packed = decode_step(model)
    with torch.no_grad():
        model.blocks[0].mlp.proj.weight.mul_(2)  # an exact power of two: still float16
    repacked = decode_step(model)
    assert repacked is not packed and decode_step(model) is repacked
    cache = model.new_cache(1, 2)
    token = torch.tensor([[7]])
    with torch.inference_mode():
        expected = model(token, kv_cache=model.new_cache(1, 2)).logits[:, -1]
        torch.testing.assert_close(repacked(token, None, cache), expected, atol=2e-5, rtol=1e-5)


def test_float16_weights_refuse_what_they_cannot_run() -> None:
    with pytest.raises(ValueError, match=r"need a float32 model .* torch\.bfloat16; drop"):
        half_weights(_model().to(torch.bfloat16))
    with pytest.raises(ValueError, match=r"weights='int8': pick 'float32' or 'float16'"):
        DecodeStep(_model(), weights="int8")
    model = _model()
    with torch.no_grad():
        model.blocks[1].attn.value.weight[0, 0] = 1e5
    before = {name: p.clone() for name, p in model.named_parameters()}
    with pytest.raises(ValueError, match=r"blocks\.1\.attn\.value\.weight holds \|w\| = 100000"):
        half_weights(model)
    # refused before rounding anything (block 0's matrices come first)
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert model.decode_weights == "float32"
    with pytest.raises(ValueError, match=r"\|w\| = 100000, beyond float16's largest value"):
        DecodeStep(model, weights="float16")
    # cast after half_weights: generation says how to decode it as it now is
    cast = half_weights(_model()).to(torch.bfloat16)
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"set model\.decode_weights = 'float32'"):
        generate(cast, ids, max_new_tokens=2, temperature=0)
    cast.decode_weights = "float32"
    assert generate(cast, ids, max_new_tokens=2, temperature=0).shape == (1, 5)


def test_half_weights_takes_float16s_largest_value() -> None:
    """65504 is float16's largest finite value, not beyond it: half_weights keeps it."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_head=4)).eval()
    with torch.no_grad():
        model.blocks[0].attn.value.weight[0, 0] = FLOAT16_MAX
    half_weights(model)
    assert model.blocks[0].attn.value.weight[0, 0].item() == FLOAT16_MAX
    assert model.decode_weights == "float16"
