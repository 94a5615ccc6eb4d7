"""Data: splits, the token cache, batches, built-in datasets, bad inputs."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab import tokenizers
from attnlab.train.data import SentenceDataset, TaskDataset, TextDataset, load_dataset, read_text

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(200))


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_split_is_the_whole_text_in_order(corpus: Path, tmp_path: Path) -> None:
    ds = TextDataset.from_file(corpus, "char", val_fraction=0.1, cache_dir=tmp_path / "c")
    ids = np.concatenate([ds.train, ds.val])
    assert ds.tokenizer.decode(ids.tolist()) == TEXT
    assert len(ds.val) == int(len(TEXT) * 0.1)
    assert ds.train.dtype == np.uint16 and isinstance(ds.train, np.memmap)


def test_tokenized_once_then_read_from_the_cache(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "c"
    first = TextDataset.from_file(corpus, "char", cache_dir=cache)
    assert len(list((cache / "data").iterdir())) == 1

    def no_encoding(self: object, text: str) -> list[int]:
        raise AssertionError("the cached text was tokenized again")

    monkeypatch.setattr(tokenizers.CharTokenizer, "encode", no_encoding)
    again = TextDataset.from_file(corpus, "char", cache_dir=cache)
    assert np.array_equal(first.train, again.train) and np.array_equal(first.val, again.val)
    monkeypatch.undo()
    corpus.write_text(TEXT + "one more line\n")  # new content, new cache entry
    TextDataset.from_file(corpus, "char", cache_dir=cache)
    assert len(list((cache / "data").iterdir())) == 2


def test_a_cache_another_process_wrote_first_is_read(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs (or torchrun's ranks) tokenizing one new text: the second to rename its cache
    into place found the first's there and failed with 'Directory not empty'."""
    import os
    import shutil

    from attnlab.train import token_cache

    cache, replace = tmp_path / "c", os.replace
    theirs = TextDataset.from_file(corpus, "char", cache_dir=tmp_path / "theirs")
    (entry,) = (tmp_path / "theirs" / "data").iterdir()

    def after_theirs(src: str, dst: str) -> None:  # the other process renames first
        shutil.copytree(entry, dst)
        replace(src, dst)

    monkeypatch.setattr(token_cache.os, "replace", after_theirs)
    ours = TextDataset.from_file(corpus, "char", cache_dir=cache)
    assert np.array_equal(ours.train, theirs.train)
    assert [p.name for p in (cache / "data").iterdir()] == [entry.name]  # no .tmp left


@pytest.mark.parametrize(("spec", "damage"), [
    ("char", "train.bin"), ("char", "meta.json"), ("char", "tokenizer_config.json"),
    ("bpe:300", "tokenizer.json"), ("bpe:300", "index"),
])
def test_a_damaged_cache_is_made_again(
    corpus: Path, tmp_path: Path, spec: str, damage: str
) -> None:
    """A cache file cut short (a full disk, a copy) failed every later run with numpy's
    'mmap length is greater than file size', naming neither the file nor the fix; a damaged
    tokenizer file beside the ids failed every later run as 'not a valid tokenizer'."""
    cache = tmp_path / "c"
    whole = TextDataset.from_file(corpus, spec, cache_dir=cache)
    train, val = np.array(whole.train), np.array(whole.val)  # copies: the files get cut
    del whole
    (entry,) = (cache / "data").iterdir()
    (index,) = (cache / "data-index").iterdir()  # the spec's: which entry holds its ids
    path = index if damage == "index" else entry / damage
    path.write_bytes(path.read_bytes()[:10])
    again = TextDataset.from_file(corpus, spec, cache_dir=cache)
    assert np.array_equal(again.train, train) and np.array_equal(again.val, val)
    assert again.tokenizer.decode(np.concatenate([train, val]).tolist()) == TEXT


