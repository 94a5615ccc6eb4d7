"""interp/patching.py's finer grids: qkv=True's queries, keys, values and attention weights
patched from the clean run, checked cell by cell against one patch alone and against the
head's output they make up; attribution's estimates of every grid against a finite
difference."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.interp.edits import Edit, Edits, patch
from attnlab.interp.patching import (
    LogitDiff,
    activation_patching,
    attribution_patching,
    patch_effect,
)

#: multi-head GPT-2-style, and Llama-style with two query heads per key-value head
CONFIGS = [
    {},
    {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "n_head": 4, "n_kv_head": 2},
]


def _pair(switches: dict[str, Any], seed: int = 0
          ) -> tuple[GPT, torch.Tensor, torch.Tensor, torch.Tensor, LogitDiff]:
    """A float64 two-layer nano model, clean and corrupted (2, 6) ids (row 0 left-padded by
    2), their attention mask and a logit difference per row."""
    gen = torch.Generator().manual_seed(seed)
    clean, corrupt = torch.randint(0, 65, (2, 2, 6), generator=gen)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0
    torch.manual_seed(seed)
    model = GPT(GPTConfig.from_name("nano", init_std=0.3, **switches)).double().eval()
    return model, clean, corrupt, mask, LogitDiff(answer=torch.tensor([3, 4]), wrong=5, position=-1)


@pytest.mark.parametrize("switches", CONFIGS)
def test_each_cell_is_that_heads_input_patched_alone(switches: dict[str, Any]) -> None:
    """q and attn_weights are (n_layer, nh), k and v (n_layer, nkv); each cell equals that
    one head's value patched alone at every position (`patch_effect`), batched or one pass
    each, over a left-padded batch; the other grids are as without qkv."""
    model, clean, corrupt, mask, metric = _pair(switches)
    c = model.config
    plain = activation_patching(model, clean, corrupt, metric, attention_mask=mask)
    assert plain.q is None and "q" not in plain.to_dict()
    for batch in (None, 1):
        result = activation_patching(model, clean, corrupt, metric, attention_mask=mask,
                                     batch=batch, qkv=True)
        torch.testing.assert_close(result.heads, plain.heads, rtol=0, atol=1e-12)
        torch.testing.assert_close(result.resid, plain.resid, rtol=0, atol=1e-12)
        grids = {"q": result.q, "k": result.k, "v": result.v, "attn_weights": result.attn_weights}
        for name, grid in grids.items():
            assert grid is not None
            n = c.n_kv_heads if name in ("k", "v") else c.n_head
            assert grid.shape == (c.n_layer, n), name
            assert result.to_dict()[name] == grid.tolist()
            for layer in range(c.n_layer):
                for head in range(n):
                    alone = patch_effect(
                        model, clean, corrupt, metric, attention_mask=mask, names=[name],
                        make_edits=lambda t, n=name, la=layer, h=head: Edits(
                            [patch(t, n, la, heads=[h])]))
                    assert alone == pytest.approx(float(grid[layer, head]), rel=0,
                                                  abs=1e-12), (name, layer, head)
            assert grid.abs().max() > 1e-3, name  # the patches change something


@pytest.mark.parametrize("switches", CONFIGS)
def test_a_heads_inputs_together_patch_its_output(switches: dict[str, Any]) -> None:
    """A head's output is its weights times its values, and its weights come from its
    queries and keys: patching q, k and v of a key-value head's query heads together, or
    their attention weights and the values, patches those heads' outputs ("context"), the
    `heads` grid's cells summed as one patch."""
    model, clean, corrupt, mask, metric = _pair(switches, seed=1)
    c = model.config
    group = c.n_head // c.n_kv_heads

    def effect(*parts: tuple[str, list[int]], layer: int) -> float:
        return patch_effect(model, clean, corrupt, metric, attention_mask=mask,
                            names=[name for name, _ in parts],
                            make_edits=lambda t: Edits([patch(t, name, layer, heads=heads)
                                                        for name, heads in parts]))

    for layer in range(c.n_layer):
        for kv in range(c.n_kv_heads):
            queries = list(range(kv * group, (kv + 1) * group))
            output = effect(("context", queries), layer=layer)
            inputs = effect(("q", queries), ("k", [kv]), ("v", [kv]), layer=layer)
            weights = effect(("attn_weights", queries), ("v", [kv]), layer=layer)
            assert inputs == pytest.approx(output, rel=0, abs=1e-10)
            assert weights == pytest.approx(output, rel=0, abs=1e-10)
            assert abs(output) > 1e-3
    # one query head of a group alone is not its key-value head's output
    if group > 1:
        result = activation_patching(model, clean, corrupt, metric, attention_mask=mask,
                                     qkv=True)
        assert result.q is not None and result.k is not None
        assert float((result.q[:, 0] - result.k[:, 0]).abs().max()) > 1e-4


