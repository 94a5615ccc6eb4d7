"""`attnlab cache`: the token cache's entries listed, and cleared while runs may read them."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from attnlab.cli import main
from attnlab.train import token_cache
from attnlab.train.data import TextDataset

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(300))
DAY_S = 86_400


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _text(tmp_path: Path, name: str = "corpus.txt", text: str = TEXT) -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path / name


def _load(path: Path, spec: str, cache: Path) -> tuple[TextDataset, bool]:
    """The dataset, and whether it was tokenized (not read from the cache)."""
    heard: list[int] = []
    ds = TextDataset.from_file(path, spec, cache_dir=cache,
                               progress=lambda done, total: heard.append(done))
    return ds, bool(heard)


def _age(entry: Path, days: float) -> None:
    then = time.time() - days * DAY_S
    os.utime(entry, (then, then))


def test_entries_are_listed_with_their_tokenizer_text_size_and_last_use(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cache"]) == 0
    assert capsys.readouterr().out == f"cache    {cache / 'data'}: no entries\n"
    corpus = _text(tmp_path)
    _load(corpus, "bpe:300", cache)
    char, _ = _load(corpus, "char", cache)
    (old,) = [e for e in (cache / "data").iterdir()
              if json.loads((e / "meta.json").read_text())["tokenizer"] == "char"]
    # an entry an older attnlab wrote records its token counts alone
    (old / "meta.json").write_text(json.dumps({"train": len(char.train), "val": len(char.val)}))
    _age(old, 3)
    assert main(["cache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"cache    {cache / 'data'}: 2 entries, ")
    assert lines[1].split() == ["last", "used", "size", "tokens", "tokenizer", "text"]
    newest, oldest = lines[2].split(), lines[3].split()
    assert newest[5:] == ["bpe:300", str(corpus.resolve())]  # the most recently used first
    assert oldest[5:] == ["char", "(not", "recorded:", "written", "by", "an", "older", "attnlab)"]
    assert oldest[4] == f"{len(TEXT):,}" and lines[-1].startswith("clear    attnlab cache")
    assert main(["cache", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["entries"]
    assert [(e["tokenizer"], e["source"], e["unfinished"]) for e in listed] == [
        ("bpe:300", str(corpus.resolve()), False), ("char", None, False)]
    assert listed[1]["size"] == sum(f.stat().st_size for f in old.iterdir())


def test_a_run_that_reads_an_entry_marks_it_used(cache: Path, tmp_path: Path) -> None:
    corpus = _text(tmp_path)
    _load(corpus, "char", cache)
    (entry,) = (cache / "data").iterdir()
    _age(entry, 40)
    _, tokenized = _load(corpus, "char", cache)
    assert not tokenized and time.time() - entry.stat().st_mtime < 60


def test_clear_older_than_removes_the_unused_entries_and_their_index_files(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus, other = _text(tmp_path), _text(tmp_path, "other.txt", TEXT.upper())
    _load(corpus, "char", cache)
    (old,) = (cache / "data").iterdir()
    _load(other, "char", cache)
    _age(old, 40)
    old_size = f"{sum(f.stat().st_size for f in old.iterdir()) / 1e3:.1f} kB"
    assert main(["cache", "--older-than", "30"]) == 0  # a list: nothing removed
    assert "1 entry unused for 30 days" in capsys.readouterr().out and old.exists()
    assert main(["cache", "--clear", "--older-than", "30"]) == 0
    assert capsys.readouterr().out.startswith(f"removed  1 entry, {old_size} from {cache}")
    assert not old.exists() and len(list((cache / "data").iterdir())) == 1
    assert len(list((cache / "data-index").iterdir())) == 1  # the removed entry's is gone
    assert not _load(other, "char", cache)[1] and _load(corpus, "char", cache)[1]


def test_clear_keeps_the_data_of_a_run_reading_an_entry_and_a_later_run_makes_it_again(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = _text(tmp_path)
    reading, _ = _load(corpus, "bpe:300", cache)
    before = np.array(reading.train)
    assert main(["cache", "--clear"]) == 0
    assert capsys.readouterr().out.startswith("removed  1 entry, ")
    assert list((cache / "data").iterdir()) == list((cache / "data-index").iterdir()) == []
    assert np.array_equal(reading.train, before)  # its memmaps still read the removed files
    again, tokenized = _load(corpus, "bpe:300", cache)
    assert tokenized and np.array_equal(again.train, before)


def test_an_entry_taken_away_while_a_run_opens_it_is_made_again(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the check that an entry is whole and its memmaps, a clear renames it away:
    the run made it again (it raised FileNotFoundError)."""
    corpus = _text(tmp_path)
    first, _ = _load(corpus, "char", cache)
    whole = token_cache._whole_cache

    def cleared_meanwhile(cached: Path, dtype: type) -> bool:
        found = whole(cached, dtype)
        monkeypatch.setattr(token_cache, "_whole_cache", whole)  # once
        token_cache.remove_entries(cache, token_cache.cache_entries(cache))
        return found

    monkeypatch.setattr(token_cache, "_whole_cache", cleared_meanwhile)
    again, tokenized = _load(corpus, "char", cache)
    assert tokenized and np.array_equal(again.train, first.train)


def test_a_write_under_way_is_kept_and_one_cut_short_removed(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run writes an entry into a temporary directory, then renames it into place; one
    killed meanwhile left it forever (and a clear cut short, its renamed-away entry)."""
    _load(_text(tmp_path), "char", cache)
    (entry,) = (cache / "data").iterdir()
    under_way, cut_short, renamed = (entry.with_name(f"{entry.name}.{tail}")
                                     for tail in ("tmp-1-aa", "tmp-2-bb", "del-3-cc"))
    for leftover in (under_way, cut_short, renamed):
        leftover.mkdir()
        (leftover / "train.bin").write_bytes(b"\0" * 1000)
    _age(cut_short, 1 / 12)  # two hours: no write takes that long
    assert main(["cache"]) == 0
    listed = capsys.readouterr().out
    assert listed.count("unfinished: ") == 3 and f"unfinished: {under_way.name}" in listed
    assert main(["cache", "--clear"]) == 0
    assert capsys.readouterr().out.startswith("removed  3 entries, ")
    assert [p.name for p in (cache / "data").iterdir()] == [under_way.name]
    assert main(["cache", "--clear", "--older-than", "-1"]) == 1
    assert "--older-than -1.0: give a number of days, 0 or more" in capsys.readouterr().err
