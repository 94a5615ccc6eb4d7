"""interp/paths.py: path patching, checked against activation patching where nothing after a
head can be frozen, and against the two steps written out with the public edits (`patch`,
`Trace`, `patch_effect`) on GPT-2-style and grouped-query models with left padding."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
import torch

from attnlab import GPT, GPTConfig, Trace
from attnlab.interp.edits import Edits, patch
from attnlab.interp.patching import LogitDiff, activation_patching, patch_effect
from attnlab.interp.paths import path_patching

GQA = {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "n_head": 4, "n_kv_head": 2}


def _pair(n_layer: int, switches: dict[str, Any] | None = None, seed: int = 0
          ) -> tuple[GPT, torch.Tensor, torch.Tensor, torch.Tensor, LogitDiff]:
    """A float64 nano model, clean and corrupted (2, 6) ids (row 1 left-padded by 2), their
    mask and a logit difference per row."""
    gen = torch.Generator().manual_seed(seed)
    clean, corrupt = torch.randint(0, 65, (2, 2, 6), generator=gen)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    torch.manual_seed(seed)
    config = GPTConfig.from_name("nano", n_layer=n_layer, init_std=0.3, **(switches or {}))
    model = GPT(config).double().eval()
    return model, clean, corrupt, mask, LogitDiff(torch.tensor([3, 4]), 5, position=-1)


@pytest.mark.parametrize("switches", [{}, GQA])
def test_paths_to_the_logits_of_the_last_layer_are_activation_patching(
        switches: dict[str, Any]) -> None:
    """With no head after a sender, nothing is frozen: its path to the logits is its
    output patched (activation patching's cell), in a one-layer model and in a two-layer
    model's last layer."""
    for n_layer in (1, 2):
        model, clean, corrupt, mask, metric = _pair(n_layer, switches)
        paths = path_patching(model, clean, corrupt, metric, attention_mask=mask)
        heads = activation_patching(model, clean, corrupt, metric, attention_mask=mask).heads
        assert paths.senders.shape == heads.shape
        torch.testing.assert_close(paths.senders[-1], heads[-1], rtol=0, atol=1e-12)
        assert paths.receivers is None and paths.via == ()
        with torch.no_grad():
            clean_metric = float(metric(model(clean, attention_mask=mask).logits))
        assert paths.clean == pytest.approx(clean_metric)


def _by_hand(model: GPT, clean: torch.Tensor, corrupt: torch.Tensor, mask: torch.Tensor,
             metric: LogitDiff, sender: tuple[int, int],
             receivers: list[tuple[int, int]] | None, via: tuple[str, ...]) -> float:
    """The two steps with public edits: the clean and corrupted runs traced, step 1 as the
    corrupted run with the sender's output clean and every later layer's heads frozen at
    their corrupted outputs, step 2 as a patch of the receivers' inputs (or, without
    receivers, step 1's own metric)."""
    L = model.config.n_layer
    runs = {}
    for name, ids in (("clean", clean), ("corrupt", corrupt)):
        runs[name] = Trace(names=["context"])
        model(ids, attention_mask=mask, trace=runs[name])
    layer, head = sender
    step_one = [patch(runs["clean"], "context", layer, heads=[head])]
    step_one += [patch(runs["corrupt"], "context", later) for later in range(layer + 1, L)]
    if receivers is None:
        return patch_effect(model, clean, corrupt, metric, lambda t: Edits(step_one),
                            attention_mask=mask)
    received = Trace(names=list(via))
    model(corrupt, attention_mask=mask, edits=Edits(step_one), trace=received)
    group = model.config.n_head // model.config.n_kv_heads
    step_two = [patch(received, name, la, heads=[h if name == "q" else h // group])
                for name in via for la, h in receivers]
    return patch_effect(model, clean, corrupt, metric, lambda t: Edits(step_two),
                        attention_mask=mask)


@pytest.mark.parametrize(("switches", "receivers", "via"), [
    ({}, None, ()),
    ({}, [(3, 1)], ("q",)),
    ({}, [(1, 0), (3, 1)], ("q", "k", "v")),  # senders in layer 2 reach layer 3's alone
    (GQA, [(3, 3)], ("k", "v")),
    (GQA, [(1, 0), (2, 2)], ("v",)),
    (GQA, [(2, 3)], ("q",)),  # queries are per query head, not per key-value head
])
def test_each_senders_effect_is_the_two_steps_by_hand(
        switches: dict[str, Any], receivers: list[tuple[int, int]] | None,
        via: tuple[str, ...]) -> None:
    """Every sender's cell equals the two steps written out with `patch` and `patch_effect`
    (float64, left padding, 1e-10), batched or one pass per sender; heads at or after the
    last receiver's layer are NaN; progress hears the pass block by block."""
    model, clean, corrupt, mask, metric = _pair(4, switches, seed=1)
    heard: list[tuple[int, int]] = []
    result = path_patching(model, clean, corrupt, metric, receivers, attention_mask=mask,
                           via=via or None, progress=lambda *n: heard.append(n))
    one = path_patching(model, clean, corrupt, metric, receivers, attention_mask=mask,
                        via=via or None, batch=1)
    torch.testing.assert_close(one.senders, result.senders, rtol=0, atol=1e-12, equal_nan=True)
    end = 4 if receivers is None else max(layer for layer, _ in receivers)
    H = model.config.n_head
    # one pass of every sender, heard block by block as it goes, rising to all of them
    total = end * H
    assert heard[-1] == (total, total) and len(heard) > 1
    assert all(t == total for _, t in heard) and all(
        a[0] < b[0] for a, b in itertools.pairwise(heard))
    assert torch.isnan(result.senders[end:]).all() and not torch.isnan(result.senders[:end]).any()
    for layer in range(end):
        for head in range(H):
            expected = _by_hand(model, clean, corrupt, mask, metric, (layer, head), receivers,
                                via)
            assert float(result.senders[layer, head]) == pytest.approx(
                expected, rel=0, abs=1e-10), (layer, head)
    assert result.senders[:end].abs().max() > 1e-3  # the paths carry something
    assert result.via == via
    record = result.to_dict()
    assert record["senders"][-1] == ([None] * H if end < 4 else result.senders[-1].tolist())


def test_a_receivers_queries_see_only_what_reaches_them() -> None:
    """A path to a head's queries leaves its keys and values as corrupted: in a model whose
    layer-1 heads attend uniformly (zero query weights), no sender moves them through their
    queries, while through their values it does."""
    model, clean, corrupt, mask, metric = _pair(2, seed=2)
    with torch.no_grad():
        query = model.blocks[1].attn.query
        query.weight.zero_()
        if query.bias is not None:
            query.bias.zero_()
    by_q = path_patching(model, clean, corrupt, metric, [(1, 0), (1, 1)], attention_mask=mask,
                         via="q")
    by_v = path_patching(model, clean, corrupt, metric, [(1, 0), (1, 1)], attention_mask=mask,
                         via="v")
    assert by_q.senders[0].abs().max() < 1e-12
    assert by_v.senders[0].abs().max() > 1e-3


def test_bad_receivers_and_inputs_are_refused() -> None:
    model, clean, corrupt, _, metric = _pair(2)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"receivers": []}, "receivers=\\[\\] names no head"),
        ({"receivers": [(0, 1)]}, "all in layer 0, which no head comes before"),
        ({"receivers": [(2, 0)]}, "do not exist: the model has layers 0-1 and heads 0-1"),
        ({"receivers": [(1, 0)], "via": "z"}, "via=\\['z'\\]: .* choose from \\['q', 'k', 'v'\\]"),
        ({"receivers": [(1, 0)], "via": []}, "via=\\[\\]"),
        ({"receivers": [(1, 0)], "batch": 0}, "batch=0: patches per forward pass"),
        ({"receivers": [1, 0, 1]}, "receivers=\\[1, 0, 1\\]: give \\(layer, head\\) pairs"),
        ({"via": "q"}, "via='q' names receivers' inputs, and receivers=None asks for the "
                       "paths to the logits"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            path_patching(model, clean, corrupt, metric, **kwargs)
    one = path_patching(model, clean, corrupt, metric, (1, 0))  # one pair alone
    assert one.receivers == [(1, 0)] and one.via == ("q", "k", "v")
    assert math.isnan(one.senders[1, 0])
    listed = path_patching(model, clean, corrupt, metric, [(1, 0)], via=["v", "k", "q"])
    assert listed.via == ("q", "k", "v")
    torch.testing.assert_close(listed.senders, one.senders, rtol=0, atol=0, equal_nan=True)


def test_each_pass_restarts_at_its_first_sender_or_receiver() -> None:
    """Before a pass's first sender every copy is the corrupted run: step 1 restarts there (or
    at an earlier receiver), step 2 at the first receiver, from the corrupted run's residual
    stream. Block i runs in the clean and corrupted runs and in each step that starts at or
    before it; passes of 3 senders give passes of 1's effects, and progress hears each, block
    by block."""
    model, clean, corrupt, mask, metric = _pair(4, seed=1)

    def counted(receivers: list[tuple[int, int]] | None
                ) -> tuple[list[int], list[tuple[int, int]], torch.Tensor]:
        """Block i's runs, what progress heard and the senders, passes of 3."""
        ran, heard = [0] * 4, []
        hooks = [block.register_forward_hook(lambda *_, i=i: ran.__setitem__(i, ran[i] + 1))
                 for i, block in enumerate(model.blocks)]
        try:
            result = path_patching(model, clean, corrupt, metric, receivers,
                                   attention_mask=mask, batch=3,
                                   progress=lambda *n: heard.append(n))
        finally:
            for hook in hooks:
                hook.remove()
        return ran, heard, result.senders

    # senders 0.0 0.1 1.0 | 1.1: step 1 from layers 0 and 1, step 2 from layer 2 twice
    # to the logits, senders 0.0 0.1 1.0 | 1.1 2.0 2.1 | 3.0 3.1: step 1 from 0, 1 and 3
    # progress, block by block: a pass's runs count in proportion to the blocks its steps
    # have run (to (2, 0): the first pass runs 4 + 2 blocks, the second 3 + 2; to the
    # logits: 4, 3 and 1), all of them once scored
    for receivers, calls, heard in [
            ([(2, 0)], [3, 4, 6, 6], [(1, 4), (2, 4), (3, 4), (4, 4)]),
            (None, [3, 4, 4, 5], [(1, 8), (2, 8), (3, 8), (4, 8), (5, 8), (6, 8), (8, 8)])]:
        ran, told, senders = counted(receivers)
        assert ran == calls, receivers
        assert told == heard, receivers
        one = path_patching(model, clean, corrupt, metric, receivers, attention_mask=mask,
                            batch=1)
        torch.testing.assert_close(senders, one.senders, rtol=0, atol=1e-12, equal_nan=True)


def test_a_receiver_in_layer_zero_is_taken_beside_later_ones() -> None:
    """No head comes before layer 0, so a receiver there gets its corrupted inputs from every
    sender: beside a later receiver it changes no effect (receivers all in layer 0 are
    refused, one among others is not)."""
    model, clean, corrupt, mask, metric = _pair(2, seed=2)
    both = path_patching(model, clean, corrupt, metric, [(0, 1), (1, 0)], attention_mask=mask)
    alone = path_patching(model, clean, corrupt, metric, [(1, 0)], attention_mask=mask)
    assert both.receivers == [(0, 1), (1, 0)]
    torch.testing.assert_close(both.senders, alone.senders, rtol=0, atol=1e-12, equal_nan=True)
    assert alone.senders[0].abs().max() > 1e-3


def test_one_pair_alone_is_two_integers() -> None:
    """A pair is taken as one receiver when both entries are integers: (1, 0.5) is refused,
    not read as head 0 of layer 1."""
    model, clean, corrupt, _, metric = _pair(2)
    with pytest.raises(ValueError, match=r"receivers=\(1, 0.5\): give \(layer, head\) pairs"):
        path_patching(model, clean, corrupt, metric, (1, 0.5))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"receivers=\[\(1.7, 0\)\]: give"):  # not layer 1
        path_patching(model, clean, corrupt, metric, [(1.7, 0)])  # type: ignore[list-item]
    numpy_pair = (np.int64(1), np.int64(0))  # one pair of numpy integers
    assert path_patching(model, clean, corrupt, metric, numpy_pair).receivers == [(1, 0)]
