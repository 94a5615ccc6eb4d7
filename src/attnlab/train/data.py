"""Data: text or a built-in task -> batches of (input ids, next-token targets).

Three kinds of dataset share one interface, `Dataset.batch(split, batch_size, block_size,
generator) -> (x, y)` with x, y (B, T) long and y == -1 where no loss is wanted:
    TextDataset      a text file or a directory of .txt files, tokenized once to a uint16/
                     uint32 memmap cached with its tokenizer under the text's hash and the
                     tokenizer spec, random windows (nanoGPT)
    SentenceDataset  the hello-world and animals sentences (`hello`, `animals`), the whole
                     set every batch
    TaskDataset      synthetic tasks only attention can solve, generated on the fly:
                     `copy` (induction), `recall` (associative recall), `reverse`
Batches draw randomness only from the generator passed in, so a resumed run sees the same
batches. Training policy lives in `loop.py`.
"""

from __future__ import annotations

import math
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..model.config import GPTConfig
from ..tokenizers import (
    CharTokenizer,
    Tokenizer,
    WordTokenizer,
)
from .token_cache import Progress, Training, text_hash, token_cache

SENTENCES: dict[str, list[str]] = {
    "hello": ["Hello World!"],
    "animals": [
        "The dog is an animal",
        "The human is a person",
        "The rock is a mineral",
        "The tree is a plant",
        "The car is a vehicle",
        "The sun is a star",
    ],
}
TASKS = ("copy", "recall", "reverse")
BUILTINS = (*SENTENCES, *TASKS)


def default_cache_dir() -> Path:
    return Path(os.environ.get("ATTNLAB_CACHE", Path.home() / ".cache" / "attnlab"))


class Dataset(ABC):
    name: str
    tokenizer: Tokenizer

    @abstractmethod
    def batch(
        self, split: str, batch_size: int, block_size: int, generator: torch.Generator,
        rows: slice = slice(None),
    ) -> tuple[Tensor, Tensor]:
        """x (B, T), y (B, T): y[:, t] is the token after x[:, t], or -1 (ignored).

        rows: the part of the batch to return (one process's share under torchrun); the
        generator advances as for the whole batch, so every process stays in step.
        """

    @property
    @abstractmethod
    def max_block_size(self) -> int:
        """Longest context this dataset can fill."""

    def describe(self) -> str:
        return f"{self.name} ({self.tokenizer.name} tokenizer, {self.tokenizer.vocab_size} ids)"

    def __repr__(self) -> str:  # the default named only the class and an address
        return f"<{type(self).__name__} {self.describe()}{self._sizes()}>"

    def _sizes(self) -> str:
        """What follows the description in the repr: how much data there is."""
        return ""

    def bytes_per_token(self, split: str) -> float | None:
        """UTF-8 bytes of text per token in `split`, which turns a loss per token into bits
        per byte; None where the loss is not over the whole text (tasks score answers only)."""
        return None


def bits_per_byte(loss: float, bytes_per_token: float | None) -> float | None:
    """A mean loss in nats per token as bits per byte of text. Losses per token of
    different tokenizers are not comparable (a BPE token holds several characters); bits
    per byte of the same text are."""
    if bytes_per_token is None:
        return None
    return loss / math.log(2) / bytes_per_token


# ----------------------------------------------------------------------------- text


