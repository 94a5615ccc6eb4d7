"""Every analysis refuses a model in training mode with dropout, as generation does: its
results would change from call to call (nn.Module starts in training mode)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from attnlab import GPT, GPTConfig, show
from attnlab.interp.edits import head_means
from attnlab.interp.heads import detect_heads
from attnlab.interp.lens import logit_attribution, logit_lens
from attnlab.interp.patching import activation_patching, logit_diff_metric

IDS = torch.randint(0, 65, (1, 10), generator=torch.Generator().manual_seed(0))
OTHER = torch.randint(0, 65, (1, 10), generator=torch.Generator().manual_seed(1))
ANALYSES: dict[str, tuple[str, Callable[[Any], object]]] = {
    "lens": ("the logit lens", lambda m: logit_lens(m, IDS)),
    "attribution": ("the attribution", lambda m: logit_attribution(m, IDS, 3)),
    "heads": ("the head scores", lambda m: detect_heads(m)),
    "head_means": ("the head means", lambda m: head_means(m, IDS)),
    "patching": ("every patching effect",
                 lambda m: activation_patching(m, IDS, OTHER, logit_diff_metric(3, 4))),
    "show": ("the view", lambda m: show(m, ids=IDS[0].tolist())),
}


@pytest.mark.parametrize("name", ANALYSES)
def test_a_training_mode_model_with_dropout_is_refused(name: str) -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", dropout=0.3))
    assert model.training
    what, run = ANALYSES[name]
    with pytest.raises(ValueError, match=f"training mode with dropout, so {what} would be "
                                         "random; call model.eval"):
        run(model)
    run(model.eval())  # the same call in eval mode runs
    run(GPT(GPTConfig.from_name("nano")).train())  # no dropout: deterministic, allowed
