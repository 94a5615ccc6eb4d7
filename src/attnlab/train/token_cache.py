"""The token cache of `TextDataset.from_file` (data.py): a text's ids, tokenized once into
`cache_dir/data/<key>/{train,val}.bin` with the tokenizer beside them, read back as memmaps.

An entry's key hashes the tokenizer itself, the validation fraction and the text; a named
spec's index file (`cache_dir/data-index/<key>`) names the entry of that spec, text and
fraction, so a later run finds it before it builds a tokenizer (trains a BPE on all the text
again). Entries are written to a temporary directory and renamed into place: an interrupted
run leaves no half entry, and a damaged one is made again. `cache_entries` lists them, with
what each was made from and when a run last read it; `remove_entries` removes them while
runs may be reading them (`attnlab cache`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..tokenizers import CannotEncode, Tokenizer, get_tokenizer, load_tokenizer
from ..tokenizers.loading import named_spec
from ..tokenizers.pieces import text_pieces

# pieces of 64k characters (pieces.text_pieces) encoded at once: Hugging Face encodes them in
# parallel, and holds ~420 bytes a token of them meanwhile (docs/performance.md#token-cache)
PIECES_AT_ONCE = 8
Progress = Callable[[int, int], None]  # (done, in all)
# (spec, characters): a tokenizer is about to be trained on the text; a BPE's trainer
# (Hugging Face tokenizers) takes all the text at once and reports no progress of its own
Training = Callable[[str, int], None]
TRAINED_SPECS = ("char", "word", "bpe")  # the kinds of named spec built from the text


def token_cache(
    root: Path, tokenizer: str | Tokenizer, text: str, fingerprint: str, val_fraction: float,
    progress: Progress | None, training: Training | None = None, source: str | None = None,
) -> tuple[Tokenizer, np.ndarray, np.ndarray]:
    """The tokenizer and the train and val ids of `text`, from `root/data/<key>`, made there
    if it holds none. The key is the tokenizer's own hash with val_fraction and the text's, so
    a spec, a checkpoint's copy of its tokenizer (a resume) and a Tokenizer share an entry. A
    named spec (char, word, bpe:N, byte, tiktoken:ENC) fixes the tokenizer given the text, so
    `root/data-index/<spec key>` names its entry: found before a tokenizer is built (a bpe
    trained on all the text again). Only where no entry is found: `training(spec,
    characters)` hears before a tokenizer is trained on the text, `progress(characters
    encoded, characters)` while it is encoded; the entry records `source` (the text's path)
    for `cache_entries`."""
    data, spec = root / "data", named_spec(tokenizer) if isinstance(tokenizer, str) else None
    index = root / "data-index" / _hash(f"{spec}|{val_fraction}|{fingerprint}") if spec else None
    entry = _indexed(data, index) if index is not None else None
    opened = _open_cache(entry) if entry is not None else None
    if opened is not None:
        return opened
    if spec is not None and training is not None and spec.split(":")[0] in TRAINED_SPECS:
        training(spec, len(text))
    tok = get_tokenizer(tokenizer, text) if isinstance(tokenizer, str) else tokenizer
    key = _hash(f"{tok.identity()}|{val_fraction}|{fingerprint}")
    cached = data / key
    opened = _open_cache(cached)
    if opened is None:  # none yet, or cut short or edited: made (again)
        shutil.rmtree(cached, ignore_errors=True)
        dtype = _dtype(tok)
        ids = _encode(tok, text, dtype, progress)
        n_val = max(1, int(len(ids) * val_fraction))
        about: dict[str, object] = {"tokenizer": spec or tok.name, "source": source,
                                    "characters": len(text), "val_fraction": val_fraction}
        _write_split(cached, ids[: len(ids) - n_val], ids[len(ids) - n_val:], tok, dtype,
                     about)
        del ids
        opened = _open_cache(cached)
        if opened is None:
            raise RuntimeError(f"the token cache {cached}, just written, does not read back "
                               "(a full disk, or `attnlab cache --clear` meanwhile?); remove "
                               "it and run again")
    if index is not None:  # one write: a torn one names no entry, and is made again
        index.parent.mkdir(parents=True, exist_ok=True)
        index.write_text(key)
    return opened


def _indexed(data: Path, index: Path) -> Path | None:
    """The entry a spec's index file names; None where the file is missing or garbled."""
    try:
        key = index.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return data / key if re.fullmatch(r"[0-9a-f]{20}", key) else None


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:20]


def text_hash(text: str) -> str:
    """sha256 of the text's UTF-8, a slice at a time (not a second copy of all of it)."""
    digest = hashlib.sha256()
    for start in range(0, len(text), 1 << 20):
        digest.update(text[start:start + (1 << 20)].encode())
    return digest.hexdigest()[:20]


def _dtype(tok: Tokenizer) -> type:
    return np.uint16 if tok.vocab_size <= 2**16 else np.uint32


def _encode(tok: Tokenizer, text: str, dtype: type, progress: Progress | None) -> np.ndarray:
    """`text`'s ids, encoded a few of its `text_pieces` at a time where that gives the ids of
    the whole text (`Tokenizer.encodes_in_pieces`, cut at its `piece_cut`; else all at
    once)."""
    pieces = text_pieces(text, cut=tok.piece_cut) if tok.encodes_in_pieces else iter([text])
    parts: list[np.ndarray] = []
    done = 0
    while batch := list(itertools.islice(pieces, PIECES_AT_ONCE)):
        try:
            parts += [np.array(ids, dtype=dtype) for ids in tok.encode_pieces(batch)]
        except CannotEncode:  # said again from the text's start, so its position is the text's
            tok.encode(text[:done + sum(map(len, batch))])
            raise
        done += sum(map(len, batch))
        if progress is not None:
            progress(done, len(text))
    return np.concatenate(parts)