def _derivative(model: GPT, clean: torch.Tensor, corrupt: torch.Tensor, mask: torch.Tensor,
                metric: LogitDiff, name: str, layer: int, **where: tuple[int, ...]) -> float:
    """The normalized metric's derivative as the cells `where` (heads, positions) of `name`
    at `layer` move from their corrupted toward their clean values: a central difference."""
    eps = 1e-5

    def step(sign: float) -> float:
        def make(t: Any) -> Edits:
            source = t.get(name, layer)

            def toward(value: torch.Tensor, first: int) -> torch.Tensor:
                return value + sign * eps * (source - value)
            return Edits([Edit(name, layer, toward, **where)])
        return patch_effect(model, clean, corrupt, metric, make, attention_mask=mask,
                            names=[name])

    return (step(1.0) - step(-1.0)) / (2 * eps)


@pytest.mark.parametrize("switches", CONFIGS)
def test_attribution_of_each_grid_is_its_directional_derivative(
        switches: dict[str, Any]) -> None:
    """attribution_patching's cells are each value's first-order effect: the metric's change
    when that cell moves a small step from its corrupted toward its clean state, divided by
    the step, normalized as the effects (a central difference in float64), for qkv=True's
    q, k, v and attn_weights, by_position's heads at one position and blocks' attention and
    MLP outputs at one position; the heads grid is the same with or without them."""
    model, clean, corrupt, mask, metric = _pair(switches, seed=2)
    c = model.config
    result = attribution_patching(model, clean, corrupt, metric, attention_mask=mask, qkv=True,
                                  by_position=True, blocks=True)
    plain = attribution_patching(model, clean, corrupt, metric, attention_mask=mask)
    torch.testing.assert_close(result.heads, plain.heads, rtol=0, atol=1e-12)
    torch.testing.assert_close(result.resid, plain.resid, rtol=0, atol=1e-12)
    assert plain.q is None and plain.heads_by_position is None and plain.attn_out is None
    last, T = c.n_layer - 1, clean.shape[1]
    for name, grid in (("q", result.q), ("k", result.k), ("v", result.v),
                       ("attn_weights", result.attn_weights)):
        assert grid is not None
        n = c.n_kv_heads if name in ("k", "v") else c.n_head
        assert grid.shape == (c.n_layer, n)
        for layer, head in [(0, 0), (last, n - 1)]:
            derivative = _derivative(model, clean, corrupt, mask, metric, name, layer,
                                     heads=(head,))
            assert derivative == pytest.approx(float(grid[layer, head]), rel=1e-5, abs=1e-8)
        assert grid.abs().max() > 1e-3, name
    by_position = result.heads_by_position
    assert by_position is not None and by_position.shape == (c.n_layer, c.n_head, T)
    torch.testing.assert_close(by_position.sum(-1), result.heads, rtol=0, atol=1e-12)
    for layer, head, pos in [(0, 1, 5), (last, 0, 3)]:
        derivative = _derivative(model, clean, corrupt, mask, metric, "context", layer,
                                 heads=(head,), positions=(pos,))
        assert derivative == pytest.approx(float(by_position[layer, head, pos]), rel=1e-5,
                                           abs=1e-8)
    for name, grid in (("attn_out", result.attn_out), ("mlp_out", result.mlp_out)):
        assert grid is not None and grid.shape == (c.n_layer, T)
        for layer, pos in [(0, 5), (last, 4)]:
            derivative = _derivative(model, clean, corrupt, mask, metric, name, layer,
                                     positions=(pos,))
            assert derivative == pytest.approx(float(grid[layer, pos]), rel=1e-5, abs=1e-8)
        assert grid.abs().max() > 1e-3, name
