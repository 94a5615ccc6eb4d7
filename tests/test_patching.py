"""patching.py: full patches restore the clean run (1), no patch changes nothing (0), and a
hand-built two-layer model whose one head carries the answer puts the whole effect there."""

from __future__ import annotations

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.intervene import Edits, patch
from attnlab.patching import activation_patching, logit_diff_metric, patch_effect
from helpers import one_head_model


def _nano() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("nano", init_std=0.2)).eval()


def test_patching_everything_gives_one_and_nothing_gives_zero() -> None:
    model = _nano()
    gen = torch.Generator().manual_seed(0)
    clean, corrupt = torch.randint(0, 65, (2, 3, 7), generator=gen)
    metric = logit_diff_metric(answer=torch.tensor([1, 2, 3]), wrong=4)
    for layer in range(model.config.n_layer):
        def every_position(t, layer=layer):  # type: ignore[no-untyped-def]
            return Edits([patch(t, "resid_pre", layer)])

        assert patch_effect(model, clean, corrupt, metric, every_position) == 1.0
    assert patch_effect(model, clean, corrupt, metric, lambda t: Edits()) == 0.0
    result = activation_patching(model, clean, corrupt, metric)
    assert result.heads.shape == (2, 2) and result.resid.shape == (2, 7)
    # the last position's own input reaches the last logits directly
    assert result.resid[0, -1] != 0 and result.clean != result.corrupted


def test_one_answer_carrying_head_gets_the_whole_effect() -> None:
    model = one_head_model()
    clean, corrupt = torch.tensor([[1, 0, 0, 3]]), torch.tensor([[2, 0, 0, 3]])
    result = activation_patching(model, clean, corrupt, logit_diff_metric(1, 2))
    # the last query spreads 1/4 over 4 keys: clean logit diff 1/4, corrupted -1/4
    assert result.clean == pytest.approx(0.25) and result.corrupted == pytest.approx(-0.25)
    assert torch.equal(result.heads, torch.tensor([[0.0, 0.0], [1.0, 0.0]]))
    # only position 0 differs; layer 0 writes nothing, so both layers' inputs carry it there
    assert torch.equal(result.resid, torch.tensor([[1.0, 0, 0, 0], [1.0, 0, 0, 0]]))
    assert result.to_dict()["heads"] == [[0.0, 0.0], [1.0, 0.0]]


def test_clear_errors() -> None:
    model = one_head_model()
    metric = logit_diff_metric(1, 2)
    with pytest.raises(ValueError, match="same shape"):
        activation_patching(model, torch.tensor([[1, 0]]), torch.tensor([[2, 0, 0]]), metric)
    with pytest.raises(ValueError, match="score the same"):
        activation_patching(model, torch.tensor([[0, 3]]), torch.tensor([[0, 3]]), metric)
    with pytest.raises(ValueError, match="metric position 2 is out of range for 2 tokens"):
        activation_patching(model, torch.tensor([[1, 0]]), torch.tensor([[2, 0]]),
                            logit_diff_metric(1, 2, position=2))  # an IndexError before


def test_a_metric_that_reads_a_pad_is_refused_and_left_padding_works() -> None:
    """Right padding (many Hugging Face tokenizers' default) puts pads in the last column,
    where the default metric reads: an error naming the rows, never a number about a pad."""
    model = _nano()
    clean = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    corrupt = torch.tensor([[1, 7, 3, 4], [5, 8, 0, 0]])
    right = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    metric = logit_diff_metric(answer=1, wrong=2)
    with pytest.raises(ValueError, match=r"padded position .* rows \[1\]\); pad on the left"):
        activation_patching(model, clean, corrupt, metric, attention_mask=right)
    with pytest.raises(ValueError, match="padded position"):
        patch_effect(model, clean, corrupt, metric, lambda t: Edits(), attention_mask=right)
    left = right.flip(-1)
    effect = patch_effect(model, clean.flip(-1), corrupt.flip(-1), metric,
                          lambda t: Edits([patch(t, "resid_pre", 0)]), attention_mask=left)
    assert effect == pytest.approx(1.0)