@pytest.mark.parametrize(("spec", "builder"), [
    ("char", "CharTokenizer.from_text"), ("word", "WordTokenizer.from_text"),
    ("bpe:300", "HFTokenizer.train"),
])
def test_a_second_run_builds_no_tokenizer(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, builder: str
) -> None:
    """The cache was keyed by the built tokenizer, so every run trained the bpe on the whole
    text again before it could look: the entry it finds holds the tokenizer."""
    cache = tmp_path / "c"
    first = TextDataset.from_file(corpus, spec, cache_dir=cache)

    def built_again(*args: object) -> None:
        raise AssertionError(f"{builder} ran again on a cached text")

    cls, name = builder.split(".")
    monkeypatch.setattr(getattr(tokenizers, cls), name, built_again)
    again = TextDataset.from_file(corpus, spec, cache_dir=cache)
    assert np.array_equal(first.train, again.train) and np.array_equal(first.val, again.val)
    assert again.tokenizer.identity() == first.tokenizer.identity()


def test_an_entry_per_tokenizer_spec_val_fraction_and_text(corpus: Path, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    runs = [("char", 0.1), ("word", 0.1), ("bpe:300", 0.1), ("bpe:301", 0.1), ("char", 0.2)]
    for spec, val_fraction in runs:
        TextDataset.from_file(corpus, spec, val_fraction=val_fraction, cache_dir=cache)
    assert len(list((cache / "data").iterdir())) == len(runs)
    for same in ("bpe", "bpe:512"):  # one tokenizer, spelt two ways: one entry
        TextDataset.from_file(corpus, same, cache_dir=cache)
    assert len(list((cache / "data").iterdir())) == len(runs) + 1
    corpus.write_text(TEXT + "more\n")
    TextDataset.from_file(corpus, "bpe:300", cache_dir=cache)
    assert len(list((cache / "data").iterdir())) == len(runs) + 2


def test_a_spec_and_a_checkpoints_copy_of_its_tokenizer_share_an_entry(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume reads its text with the checkpoint's tokenizer (a path): it finds the entry
    the run's spec made. An entry made before specs were indexed (keyed by the tokenizer
    alone, as every entry still is) is found by its spec after one build, not encoded again."""
    cache = tmp_path / "c"
    first = TextDataset.from_file(corpus, "bpe:300", cache_dir=cache)
    first.tokenizer.save(tmp_path / "ckpt")

    def no_encoding(self: object, pieces: object) -> list[list[int]]:
        raise AssertionError("the cached text was encoded again")

    monkeypatch.setattr(tokenizers.HFTokenizer, "encode_pieces", no_encoding)
    resumed = TextDataset.from_file(corpus, str(tmp_path / "ckpt"), cache_dir=cache)
    shutil.rmtree(cache / "data-index")
    indexed = TextDataset.from_file(corpus, "bpe:300", cache_dir=cache)
    for ds in (resumed, indexed):
        assert np.array_equal(ds.train, first.train) and np.array_equal(ds.val, first.val)
    assert len(list((cache / "data").iterdir())) == len(list((cache / "data-index").iterdir()))


def test_a_tokenizer_path_is_keyed_by_what_it_holds(corpus: Path, tmp_path: Path) -> None:
    """A checkpoint's tokenizer can change under the same path: its ids are not reused."""
    saved = tmp_path / "tok"
    tokenizers.CharTokenizer.from_text(TEXT).save(saved)
    first = TextDataset.from_file(corpus, str(saved), cache_dir=tmp_path / "c")
    tokenizers.CharTokenizer.from_text(TEXT + "XYZ").save(saved)  # another id for each
    again = TextDataset.from_file(corpus, str(saved), cache_dir=tmp_path / "c")
    assert again.tokenizer.vocab_size == first.tokenizer.vocab_size + 3
    assert not np.array_equal(first.train, again.train)
    assert again.tokenizer.decode(np.concatenate([again.train, again.val]).tolist()) == TEXT


@pytest.mark.parametrize("spec", ["char", "word", "byte", "bpe:300"])
def test_a_long_text_is_encoded_in_pieces_to_the_ids_of_the_whole(
    tmp_path: Path, spec: str
) -> None:
    """Several batches of pieces (64k characters, 8 at once): the ids of encoding it whole;
    its fingerprint (hashed a MiB at a time) the hash of the whole file, as a resume checks."""
    path, text = tmp_path / "long.txt", TEXT * 100  # 1.06M characters
    path.write_text(text)
    heard: list[tuple[int, int]] = []
    ds = TextDataset.from_file(path, spec, cache_dir=tmp_path / "c",
                               progress=lambda done, total: heard.append((done, total)))
    assert np.concatenate([ds.train, ds.val]).tolist() == ds.tokenizer.encode(text)
    assert ds.fingerprint == hashlib.sha256(path.read_bytes()).hexdigest()[:20]
    assert len(heard) == 3 and heard[-1] == (len(text), len(text))
    assert heard[0][0] < heard[1][0] < heard[2][0]


@pytest.mark.parametrize("spec", ["char", "bpe:300"])
def test_a_cjk_text_is_encoded_in_pieces_too(tmp_path: Path, spec: str) -> None:
    """Its lines end in "。", where cl100k's punctuation takes in the newline: it was one
    piece, encoded at once (Hugging Face: ~420 bytes a token). A bpe cuts after such a
    newline (pieces.GPT2_PIECE_CUT), a char tokenizer before one after a letter."""
    path, text = tmp_path / "cjk.txt", "吾輩は猫である。\n名前はまだ無い\n" * 40_000  # 680k
    path.write_text(text, encoding="utf-8")
    heard: list[tuple[int, int]] = []
    ds = TextDataset.from_file(path, spec, cache_dir=tmp_path / "c",
                               progress=lambda done, total: heard.append((done, total)))
    assert np.concatenate([ds.train, ds.val]).tolist() == ds.tokenizer.encode(text)
    assert len(heard) == 2 and heard[-1] == (len(text), len(text))  # 8 pieces, then 2


def test_a_tokenizer_trained_on_the_text_is_heard_of_first_and_a_cached_one_not(
    corpus: Path, tmp_path: Path
) -> None:
    """A BPE's trainer reports no progress: `training` hears before it starts (the CLI says
    so); a tokenizer not built from the text (byte), or a cached text, is not heard of."""
    heard: list[tuple[str, int]] = []
    for spec in ("bpe", "byte", "bpe:512", "word"):
        TextDataset.from_file(corpus, spec, cache_dir=tmp_path / "c",
                              training=lambda *said: heard.append(said))
    assert heard == [("bpe:512", len(TEXT)), ("word", len(TEXT))]


def test_a_character_outside_the_vocabulary_is_placed_in_the_whole_text(tmp_path: Path) -> None:
    path, text = tmp_path / "long.txt", TEXT * 70 + "QED\n"
    path.write_text(text)
    tok = tokenizers.CharTokenizer.from_text(TEXT)  # no capitals
    with pytest.raises(tokenizers.CannotEncode, match=f"'Q' at position {len(TEXT) * 70}"):
        TextDataset.from_file(path, tok, cache_dir=tmp_path / "c")


def test_a_directory_of_txt_files(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("abc" * 50)
    (tmp_path / "d" / "b.txt").write_text("xyz" * 50)
    ds = TextDataset.from_file(tmp_path / "d", "char", cache_dir=tmp_path / "c")
    assert ds.tokenizer.vocab_size == 7  # a b c x y z and the joining newline


def test_batches_are_windows_with_shifted_targets(corpus: Path, tmp_path: Path) -> None:
    ds = TextDataset.from_file(corpus, "char", cache_dir=tmp_path / "c")
    g = torch.Generator().manual_seed(0)
    x, y = ds.batch("train", 5, 32, g)
    assert x.shape == y.shape == (5, 32) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row in x:
        assert ds.tokenizer.decode(row.tolist()) in TEXT
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(ds.batch("val", 3, 16, g1)[0], ds.batch("val", 3, 16, g2)[0])


@pytest.mark.parametrize(
    ("content", "match"),
    [(None, "does not exist"), ("", "empty"), ("  \n\n", "empty"), (b"\xff\xfe\x00", "UTF-8")],
)
def test_bad_data_files(tmp_path: Path, content: str | bytes | None, match: str) -> None:
    path = tmp_path / "data.txt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        load_dataset(str(path), cache_dir=tmp_path / "c")


def test_block_size_larger_than_the_data(tmp_path: Path) -> None:
    path = tmp_path / "small.txt"
    path.write_text("tiny text, only a few characters long")
    ds = TextDataset.from_file(path, "char", cache_dir=tmp_path / "c")
    with pytest.raises(ValueError, match="block_size=64 needs at least 65 tokens"):
        ds.batch("val", 2, 64, torch.Generator())


def test_sentences_are_the_seed_sentences() -> None:
    ds = load_dataset("animals")
    assert isinstance(ds, SentenceDataset)
    x, y = ds.batch("train", 1, 4, torch.Generator())
    assert x.shape == y.shape == (6, 4)
    assert ds.tokenizer.decode(x[0].tolist()) == "The dog is an"
    assert ds.tokenizer.decode([int(y[0, -1])]) == " animal"


@pytest.mark.parametrize("name", ["copy", "recall", "reverse"])
def test_tasks_put_the_loss_on_the_answer_only(name: str) -> None:
    ds = load_dataset(name)
    assert isinstance(ds, TaskDataset)
    g = torch.Generator().manual_seed(1)
    prompt, answer = ds.sample(g)
    x, y = ds.batch("train", 4, ds.max_block_size, torch.Generator().manual_seed(1))
    assert x.shape == (4, ds.max_block_size)
    text = ds.tokenizer.decode(x[0].tolist()) + ds.tokenizer.decode([int(y[0, -1])])
    assert text == prompt + answer
    assert (y[0] >= 0).sum() == len(answer)
    if name == "copy":
        assert answer == prompt[:-1]
    elif name == "reverse":
        assert answer == prompt[:-1][::-1]
    else:
        key = prompt[-1]
        assert prompt[prompt.index(key) + 1] == answer


def test_unknown_builtin_or_task() -> None:
    with pytest.raises(ValueError, match="unknown task"):
        TaskDataset("sort")
    with pytest.raises(FileNotFoundError, match="built-in dataset"):
        load_dataset("no-such-dataset")


def test_data_that_is_not_a_regular_file_is_named(tmp_path: Path) -> None:
    """`--data /dev/zero` said the file "does not exist"; a FIFO would block forever."""
    import os

    from attnlab.cli import main

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path, kind in (("/dev/zero", "a device"), (str(fifo), "a FIFO")):
        with pytest.raises(ValueError, match=f"is {kind}, not a regular file"):
            read_text(path)
        assert main(["train", "--data", path, "--max_iters", "1"]) == 1


def test_every_window_of_the_text_can_be_drawn() -> None:
    """len(ids) - block_size windows of block_size + 1 tokens fit: the last one (ending on
    the text's last token) is drawn too."""
    ids = np.arange(6, dtype=np.uint16)
    data = TextDataset("six", load_dataset("copy").tokenizer, ids, ids)
    x, y = data.batch("train", 64, 4, torch.Generator().manual_seed(0))
    assert set(x[:, 0].tolist()) == {0, 1}
    assert torch.equal(y, x + 1)


def test_datasets_repr_as_they_describe_themselves(tmp_path: Path) -> None:
    """The repr was object's (`<attnlab.train.data.TaskDataset object at 0x...>`)."""
    assert repr(load_dataset("copy")) == (
        "<TaskDataset copy (char tokenizer, 38 ids): length 8, examples of 17 tokens>")
    (tmp_path / "t.txt").write_text("abcd" * 50)
    text = load_dataset(str(tmp_path / "t.txt"), cache_dir=tmp_path / "cache")
    assert repr(text) == "<TextDataset t.txt (char tokenizer, 4 ids): 180 train + 20 val tokens>"
