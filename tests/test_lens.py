"""lens.py: the logit lens ends at the model's logits; direct attributions sum to the logit
and put a hand-built head's contribution where it is."""

from __future__ import annotations

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.lens import logit_attribution, logit_lens, top_tokens
from helpers import left_padded, one_head_model


def _model(**overrides: object) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("nano", init_std=0.2, **overrides)).eval()


def test_logit_lens_reads_each_layer_and_ends_at_the_logits() -> None:
    model = _model()
    idx, mask = left_padded([6, 4], seed=1)
    lens = logit_lens(model, idx, mask)
    assert lens.shape == (3, 2, 6, 65)
    assert torch.equal(lens[-1], model(idx, attention_mask=mask).logits)
    with torch.no_grad():
        emb = model.wte(idx) + model.wpe((mask.cumsum(-1) - 1).clamp(min=0))
        torch.testing.assert_close(lens[0], model.lm_head(model.ln_f(emb)))
    probs, ids = top_tokens(lens, k=3)
    assert probs.shape == ids.shape == (3, 2, 6, 3)
    assert torch.all(probs[..., :-1] >= probs[..., 1:])
    assert torch.equal(ids[-1, :, :, 0], lens[-1].argmax(-1))


@pytest.mark.parametrize("overrides", [{}, {"layer_norm": False}, {"mlp": False},
                                       {"n_head": 4, "n_kv_head": 2}, {"attn_out_proj": False},
                                       {"norm": "rmsnorm", "mlp": "swiglu", "pos": "rope"}])
def test_attributions_sum_to_the_logit(overrides: dict) -> None:
    model = _model(**overrides)
    idx = torch.randint(0, 65, (3, 7), generator=torch.Generator().manual_seed(2))
    for position in (-1, 2):
        parts = logit_attribution(model, idx, torch.tensor([5, 6, 7]), position)
        assert parts.heads.shape == (3, 2, model.config.n_head)
        torch.testing.assert_close(parts.total(), parts.logit, atol=1e-4, rtol=1e-5)
        assert parts.heads.abs().sum() > 0
    if overrides.get("mlp") == "none":
        assert torch.all(parts.mlp == 0)


def test_the_answer_carrying_head_holds_the_whole_logit() -> None:
    model = one_head_model()
    parts = logit_attribution(model, torch.tensor([[1, 0, 0, 3]]), target=1)
    expected = torch.zeros(1, 2, 2)
    expected[0, 1, 0] = 0.25  # uniform over 4 keys, one of which is token 1
    assert torch.equal(parts.heads, expected)
    assert parts.emb.item() == 0 and parts.mlp.abs().sum() == 0
    assert parts.logit.item() == pytest.approx(0.25)


def test_needs_a_residual_stream() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("seed-minimal", vocab_size=17, n_embd=5))
    with pytest.raises(ValueError, match="residual"):
        logit_attribution(model, torch.tensor([[1, 2]]), 3)


def test_a_target_or_position_out_of_range_is_named() -> None:
    model, idx = _model(), torch.tensor([[1, 2, 3]])  # vocabulary of 65
    with pytest.raises(ValueError, match=r"target \[999\]: token ids are 0 to 64"):
        logit_attribution(model, idx, 999)
    with pytest.raises(ValueError, match=r"target \[-2\]"):
        logit_attribution(model, idx, -2)
    with pytest.raises(ValueError, match="position 3 is out of range for 3 tokens"):
        logit_attribution(model, idx, 5, position=3)
    assert logit_attribution(model, idx, 5, position=-3).logit.shape == (1,)


@torch.no_grad()
def test_imported_gpt2(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    from attnlab.hf import load_hf_gpt2

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2,
                                      n_head=4, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path)
    model = load_hf_gpt2(tmp_path).eval()
    idx = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    parts = logit_attribution(model, idx, target=torch.tensor([3, 4]))
    torch.testing.assert_close(parts.total(), parts.logit, atol=1e-4, rtol=1e-5)
    assert torch.equal(logit_lens(model, idx)[-1], model(idx).logits)
