"""A soft-capped model's attention holds (T, T) scores in every layer (SDPA has no cap step):
the fit checks count them, and the count is what a forward really holds at its peak."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from attnlab import GPT, GPTConfig
from attnlab.generate import generation_memory
from attnlab.model.memory import capped_scores, trace_use


class _PeakBytes(TorchDispatchMode):
    """The most bytes of tensor storage alive at once among those the ops under it made:
    each op's outputs are counted until the last tensor on their storage is freed."""

    def __init__(self) -> None:
        super().__init__()
        self.holders: dict[int, int] = {}  # storage address -> tensors alive on it
        self.sizes: dict[int, int] = {}  # storage address -> its bytes
        self.live = self.peak = 0

    def _drop(self, address: int) -> None:
        self.holders[address] -= 1
        if not self.holders[address]:
            del self.holders[address]
            self.live -= self.sizes.pop(address)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.numel():
                address = t.untyped_storage().data_ptr()
                if address not in self.holders:
                    self.holders[address] = 0
                    self.sizes[address] = t.untyped_storage().nbytes()
                    self.live += self.sizes[address]
                self.holders[address] += 1
                weakref.finalize(t, self._drop, address)
        self.peak = max(self.peak, self.live)
        return out


def _peak(model: GPT, ids: torch.Tensor) -> int:
    with torch.no_grad(), _PeakBytes() as peak:
        model(ids)
    return peak.peak


def _config(cap: float | None) -> GPTConfig:
    return GPTConfig(vocab_size=64, block_size=512, n_layer=2, n_head=8, n_embd=64,
                     attn_logit_softcapping=cap)


def test_a_capped_forwards_peak_is_its_counted_scores() -> None:
    """The capped forward's peak above the uncapped one's is what capped_scores counts,
    within 10% (it rounds the bool mask up to the model's dtype, and the uncapped peak
    is elsewhere, at the MLP or logits); 0 for the uncapped."""
    torch.manual_seed(0)
    T = 512
    ids = torch.randint(0, 64, (1, T))
    capped, plain = GPT(_config(50.0)).eval(), GPT(_config(None)).eval()
    plain.load_state_dict(capped.state_dict())
    extra = _peak(capped, ids) - _peak(plain, ids)
    counted = 4 * capped_scores(capped.config, T)
    assert 0.9 * counted <= extra <= counted, (extra, counted)
    assert extra > 8 * T * T * 4  # the scores of all eight heads: not a per-head count
    assert capped_scores(plain.config, T) == 0


def test_the_fit_checks_count_a_capped_models_scores() -> None:
    """A trace of a capped model that keeps no (T, T) still holds every head's scores in
    each layer; a generation's prefill holds them over the prompt. Neither is counted for
    an uncapped model, and the generation's other uses are the same with or without."""
    T = 300
    capped, plain = _config(50.0), _config(None)
    names = ["resid_pre", "attn_entropy"]
    assert (trace_use(capped, T, names, layers=1, heads=1).elements
            - trace_use(plain, T, names, layers=1, heads=1).elements
            == capped_scores(capped, T) == 17 * T * T)
    # a trace of one head's weights: its working copies, smaller than the capped path's
    one = trace_use(capped, T, ["attn_weights"], layers=1, heads=1).elements
    assert one == T * T + capped_scores(capped, T)
    with torch.device("meta"):
        models = GPT(capped), GPT(plain)
    uses = [generation_memory(m, 2, 400, prompt=T) for m in models]
    assert [u.what for u in uses[0]][:-1] == [u.what for u in uses[1]]
    assert uses[0][-1].elements == capped_scores(capped, T, batch=2)
    assert "300-token prefill" in uses[0][-1].what and "--batch_size" in uses[0][-1].fix
