"""The token cache of `TextDataset.from_file` (data.py): a text's ids, tokenized once into
`cache_dir/data/<key>/{train,val}.bin` with the tokenizer beside them, read back as memmaps.

An entry's key hashes the tokenizer itself, the validation fraction and the text; a named
spec's index file (`cache_dir/data-index/<key>`) names the entry of that spec, text and
fraction, so a later run finds it before it builds a tokenizer (trains a BPE on all the text
again). Entries are written to a temporary directory and renamed into place: an interrupted
run leaves no half entry, and a damaged one is made again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
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
    progress: Progress | None, training: Training | None = None,
) -> tuple[Tokenizer, np.ndarray, np.ndarray]:
    """The tokenizer and the train and val ids of `text`, from `root/data/<key>`, made there
    if it holds none. The key is the tokenizer's own hash with val_fraction and the text's, so
    a spec, a checkpoint's copy of its tokenizer (a resume) and a Tokenizer share an entry. A
    named spec (char, word, bpe:N, byte, tiktoken:ENC) fixes the tokenizer given the text, so
    `root/data-index/<spec key>` names its entry: found before a tokenizer is built (a bpe
    trained on all the text again). Only where no entry is found: `training(spec,
    characters)` hears before a tokenizer is trained on the text, `progress(characters
    encoded, characters)` while it is encoded."""
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
        _write_split(cached, ids[: len(ids) - n_val], ids[len(ids) - n_val:], tok, dtype)
        del ids
        opened = _open_cache(cached)
        if opened is None:
            raise RuntimeError(f"the token cache {cached}, just written, does not read back "
                               "(a full disk?); remove it and run again")
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
    meta = json.loads((cached / "meta.json").read_text())
    train = np.memmap(cached / "train.bin", dtype=dtype, mode="r", shape=(meta["train"],))
    val = np.memmap(cached / "val.bin", dtype=dtype, mode="r", shape=(meta["val"],))
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


def _write_split(
    directory: Path, train: np.ndarray, val: np.ndarray, tok: Tokenizer, dtype: type
) -> None:
    # write to a temporary directory and rename, so an interrupted run leaves no half cache
    # unique across processes and machines that share the cache
    tmp = directory.with_name(f"{directory.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True, exist_ok=True)
    train.astype(dtype).tofile(tmp / "train.bin")
    val.astype(dtype).tofile(tmp / "val.bin")
    tok.save(tmp)
    (tmp / "meta.json").write_text(json.dumps({"train": len(train), "val": len(val)}))
    try:
        os.replace(tmp, directory)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not directory.exists():
            raise
        # another process cached the same text first (two runs, or torchrun's ranks): theirs
