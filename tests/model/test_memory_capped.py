"""A soft-capped model's attention has no SDPA step (SDPA has no cap): taken whole, as on a
GPU, it holds (T, T) scores in every layer, which the fit checks count there, and the count
is what it really holds at its peak; on a CPU a forward without autograd takes it in tiles of
a few MB."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from attnlab import GPT, GPTConfig
from attnlab.generate import generation_memory
from attnlab.model.explicit import _whole
from attnlab.model.masks import build_mask
from attnlab.model.memory import capped_scores, trace_use
from attnlab.model.traced_attention import tiled_attend


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


def _peak(call: Any) -> int:
    with torch.no_grad(), _PeakBytes() as peak:
        call()
    return peak.peak


def _config(cap: float | None) -> GPTConfig:
    return GPTConfig(vocab_size=64, block_size=1024, n_layer=2, n_head=8, n_embd=64,
                     attn_logit_softcapping=cap)


def test_the_whole_capped_path_holds_what_is_counted_and_tiles_hold_little() -> None:
    """The explicit path taken whole (a GPU's, or with autograd) peaks at what
    capped_scores counts on a GPU, within 5% (it counts the mask's bool copy as a float
    one, and the negated mask for the fill not at all); the CPU's tiles, with the same
    output, peak at a few MB whatever the length, which is why capped_scores counts nothing
    there."""
    T, nh = 1024, 8
    q, k, v = (torch.randn(1, nh, T, 8, generator=torch.Generator().manual_seed(i))
               for i in range(3))
    mask = build_mask(T, T)
    args = (q, k, v, mask, mask.may_attend, 0.35)
    counted = 4 * capped_scores(_config(50.0), T, device="cuda")
    assert counted == 4 * (2 * nh + 1) * T * T
    assert 0.95 * counted <= _peak(lambda: _whole(*args, 0.0, 50.0)) <= 1.05 * counted
    assert _peak(lambda: tiled_attend(*args, 50.0)) < 0.25 * counted  # 13 MB of 71
    with torch.no_grad():
        torch.testing.assert_close(tiled_attend(*args, 50.0), _whole(*args, 0.0, 50.0),
                                   atol=1e-6, rtol=0)
    assert capped_scores(_config(50.0), T, device="cpu") == 0
    assert capped_scores(_config(None), T, device="cuda") == 0


def test_a_capped_forward_on_a_cpu_holds_no_t_by_t() -> None:
    """A capped model's forward without autograd takes the tiles on a CPU: its peak is the
    uncapped (SDPA) forward's within a few MB, and its logits are the whole path's."""
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (1, 1024))
    capped, plain = GPT(_config(50.0)).eval(), GPT(_config(None)).eval()
    plain.load_state_dict(capped.state_dict())
    extra = _peak(lambda: capped(ids)) - _peak(lambda: plain(ids))
    assert extra < 0.25 * 4 * capped_scores(capped.config, 1024, device="cuda"), extra
    with torch.no_grad():
        tiled = capped(ids).logits
    whole = capped(ids).logits  # autograd on: the whole path
    torch.testing.assert_close(tiled, whole, atol=1e-5, rtol=0)


def test_the_fit_checks_count_a_capped_models_scores_off_the_cpu() -> None:
    """A trace of a capped model that keeps no (T, T) still holds every head's scores in
    each layer on a GPU; a generation's prefill holds them over the prompt. Neither is
    counted for an uncapped model or on a CPU, and the generation's other uses are the same
    with or without."""
    T = 300
    capped, plain = _config(50.0), _config(None)
    names = ["resid_pre", "attn_entropy"]
    assert (trace_use(capped, T, names, layers=1, heads=1, device="cuda").elements
            - trace_use(plain, T, names, layers=1, heads=1, device="cuda").elements
            == capped_scores(capped, T, device="cuda") == 17 * T * T)
    assert (trace_use(capped, T, names, layers=1, heads=1, device="cpu").elements
            == trace_use(plain, T, names, layers=1, heads=1, device="cpu").elements)
    # a trace of one head's weights: its working copies, smaller than the capped path's
    one = trace_use(capped, T, ["attn_weights"], layers=1, heads=1, device="cuda").elements
    assert one == T * T + capped_scores(capped, T, device="cuda")
    with torch.device("meta"):
        models = GPT(capped), GPT(plain)
    uses = [generation_memory(m, 2, 400, prompt=T, device="cuda") for m in models]
    assert [u.what for u in uses[0]][:-1] == [u.what for u in uses[1]]
    assert uses[0][-1].elements == capped_scores(capped, T, batch=2, device="cuda")
    assert "300-token prefill" in uses[0][-1].what and "--batch_size" in uses[0][-1].fix
    on_cpu = generation_memory(models[0], 2, 400, prompt=T, device="cpu")
    assert [u.what for u in on_cpu] == [u.what for u in uses[1]]
