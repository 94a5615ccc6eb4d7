"""`GPTConfig.scores_in_float32` (`attend`'s `wide`): in float16, q . k products past float16's
largest value (65,504: GPT-Neo's scores are not scaled down) stay finite on the explicit and
traced paths, as in transformers' GPT-J and GPT-Neo, where without it they overflow."""

from __future__ import annotations

import pytest
import torch

from attnlab.model.attention import attend
from attnlab.model.masks import build_mask
from attnlab.model.trace import Trace
from helpers import left_padded


def _big(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (1, 2, 6, 16) in float16 whose scores reach ~2e5 (k near q)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, 6, 16, generator=g) * 120
    k = q + torch.randn(1, 2, 6, 16, generator=g) * 30
    return q.half(), k.half(), torch.randn(1, 2, 6, 16, generator=g).half()


@pytest.mark.parametrize("traced", [False, True])
def test_float32_scores_hold_what_float16_overflows(traced: bool) -> None:
    q, k, v = _big(0)
    assert (q.float() @ k.float().transpose(-2, -1)).abs().max() > 65504  # past float16
    mask = build_mask(6, 6, None)
    reference = attend(q.float(), k.float(), v.float(), mask, scale=1.0, fused=False)

    def run(wide: bool) -> torch.Tensor:
        trace = Trace(names=["attn_weights"]) if traced else None
        seam = None if trace is None else trace.layer(0)
        return attend(q, k, v, mask, scale=1.0, fused=False, trace=seam, wide=wide)

    out = run(True)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), reference, atol=2e-3, rtol=2e-3)
    assert not torch.isfinite(run(False)).all()  # float16 scores: inf, then NaN


def test_a_float32_scores_model_keeps_float16_logits_finite() -> None:
    """A GPT-Neo-shaped model (unscaled scores) cast to float16 with large q and k weights:
    its explicit forward and a trace of its weights stay finite with the switch, not without."""
    from attnlab import GPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=65, block_size=16, n_layer=1, n_head=2, n_embd=32,
                       attn_scale=1.0, qkv_bias=False, scores_in_float32=True)
    model = GPT(config).eval()
    with torch.no_grad():  # k = q: a token's own score is |q|^2, ~16 x 200^2
        attn = model.blocks[0].attn
        attn.query.weight.normal_(0.0, 35.0)
        attn.key.weight.copy_(attn.query.weight)
    half = model.half()
    ids, mask = left_padded([9, 5], seed=2)
    with torch.no_grad():
        logits = half(ids, attention_mask=mask, fused=False).logits
        trace = Trace(names=["attn_weights"]).run(half, ids, mask)
        assert torch.isfinite(logits[mask.bool()]).all()
        assert torch.isfinite(trace.get("attn_weights", 0)).all()
        half.blocks[0].attn.scores_in_float32 = False
        plain = half(ids, attention_mask=mask, fused=False).logits
    assert not torch.isfinite(plain[mask.bool()]).all()
