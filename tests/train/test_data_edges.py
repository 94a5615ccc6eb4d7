"""train/data.py at its edges: one process's rows of a batch (torchrun), the recall task's
queries, bits per byte per split, the one-token check, and text in subdirectories.
(Ordinary batches and datasets: tests/train/test_data.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.tokenizers import CharTokenizer
from attnlab.train.data import TaskDataset, TextDataset, load_dataset, read_text


def _dataset(kind: str, tmp_path: Path) -> tuple[object, int]:
    """A dataset of each kind and the block size its batches take."""
    if kind == "text":
        path = tmp_path / "t.txt"
        path.write_text("".join(f"line {i}: a quick brown fox\n" for i in range(40)))
        return TextDataset.from_file(path, "char", cache_dir=tmp_path / "c"), 12
    ds = load_dataset(kind)
    return ds, ds.max_block_size  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["text", "animals", "copy", "recall"])
@pytest.mark.parametrize(("size", "rank"), [(2, 0), (2, 1), (3, 2)])
def test_a_processes_rows_are_its_share_of_the_whole_batch(
        kind: str, size: int, rank: int, tmp_path: Path) -> None:
    """Under torchrun each rank reads rows rank*n..(rank+1)*n-1 of the batch one process
    would read, and its generator advances as for the whole batch: the next batch of every
    rank is again its share of the next whole batch."""
    ds, block = _dataset(kind, tmp_path)
    batch = 6  # animals: its six sentences, which is six too
    n = batch // size
    rows = slice(rank * n, (rank + 1) * n)
    whole_gen, rank_gen = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for _ in range(2):
        x, y = ds.batch("train", batch, block, whole_gen)  # type: ignore[attr-defined]
        xr, yr = ds.batch("train", batch, block, rank_gen, rows)  # type: ignore[attr-defined]
        assert torch.equal(xr, x[rows]) and torch.equal(yr, y[rows])
        assert xr.shape[0] == n
    assert torch.equal(whole_gen.get_state(), rank_gen.get_state())


def test_recall_queries_every_key_position() -> None:
    """The query is any of the n keys, the last one too (else the last pair's digit is never
    an answer, and a model need not attend to it)."""
    ds = TaskDataset("recall", length=3)
    g = torch.Generator().manual_seed(0)
    asked = set()
    for _ in range(200):
        prompt, answer = ds.sample(g)
        pairs, key = prompt.split("?")
        position = pairs.index(key) // 2
        assert pairs[2 * position + 1] == answer
        asked.add(position)
    assert asked == {0, 1, 2}


def test_bytes_per_token_are_utf8_bytes_of_each_splits_own_text() -> None:
    """Bits per byte divide by UTF-8 bytes (é is 2, € is 3), each split by its own text: a
    split of other characters than the other's has other bytes per token."""
    tok = CharTokenizer(sorted("ab€é"))
    ids = {c: i for i, c in enumerate(sorted("ab€é"))}
    train = np.array([ids[c] for c in "abab"], dtype=np.uint16)
    val = np.array([ids[c] for c in "é€"], dtype=np.uint16)
    ds = TextDataset("mixed", tok, train, val)
    assert ds.bytes_per_token("train") == 1.0
    assert ds.bytes_per_token("val") == 2.5


def test_text_of_two_tokens_is_taken_even_if_its_train_split_holds_one(
        tmp_path: Path) -> None:
    """Only a text of one distinct token is refused: one whose other tokens all fall in
    the validation split still has something to learn from."""
    path = tmp_path / "t.txt"
    path.write_text("a" * 90 + "bcdefghijk")
    ds = TextDataset.from_file(path, "char", val_fraction=0.1, cache_dir=tmp_path / "c")
    assert set(ds.train.tolist()) == {ds.tokenizer.encode("a")[0]}
    assert len(set(ds.val.tolist())) == 10


def test_a_directory_of_text_reads_its_subdirectories_too(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_text("top")
    (tmp_path / "d" / "sub" / "b.txt").write_text("middle")
    (tmp_path / "d" / "sub" / "deeper" / "c.txt").write_text("bottom")
    (tmp_path / "d" / "sub" / "notes.md").write_text("not text data")
    assert read_text(tmp_path / "d") == "top\nmiddle\nbottom"