def _open_cache(cached: Path) -> tuple[Tokenizer, np.ndarray, np.ndarray] | None:
    """The tokenizer and the train and val ids of a cache entry, or None where there is none
    or it is damaged (files cut short, edited or missing)."""
    if not (cached / "meta.json").exists():
        return None
    try:
        tok = load_tokenizer(cached)
    except (OSError, ValueError):
        return None
    dtype = _dtype(tok)
    if not _whole_cache(cached, dtype):
        return None
    try:  # `attnlab cache --clear` may take the entry away meanwhile: made again
        meta = json.loads((cached / "meta.json").read_text())
        train = np.memmap(cached / "train.bin", dtype=dtype, mode="r", shape=(meta["train"],))
        val = np.memmap(cached / "val.bin", dtype=dtype, mode="r", shape=(meta["val"],))
    except (OSError, ValueError):
        return None
    with contextlib.suppress(OSError):  # when it was last used (a read-only cache: not)
        os.utime(cached)
    return tok, train, val


def _whole_cache(cached: Path, dtype: type) -> bool:
    """Whether a cache entry's files hold the token counts its meta.json says."""
    try:
        meta = json.loads((cached / "meta.json").read_text())
        size = np.dtype(dtype).itemsize
        return all((cached / f"{split}.bin").stat().st_size == int(meta[split]) * size
                   for split in ("train", "val"))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _write_split(directory: Path, train: np.ndarray, val: np.ndarray, tok: Tokenizer,
                 dtype: type, about: dict[str, object]) -> None:
    # write to a temporary directory and rename, so an interrupted run leaves no half cache
    # unique across processes and machines that share the cache
    tmp = directory.with_name(f"{directory.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True, exist_ok=True)
    train.astype(dtype).tofile(tmp / "train.bin")
    val.astype(dtype).tofile(tmp / "val.bin")
    tok.save(tmp)
    meta = {"train": len(train), "val": len(val), **about}
    (tmp / "meta.json").write_text(json.dumps(meta))
    try:
        os.replace(tmp, directory)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not directory.exists():
            raise
        # another process cached the same text first (two runs, or torchrun's ranks): theirs


UNFINISHED_AGE_S = 3600  # a write of an entry takes seconds: one this old was cut short


@dataclass(frozen=True)
class CacheEntry:
    """One directory under cache_dir/data: a text's ids with their tokenizer, or what a write
    cut short or a removal cut short left (`unfinished`)."""

    path: Path
    size: int  # bytes on disk
    last_used: float  # seconds since the epoch: when a run last read it (or wrote it)
    tokenizer: str  # the spec it was made with (bpe:1024); older entries: the kind (bpe)
    source: str | None = None  # the text file's path, where the entry recorded it
    tokens: int | None = None  # train and val
    unfinished: bool = False


def cache_entries(root: Path) -> list[CacheEntry]:
    """The entries under `root/data`, the most recently used first."""
    data = root / "data"
    found = [_entry(path) for path in data.iterdir() if path.is_dir()] if data.is_dir() else []
    return sorted((e for e in found if e is not None), key=lambda e: -e.last_used)


def _entry(path: Path) -> CacheEntry | None:
    try:
        files = [f.stat() for f in path.iterdir()]
        last_used = path.stat().st_mtime
    except OSError:  # removed meanwhile
        return None
    size = sum(f.st_size for f in files)
    if not re.fullmatch(r"[0-9a-f]{20}", path.name):  # a temporary or a renamed-away one
        return CacheEntry(path, size, last_used, "?", unfinished=True)
    try:
        meta = json.loads((path / "meta.json").read_text())
        kind = json.loads((path / "tokenizer_config.json").read_text()).get("type", "?")
        tokens = int(meta["train"]) + int(meta["val"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return CacheEntry(path, size, last_used, "?", unfinished=True)
    return CacheEntry(path, size, last_used, str(meta.get("tokenizer", kind)),
                      meta.get("source"), tokens)


def removable(entry: CacheEntry, now: float | None = None) -> bool:
    """Whether an entry may be removed now: a write's temporary directory only an hour after
    its last change (a run may be writing it)."""
    age = (time.time() if now is None else now) - entry.last_used
    return ".tmp-" not in entry.path.name or age > UNFINISHED_AGE_S


def remove_entries(root: Path, entries: Iterable[CacheEntry]) -> list[tuple[Path, OSError]]:
    """Remove `entries` and the index files that name none; what could not be removed, with
    why. Safe while runs read them: each is renamed away first, so a run that opens it
    later finds none and makes it again, while one that holds its memmaps keeps reading the
    files it opened (POSIX frees them when the last map closes); then deleted."""
    failed: list[tuple[Path, OSError]] = []
    for entry in entries:
        gone = entry.path
        if ".del-" not in gone.name:
            gone = gone.with_name(f"{gone.name}.del-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(entry.path, gone)
            except FileNotFoundError:  # removed by another run or clear meanwhile
                continue
            except OSError as err:
                failed.append((entry.path, err))
                continue
        try:
            shutil.rmtree(gone)
        except OSError as err:  # e.g. a file still mapped, on Windows: left renamed away
            failed.append((entry.path, err))
    index = root / "data-index"
    for path in index.iterdir() if index.is_dir() else []:
        named = _indexed(root / "data", path)
        if named is None or not named.is_dir():  # names no entry: nothing reads it
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return failed
