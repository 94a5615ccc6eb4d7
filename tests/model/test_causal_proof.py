"""The causal proof on the default model: the copy task's induction heads do the copying.

Trains `attnlab train`'s default model (the copy task, `recipes.recipe`) from its seed for
300 of the recipe's 600 steps (enough for 100% held-out accuracy; the full run is in the
README), ranks heads by induction score on the task's examples, and ablates heads: the
top-scoring induction heads (every head scoring at least half the best) take held-out
exact-match accuracy to near chance, the same number of lowest-scoring heads leave it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from attnlab.interp.edits import ablate
from attnlab.interp.heads import detect_heads, rank_heads, task_probe
from attnlab.train.data import TaskDataset, load_dataset
from attnlab.train.loop import train
from attnlab.train.recipes import answer_accuracy, recipe


def test_ablating_the_induction_heads_breaks_copying_and_the_others_do_not(
    tmp_path: Path,
) -> None:
    dataset = load_dataset("copy")
    assert isinstance(dataset, TaskDataset)
    model_config, train_config = recipe(dataset)
    train_config = dataclasses.replace(train_config, max_iters=300, eval_interval=300,
                                       eval_iters=1)
    model = train(model_config, train_config, dataset, tmp_path).model.eval()

    scores = detect_heads(model, task_probe(dataset, seed=1))["induction"]  # (n_layer, nh)
    ranked = rank_heads(scores)
    best = scores.max()
    top = [h for h in ranked if scores[h] >= best / 2]
    low = ranked[-len(top):]
    assert not set(top) & set(low) and len(top) < len(ranked)
    assert best > 0.3 and scores[low[0]] < 0.1  # a clear split, not a ranking of noise

    base, _ = answer_accuracy(model, dataset, n=256, seed=2)  # held out: fresh examples
    without_top, rows = answer_accuracy(model, dataset, n=256, seed=2, edits=ablate(top))
    without_low, _ = answer_accuracy(model, dataset, n=256, seed=2, edits=ablate(low))
    assert base >= 0.98
    assert without_top <= 0.05, rows[:4]  # chance for 8 letters in order is ~0
    assert without_low >= 0.95
    # per letter too: near the 1/26 of a guess, far from the intact model's
    letters = sum(a == b for _, ans, got in rows
                  for a, b in zip(ans, got.ljust(len(ans)), strict=True)) / (256 * 8)
    assert letters < 0.3