def read_text(path: str | Path) -> str:
    """A text file, or every .txt file under a directory, its subdirectories included
    (sorted by path, joined by newlines)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.rglob("*.txt"))
        if not files:
            raise ValueError(f"directory {path} holds no .txt files; point --data at text")
        text = "\n".join(_read_utf8(f) for f in files)
    elif path.is_file():
        text = _read_utf8(path)
    elif path.exists():  # /dev/zero, a FIFO, a socket: reading one might never end
        kind = "a device" if path.is_char_device() or path.is_block_device() else \
            "a FIFO" if path.is_fifo() else "not a regular file"
        raise ValueError(f"data {path} is {kind}, not a regular file; pass a text file, a "
                         "directory of .txt files, or a built-in dataset")
    else:
        raise FileNotFoundError(
            f"data file {path} does not exist; pass a text file, a directory of .txt files, "
            f"or a built-in dataset ({', '.join(BUILTINS)})"
        )
    if not text.strip():
        raise ValueError(f"data {path} is empty; it needs some text to train on")
    return text


def _read_utf8(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err}); convert it first") from err


class TextDataset(Dataset):
    def __init__(self, name: str, tokenizer: Tokenizer, train: np.ndarray, val: np.ndarray,
                 *, source: str | None = None, fingerprint: str | None = None):
        self.name, self.tokenizer, self.train, self.val = name, tokenizer, train, val
        # from_file: the path read (absolute) and a hash of its text, which checkpoints keep
        # so a resume finds the data and knows it is the same text
        self.source, self.fingerprint = source, fingerprint

    def _sizes(self) -> str:
        return f": {len(self.train):,} train + {len(self.val):,} val tokens"

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        tokenizer: str | Tokenizer = "char",
        *,
        val_fraction: float = 0.1,
        cache_dir: str | Path | None = None,
        progress: Progress | None = None,
        training: Training | None = None,
    ) -> TextDataset:
        """Tokenize once to `cache_dir/data/<key>/{train,val}.bin`, the tokenizer beside them;
        later calls reuse the files (token_cache.py). progress(characters encoded, characters
        in all) hears while a text is encoded; training(spec, characters) before a tokenizer
        (char, word, bpe:N) is trained on it. A cached text hears neither."""
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction={val_fraction} must be in (0, 1)")
        text = read_text(path)
        fingerprint = text_hash(text)  # the text alone
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        source = str(Path(path).resolve())
        cached_tok, train, val = token_cache(root, tokenizer, text, fingerprint, val_fraction,
                                             progress, training, source)
        # checked on what is read, cached or not (a cache written before this check held one)
        first = train[0]
        if (train == first).all() and (val == first).all():  # e.g. a file of NUL bytes
            raise ValueError(
                f"data {path} is {len(train) + len(val):,} tokens of only 1 distinct one "
                f"({cached_tok.decode([int(first)])!r}); a model learns nothing from it. "
                "Is it a text file? Train on text with at least 2 different tokens"
            )
        return cls(Path(path).name, cached_tok if isinstance(tokenizer, str) else tokenizer,
                   train, val, source=source, fingerprint=fingerprint)

    @property
    def max_block_size(self) -> int:
        return min(len(self.train), len(self.val)) - 1

    def bytes_per_token(self, split: str) -> float | None:
        cache = self.__dict__.setdefault("_bytes_per_token", {})
        if split not in cache:
            ids = (self.train if split == "train" else self.val)[:200_000]  # a sample suffices
            text = self.tokenizer.decode(ids.tolist())
            cache[split] = len(text.encode("utf-8")) / max(1, len(ids))
        return float(cache[split])

    def batch(
        self, split: str, batch_size: int, block_size: int, generator: torch.Generator,
        rows: slice = slice(None),
    ) -> tuple[Tensor, Tensor]:
        ids = self.train if split == "train" else self.val
        if block_size > len(ids) - 1:
            raise ValueError(
                f"block_size={block_size} needs at least {block_size + 1} tokens but the "
                f"{split} split has {len(ids)}; use a smaller --block_size or more text"
            )
        starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)
        window = starts[rows].numpy()[:, None] + np.arange(block_size + 1)  # (B, T + 1)
        chunk = torch.from_numpy(ids[window].astype(np.int64))  # (B, T + 1)
        return chunk[:, :-1], chunk[:, 1:]  # (B, T), (B, T)


# ------------------------------------------------------------------------ sentences


class SentenceDataset(Dataset):
    """Toy sentences (hello-world, animals): every batch is all sentences, targets the next
    word."""

    def __init__(self, name: str, sentences: Sequence[str]) -> None:
        self.name, self.sentences = name, list(sentences)
        self.tokenizer = WordTokenizer.from_text(" ".join(self.sentences))
        rows = [self.tokenizer.encode(s) for s in self.sentences]
        if len({len(r) for r in rows}) != 1:
            raise ValueError(f"sentences of {name!r} must have equal token counts, got {rows}")
        self.ids = torch.tensor(rows, dtype=torch.long)  # (N, L)

    @property
    def max_block_size(self) -> int:
        return self.ids.shape[1] - 1

    def batch(
        self, split: str, batch_size: int, block_size: int, generator: torch.Generator,
        rows: slice = slice(None),
    ) -> tuple[Tensor, Tensor]:
        # the seed trains and evaluates on the same handful of sentences: no split exists
        return self.ids[rows, :-1], self.ids[rows, 1:]  # (N, L-1), (N, L-1)

    def last_word_predictions(self, predicted_ids: Tensor) -> list[tuple[str, str, str]]:
        """(prompt, expected last word, predicted) per sentence, from ids (N,) at position -1."""
        return [
            (self.tokenizer.decode(row[:-1].tolist()), self.tokenizer.decode([int(row[-1])]),
             self.tokenizer.decode([int(p)]))
            for row, p in zip(self.ids, predicted_ids, strict=True)
        ]


# ---------------------------------------------------------------------------- tasks

_SYMBOLS = "abcdefghijklmnopqrstuvwxyz"
_DIGITS = "0123456789"


class TaskDataset(Dataset):
    """Synthetic tasks as text, so samples read naturally; loss only on the answer tokens.

    copy     "qhdkwzpa|qhdkwzpa": repeat the sequence after the bar (an induction head:
             look up the earlier copy of the current token and predict what followed it)
    recall   "a3k7m1x9?k7": key-digit pairs, then a query key; answer its digit
    reverse  "qhdkw|wkdhq": the sequence backwards
    """

    def __init__(self, name: str, length: int = 8) -> None:
        if name not in TASKS:
            raise ValueError(f"unknown task {name!r}; known tasks: {TASKS}")
        if not 1 <= length <= 26:
            raise ValueError(f"task length={length} must be in [1, 26]")
        self.name, self.length = name, length
        self.tokenizer = CharTokenizer(sorted(_SYMBOLS + _DIGITS + "|?"))

    def _sizes(self) -> str:
        return f": length {self.length}, examples of {self.sample_len} tokens"

    @property
    def sample_len(self) -> int:
        return 2 * self.length + 1 if self.name != "recall" else 2 * self.length + 3

    @property
    def max_block_size(self) -> int:
        return self.sample_len - 1

    def sample(self, generator: torch.Generator) -> tuple[str, str]:
        """(prompt, answer) text for one example."""
        n = self.length
        perm = torch.randperm(26, generator=generator)[:n].tolist()
        seq = "".join(_SYMBOLS[i] for i in perm)
        if self.name == "copy":
            return seq + "|", seq
        if self.name == "reverse":
            return seq + "|", seq[::-1]
        digits = torch.randint(10, (n,), generator=generator).tolist()
        pairs = "".join(k + _DIGITS[d] for k, d in zip(seq, digits, strict=True))
        q = int(torch.randint(n, (1,), generator=generator))
        return pairs + "?" + seq[q], _DIGITS[digits[q]]

    def batch(
        self, split: str, batch_size: int, block_size: int, generator: torch.Generator,
        rows: slice = slice(None),
    ) -> tuple[Tensor, Tensor]:
        if block_size < self.max_block_size:
            raise ValueError(
                f"task {self.name!r} with length {self.length} needs block_size >= "
                f"{self.max_block_size}, got {block_size}"
            )
        xs, ys = [], []
        for _ in range(batch_size):
            prompt, answer = self.sample(generator)
            ids = self.tokenizer.encode(prompt + answer)
            xs.append(ids[:-1])
            # loss only where the next token is part of the answer
            ys.append([-1] * (len(prompt) - 1) + ids[len(prompt):])
        return torch.tensor(xs[rows]), torch.tensor(ys[rows])  # (B, L - 1), (B, L - 1)


def load_dataset(
    source: str,
    tokenizer: str = "char",
    *,
    val_fraction: float = 0.1,
    cache_dir: str | Path | None = None,
    progress: Progress | None = None,
    training: Training | None = None,
) -> Dataset:
    """A built-in name (hello, animals, copy, recall, reverse) or a path to text
    (`TextDataset.from_file`, which `progress` and `training` are for)."""
    if source in SENTENCES:
        return SentenceDataset(source, SENTENCES[source])
    if source in TASKS:
        return TaskDataset(source)
    return TextDataset.from_file(source, tokenizer, val_fraction=val_fraction,
                                 cache_dir=cache_dir, progress=progress, training=training)


def sequence_length(model_config: GPTConfig, dataset: Dataset, seq_len: int | None = None) -> int:
    """Training context: `seq_len` or else the model's block_size on text, a task's own
    length otherwise."""
    if isinstance(dataset, (SentenceDataset, TaskDataset)):
        needed = dataset.max_block_size
        if needed > model_config.block_size:
            raise ValueError(
                f"dataset {dataset.name!r} needs block_size >= {needed}, the model has "
                f"{model_config.block_size}; pass --block_size {needed}"
            )
        if seq_len is not None and seq_len != needed:
            raise ValueError(f"seq_len={seq_len}: dataset {dataset.name!r} trains on its own "
                             f"{needed}-token examples; drop --seq_len (it is for text data)")
        return needed
    if dataset.max_block_size < 1:  # "hello world": one token of validation text
        raise ValueError(
            f"data {dataset.name!r} is too short to train on: its smaller split has "
            f"{dataset.max_block_size + 1} token(s), and a sequence needs at least 2 (one to "
            "read, one to predict); give it more text (a few thousand characters at least)"
        )
    if seq_len is not None and seq_len > model_config.block_size:
        raise ValueError(f"seq_len={seq_len} is longer than the model's context "
                         f"(block_size={model_config.block_size}); use --seq_len "
                         f"{model_config.block_size} or less")
    length = model_config.block_size if seq_len is None else seq_len
    flag = "--block_size" if seq_len is None else "--seq_len"
    if length > dataset.max_block_size:
        raise ValueError(
            f"{flag.removeprefix('--')}={length} is larger than the data allows "
            f"({dataset.max_block_size + 1} tokens in the smaller split); use {flag} "
            f"{max(1, dataset.max_block_size)} or less, or more text"
        )
    return length
