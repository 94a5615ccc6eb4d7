"""Evaluation: the mean loss of each split on fixed batches, the same sequences however the
optimizer's batch is split into micro-batches."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.model.gpt import GPT, GPTConfig
from attnlab.train.config import TrainConfig
from attnlab.train.data import TaskDataset, TextDataset
from attnlab.train.evaluate import evaluate


def _dataset(kind: str, tmp_path: Path) -> tuple[Any, int]:
    """(a dataset, the sequence length to evaluate it at)."""
    if kind == "copy":
        task = TaskDataset("copy")
        return task, task.max_block_size
    words = random.Random(0).choices(["thou", "art", "the", "king", "of", "night", "and"], k=2000)
    (tmp_path / "corpus.txt").write_text(" ".join(words), encoding="utf-8")
    return TextDataset.from_file(tmp_path / "corpus.txt", "char", cache_dir=tmp_path / "c"), 16


@pytest.mark.parametrize("kind", ["text", "copy"])
def test_a_batch_split_otherwise_evaluates_on_the_same_sequences(
    tmp_path: Path, kind: str,
) -> None:
    """12 sequences a step, as one micro-batch, two of 6 or four of 3: the same losses. Each
    evaluation batch was batch_size sequences, so the three runs evaluated on other samples
    (and fewer of them) and their val losses could not be compared."""
    dataset, seq_len = _dataset(kind, tmp_path)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=dataset.tokenizer.vocab_size, block_size=seq_len,
                          n_layer=1, n_head=2, n_embd=16))
    losses = [evaluate(model, dataset, TrainConfig(batch_size=rows, grad_accum=12 // rows,
                                                   eval_iters=3, seed=5), seq_len)
              for rows in (12, 6, 3)]
    for other in losses[1:]:  # the same rows; float32 sums over other micro-batches
        assert other == pytest.approx(losses[0], rel=1e-6, abs=0)
    other_batch = evaluate(model, dataset, TrainConfig(batch_size=6, eval_iters=3, seed=5),
                           seq_len)
    assert other_batch["val_loss"] != pytest.approx(losses[0]["val_loss"], rel=1e-4)
