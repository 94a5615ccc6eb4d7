"""interp/patching.py's passes, on left-padded float64 models: patches batched several to a
forward pass, each run restarted at the block it patches (modern blocks too) and a metric of
the last logits unembedding only those give the effects of one whole run per patch, within
1e-12; a pass reads nothing back one value at a time and fits the logit budget; the heads'
by-position and the blocks' grids equal each cell patched alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnlab import GPT, GPTConfig
from attnlab.interp import patching as patching_module
from attnlab.interp import runs as runs_module
from attnlab.interp.edits import Edits, patch
from attnlab.interp.patching import (
    LogitDiff,
    activation_patching,
    attribution_patching,
    logit_diff_metric,
    patch_effect,
)
from attnlab.interp.runs import PatchRuns


def _left_padded_pair(seed: int, row: int, pads: int, n_layer: int = 2
                      ) -> tuple[GPT, torch.Tensor, torch.Tensor, torch.Tensor, LogitDiff]:
    """A float64 nano model (`n_layer` blocks), clean and corrupted (2, 6) ids with `pads`
    left pads in `row`, their attention mask and a logit difference per row."""
    gen = torch.Generator().manual_seed(seed)
    clean, corrupt = torch.randint(0, 65, (2, 2, 6), generator=gen)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[row, :pads] = 0
    metric = LogitDiff(answer=torch.tensor([3, 4]), wrong=5, position=-1)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_layer=n_layer, init_std=0.2)).double().eval()
    return model, clean, corrupt, mask, metric


def test_patches_batched_into_one_pass_equal_one_pass_each() -> None:
    """Several corrupted runs share a forward pass, each on its own copy of the batch: every
    effect equals that patch run alone (`patch_effect`), over groups that mix heads,
    positions and layers, with a left-padded batch of two; progress hears each block of
    each pass."""
    model, clean, corrupt, mask, metric = _left_padded_pair(seed=3, row=1, pads=2)
    heard: list[tuple[int, int]] = []
    one = activation_patching(model, clean, corrupt, metric, attention_mask=mask, batch=1)
    for batch in (None, 5):
        many = activation_patching(model, clean, corrupt, metric, attention_mask=mask,
                                   batch=batch, progress=lambda *n: heard.append(n))
        torch.testing.assert_close(many.heads, one.heads, rtol=0, atol=1e-12)
        torch.testing.assert_close(many.resid, one.resid, rtol=0, atol=1e-12)
    sites = 2 * 2 + 2 * 6
    # heard as each pass goes: after its first block half its runs (a pass from layer 0 runs
    # 2 blocks, one restarting at layer 1 runs 1), all of them once scored. One pass of 16;
    # passes of 5 (layer 0's 8 sites, then layer 1's): 0-4 and 5-9 from layer 0, the rest
    # from layer 1
    assert heard == [(8, sites), (sites, sites),
                     (2, sites), (5, sites), (7, sites), (10, sites), (15, sites), (sites, sites)]

    def alone(name: str, layer: int, **where: list[int]) -> float:
        return patch_effect(model, clean, corrupt, metric, attention_mask=mask,
                            make_edits=lambda t: Edits([patch(t, name, layer, **where)]))

    for layer, head in [(0, 1), (1, 0)]:
        assert alone("context", layer, heads=[head]) == pytest.approx(
            float(one.heads[layer, head]), rel=0, abs=1e-12)
    for layer, pos in [(0, 2), (1, 5)]:
        assert alone("resid_pre", layer, positions=[pos]) == pytest.approx(
            float(one.resid[layer, pos]), rel=0, abs=1e-12)
    assert one.heads.abs().min() > 1e-4 and one.resid[:, 2:5].abs().min() > 1e-4
    with pytest.raises(ValueError, match="batch=0: patches per forward pass"):
        activation_patching(model, clean, corrupt, metric, batch=0)


def test_a_metric_of_the_last_logits_gets_only_those() -> None:
    """logit_diff_metric at the last position says so (`last_logits_only`), and every run,
    clean, corrupted and patched, then unembeds the last position alone: the same effects as
    a metric that is handed every position's logits (a plain function)."""
    model, clean, corrupt, mask, last = _left_padded_pair(seed=4, row=0, pads=3)
    shapes: set[tuple[int, ...]] = set()

    def every(logits: torch.Tensor) -> torch.Tensor:  # no last_logits_only: all positions
        shapes.add(tuple(logits.shape[1:]))
        return last(logits)

    assert last.last_logits_only and not logit_diff_metric(3, 5, position=4).last_logits_only
    for method in (activation_patching, attribution_patching):
        fast, full = (method(model, clean, corrupt, m, attention_mask=mask) for m in (last, every))
        torch.testing.assert_close(fast.heads, full.heads, rtol=0, atol=1e-12)
        torch.testing.assert_close(fast.resid, full.resid, rtol=0, atol=1e-12)
    assert shapes == {(6, 65)}

    class LastOnly:
        last_logits_only = True

        def __call__(self, logits: torch.Tensor) -> torch.Tensor:
            shapes.add(tuple(logits.shape[1:]))
            return last(logits)

    shapes.clear()
    for method in (activation_patching, attribution_patching):
        method(model, clean, corrupt, LastOnly(), attention_mask=mask)
    assert shapes == {(1, 65)}  # the model was asked for the last position alone


