"""train/token_cache.py at its edges: the smallest validation split, ids past uint16, a cache
file longer than its meta.json says, and an index file that names a path instead of an
entry. (The cache's ordinary use: tests/train/test_data.py and tests/cli/test_cli_cache.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnlab.train.data import TextDataset


def test_a_text_too_short_for_its_val_fraction_keeps_one_val_token(tmp_path: Path) -> None:
    """20 characters at val_fraction 0.01 is 0.2 of a token: the split rounds up to one, so
    the run has a validation token to predict and every id is in one split or the other."""
    path = tmp_path / "short.txt"
    path.write_text("abcdefghij" * 2)
    ds = TextDataset.from_file(path, "char", val_fraction=0.01, cache_dir=tmp_path / "c")
    assert (len(ds.train), len(ds.val)) == (19, 1)
    assert ds.tokenizer.decode([*ds.train.tolist(), *ds.val.tolist()]) == "abcdefghij" * 2


def test_ids_past_uint16_are_cached_as_uint32(tmp_path: Path) -> None:
    """A vocabulary over 65,536 ids (a word tokenizer of 70,000 distinct words) needs four
    bytes an id: two would wrap the ids past 65,535 onto others."""
    text = " ".join(f"w{i}" for i in range(70_000))
    path = tmp_path / "words.txt"
    path.write_text(text)
    ds = TextDataset.from_file(path, "word", val_fraction=0.1, cache_dir=tmp_path / "c")
    assert ds.tokenizer.vocab_size > 2**16 and ds.train.dtype == np.uint32
    ids = [*ds.train.tolist(), *ds.val.tolist()]
    assert ids == ds.tokenizer.encode(text) and max(ids) >= 2**16


def test_a_cache_file_longer_than_its_meta_says_is_made_again(tmp_path: Path) -> None:
    """Bytes appended to train.bin (a bad copy, another write's): the entry no longer holds
    the token counts its meta.json records, so it is made again, not half trusted."""
    path = tmp_path / "text.txt"
    path.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    cache = tmp_path / "c"
    whole = TextDataset.from_file(path, "char", cache_dir=cache)
    train = np.array(whole.train)
    del whole
    (entry,) = (cache / "data").iterdir()
    with open(entry / "train.bin", "ab") as f:
        f.write(b"\x07\x00" * 3)
    TextDataset.from_file(path, "char", cache_dir=cache)
    assert (entry / "train.bin").stat().st_size == train.nbytes  # written again, whole


def test_an_index_naming_a_path_instead_of_an_entry_is_ignored(tmp_path: Path) -> None:
    """An index file names its entry by its key under cache_dir/data; one that holds a path
    (edited, or garbled into an absolute path) must not lead a run to another text's ids."""
    cache = tmp_path / "c"
    other, text = tmp_path / "other.txt", tmp_path / "text.txt"
    other.write_text("zyxwvutsrq" * 30)
    text.write_text("abcdefghij" * 30)
    TextDataset.from_file(other, "char", cache_dir=cache)
    (other_entry,) = (cache / "data").iterdir()
    (other_index,) = (cache / "data-index").iterdir()
    TextDataset.from_file(text, "char", cache_dir=cache)
    (index,) = [p for p in (cache / "data-index").iterdir() if p != other_index]
    index.write_text(str(other_entry.resolve()))
    ds = TextDataset.from_file(text, "char", cache_dir=cache)
    assert ds.tokenizer.decode([*ds.train.tolist(), *ds.val.tolist()]) == "abcdefghij" * 30