def test_each_patched_run_starts_at_the_block_it_patches() -> None:
    """A patch at layer L leaves the blocks before L as the corrupted run computed them, so
    its run restarts at L from that run's residual stream (`start_at`): one pass per patch
    runs block i once for each patch at layer i or below (and once each for the clean and
    corrupted runs), and every effect equals the patch run from the embeddings on."""
    model, clean, corrupt, mask, metric = _left_padded_pair(seed=5, row=0, pads=1, n_layer=4)
    calls = [0] * 4
    hooks = [block.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
             for i, block in enumerate(model.blocks)]
    try:
        result = activation_patching(model, clean, corrupt, metric, attention_mask=mask,
                                     batch=1)
    finally:
        for hook in hooks:
            hook.remove()
    per_layer = 2 + 6  # patches: 2 heads' outputs, 6 positions of the residual stream
    assert calls == [2 + per_layer * (i + 1) for i in range(4)]

    def whole(name: str, layer: int, **where: list[int]) -> float:
        return patch_effect(model, clean, corrupt, metric, attention_mask=mask,
                            make_edits=lambda t: Edits([patch(t, name, layer, **where)]))

    for layer in range(4):
        for head in range(2):
            assert whole("context", layer, heads=[head]) == pytest.approx(
                float(result.heads[layer, head]), rel=0, abs=1e-12)
        for pos in range(6):
            assert whole("resid_pre", layer, positions=[pos]) == pytest.approx(
                float(result.resid[layer, pos]), rel=0, abs=1e-12)


def test_the_logit_difference_scores_stacked_copies_as_separate_calls() -> None:
    """`LogitDiff.per_copy` (activation patching scores each pass's copies with it) gives
    what a call on each copy gives, with one id per row and with (B,) ids, at the last and
    at another position; ids outside the vocabulary are refused in both."""
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(3 * 2, 5, 11, generator=gen, dtype=torch.float64)  # (n B, T, V)
    for metric in (LogitDiff(4, 7, -1), LogitDiff(torch.tensor([1, 9]), 3, position=2)):
        expected = torch.stack([metric(logits[i * 2:(i + 1) * 2]) for i in range(3)])
        torch.testing.assert_close(metric.per_copy(logits, 3), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"answer ids \[11, 11\] outside the model's 11"):
        LogitDiff(11, 3, -1).per_copy(logits, 3)
    with pytest.raises(ValueError, match=r"wrong ids are torch.float32; pass integer token"):
        LogitDiff(1, torch.tensor([1.0, 2.0]), -1).per_copy(logits, 3)


class _Reads(TorchDispatchMode):
    """Counts reads of one tensor element into Python (int(), float(), .item()): each a wait
    for the queued work on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))


def test_patched_passes_read_nothing_back_one_value_at_a_time() -> None:
    """The ids are checked, and the metric's ids read, by the clean and corrupted runs; the
    patched runs add no element reads (each pass's metrics come back in one `tolist`), so
    the count is the same for 16 or 32 patched runs, one pass each or one for all, with or
    without padding."""
    for padded in (False, True):
        counts = set()
        for n_layer in (2, 4):
            model, clean, corrupt, mask, _ = _left_padded_pair(seed=7, row=1, pads=2,
                                                               n_layer=n_layer)
            for batch in (1, 32):
                metric = LogitDiff(answer=torch.tensor([3, 4]), wrong=5, position=-1)
                reads = _Reads()
                with reads:
                    activation_patching(model, clean, corrupt, metric, batch=batch,
                                        attention_mask=mask if padded else None)
                counts.add(reads.count)
        assert len(counts) == 1, (padded, counts)


@pytest.mark.parametrize("switches", [
    {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "n_kv_head": 1, "qk_norm": True,
     "sliding_window": 3, "window_layers": [1, 2]},  # Llama / Qwen2-style, grouped queries
    {"pos": "rope", "rotary_pct": 0.5, "parallel_residual": True},  # GPT-NeoX-style
])
def test_restarted_runs_equal_whole_runs_on_modern_blocks(
    switches: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restarting at the patched layer gives every pass-from-the-embeddings effect (float64,
    left padding) on rotary, windowed, grouped-query and parallel-residual blocks."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", n_layer=3, init_std=0.2, **switches)).double().eval()
    _, clean, corrupt, mask, metric = _left_padded_pair(seed=8, row=0, pads=2)
    restarted = activation_patching(model, clean, corrupt, metric, attention_mask=mask)
    monkeypatch.setattr(patching_module, "RESTARTS", False)
    whole = activation_patching(model, clean, corrupt, metric, attention_mask=mask)
    torch.testing.assert_close(restarted.heads, whole.heads, rtol=0, atol=1e-12)
    torch.testing.assert_close(restarted.resid, whole.resid, rtol=0, atol=1e-12)
    assert whole.heads.abs().max() > 1e-3 and whole.resid.abs().max() > 1e-3


def test_heads_by_position_are_each_heads_output_at_one_position() -> None:
    """by_position=True adds (n_layer, nh, T) effects (TransformerLens's
    get_act_patch_attn_head_out_by_pos): each equals that one cell patched alone, over a
    left-padded batch, batched or one pass each; the other grids are as without it."""
    model, clean, corrupt, mask, metric = _left_padded_pair(seed=5, row=0, pads=2)
    plain = activation_patching(model, clean, corrupt, metric, attention_mask=mask)
    assert plain.heads_by_position is None and "heads_by_position" not in plain.to_dict()
    for batch in (None, 1):
        result = activation_patching(model, clean, corrupt, metric, attention_mask=mask,
                                     batch=batch, by_position=True)
        assert result.heads_by_position is not None
        assert result.heads_by_position.shape == (2, 2, 6)
        torch.testing.assert_close(result.heads, plain.heads, rtol=0, atol=1e-12)
        torch.testing.assert_close(result.resid, plain.resid, rtol=0, atol=1e-12)
    for layer, head, pos in [(0, 0, 5), (0, 1, 3), (1, 1, 5), (1, 0, 0)]:
        alone = patch_effect(model, clean, corrupt, metric, attention_mask=mask,
                             make_edits=lambda t, la=layer, h=head, p=pos: Edits(
                                 [patch(t, "context", la, heads=[h], positions=[p])]))
        assert alone == pytest.approx(float(result.heads_by_position[layer, head, pos]),
                                      rel=0, abs=1e-12)
    assert len(result.to_dict()["heads_by_position"]) == 2


def test_block_outputs_are_each_layers_attention_and_mlp_output_at_one_position() -> None:
    """blocks=True adds (n_layer, T) grids of attn_out and mlp_out (TransformerLens's
    get_act_patch_block_every): each cell equals that output patched alone, batched or one
    pass each, over a left-padded batch; the other grids are as without it. Patching a
    layer's resid_pre, attn_out and mlp_out at the last position together patches the next
    layer's resid_pre there, the residual stream's sum (at an earlier position the patched
    resid_pre would also reach the later positions through its keys and values)."""
    model, clean, corrupt, mask, metric = _left_padded_pair(seed=5, row=0, pads=2)
    plain = activation_patching(model, clean, corrupt, metric, attention_mask=mask)
    assert plain.attn_out is None and plain.mlp_out is None
    assert "attn_out" not in plain.to_dict()
    for batch in (None, 1):
        result = activation_patching(model, clean, corrupt, metric, attention_mask=mask,
                                     batch=batch, blocks=True, by_position=batch == 1)
        assert result.attn_out is not None and result.mlp_out is not None
        assert result.attn_out.shape == result.mlp_out.shape == (2, 6)
        torch.testing.assert_close(result.heads, plain.heads, rtol=0, atol=1e-12)
        torch.testing.assert_close(result.resid, plain.resid, rtol=0, atol=1e-12)
    for name, grid in (("attn_out", result.attn_out), ("mlp_out", result.mlp_out)):
        for layer, pos in [(0, 5), (1, 3), (1, 5), (0, 2)]:
            alone = patch_effect(model, clean, corrupt, metric, attention_mask=mask,
                                 make_edits=lambda t, n=name, la=layer, p=pos: Edits(
                                     [patch(t, n, la, positions=[p])]))
            assert alone == pytest.approx(float(grid[layer, pos]), rel=0, abs=1e-12)
    assert result.mlp_out.abs().max() > 1e-3 and result.attn_out.abs().max() > 1e-3
    together = patch_effect(model, clean, corrupt, metric, attention_mask=mask,
                            make_edits=lambda t: Edits([patch(t, n, 0, positions=[5]) for n in
                                                        ("resid_pre", "attn_out", "mlp_out")]))
    assert together == pytest.approx(float(plain.resid[1, 5]), rel=0, abs=1e-9)
    assert abs(float(plain.resid[1, 5])) > 1e-3
    assert len(result.to_dict()["mlp_out"]) == 2


def test_block_outputs_of_a_model_without_them_are_refused() -> None:
    _, clean, corrupt, mask, metric = _left_padded_pair(seed=5, row=0, pads=2)
    torch.manual_seed(0)
    no_mlp = GPT(GPTConfig.from_name("nano", mlp="none", init_std=0.2)).double().eval()
    with pytest.raises(ValueError, match=r"blocks=True patches mlp_out, and this model never "
                                         r"computes it, as it has no MLP"):
        activation_patching(no_mlp, clean, corrupt, metric, attention_mask=mask, blocks=True)


def test_a_pass_fits_as_many_copies_as_the_logit_budget_allows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`PatchRuns.per_pass(None)`: up to BATCH copies of the batch, as many as fit their
    logits in LOGIT_BYTES, a copy's logits being B rows x (1 column for a metric of the last
    logits alone, else T) x V x the element size; one at least; a batch given is kept.
    activation_patching's passes are that many patches each (progress hears each pass)."""
    model, clean, corrupt, mask, last = _left_padded_pair(seed=3, row=1, pads=2)  # float64

    def every(logits: torch.Tensor) -> torch.Tensor:  # no last_logits_only: (B, T, V)
        return last(logits)

    one_column = PatchRuns(model, clean, corrupt, last, mask)
    all_columns = PatchRuns(model, clean, corrupt, every, mask)
    assert one_column.per_pass(None) == all_columns.per_pass(None) == runs_module.BATCH
    copy = 2 * 6 * 65 * 8  # bytes of one copy's logits: B x T x V x float64
    monkeypatch.setattr(runs_module, "LOGIT_BYTES", 5 * copy + 1)
    assert all_columns.per_pass(None) == 5
    assert one_column.per_pass(None) == 30  # each copy's logits: 1 column of 6
    assert all_columns.per_pass(3) == 3
    heard: list[tuple[int, int]] = []
    activation_patching(model, clean, corrupt, every, attention_mask=mask,
                        progress=lambda *n: heard.append(n))
    sites = 2 * 2 + 2 * 6
    # passes of 5, each heard after its first block too where it runs two (from layer 0)
    assert heard == [(2, sites), (5, sites), (7, sites), (10, sites), (15, sites), (sites, sites)]
    monkeypatch.setattr(runs_module, "LOGIT_BYTES", copy - 1)
    assert all_columns.per_pass(None) == 1  # one copy, even over the budget


def test_a_pass_of_several_patches_starts_at_its_lowest_layer() -> None:
    """Patches go into passes in layer order, so a pass of 5 spans one layer or two and
    restarts at the lower: block i runs in the clean and corrupted runs and once for each
    pass whose first patch is at layer i or below. (In the grids' order, heads then
    positions, a pass would span several layers and restart lower: the same effects, more
    blocks run.)"""
    model, clean, corrupt, mask, metric = _left_padded_pair(seed=5, row=0, pads=1, n_layer=4)
    calls = [0] * 4
    hooks = [block.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
             for i, block in enumerate(model.blocks)]
    try:
        activation_patching(model, clean, corrupt, metric, attention_mask=mask, batch=5)
    finally:
        for hook in hooks:
            hook.remove()
    layers = sorted(layer for layer in range(4) for _ in range(2 + 6))  # each patch's layer
    starts = layers[::5]  # each pass's first patch's layer: [0, 0, 1, 1, 2, 3, 3]
    assert calls == [2 + sum(start <= i for start in starts) for i in range(4)]
