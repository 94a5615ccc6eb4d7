"""Tokenizers: text <-> token ids, left-padded batches, and saving with a checkpoint.

Five kinds behind one `Tokenizer` interface (`loading.get_tokenizer(spec, text)` picks one):
    char          one id per character of the corpus (nanoGPT shakespeare_char)
    byte          256 ids, any text (UTF-8 bytes)
    word          words and punctuation with their leading space (" World", "!"), for
                  the hello-world and animals sentences
    bpe[:N]       byte-level BPE trained on the corpus with Hugging Face `tokenizers` [bpe extra]
    tiktoken:ENC  a tiktoken encoding (e.g. gpt2) when its files are cached offline
    PATH          a Hugging Face tokenizer.json, or a checkpoint directory (reuse its tokenizer)
This module knows nothing about models; `train/data.py` turns corpora into id arrays with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .pieces import GPT2_PIECE_CUT, PIECE_CUT, cuts_like_gpt2, text_pieces
from .token_bytes import bytes_text, chars_as_bytes, visible_controls

CONFIG_FILE = "tokenizer_config.json"
HF_FILE = "tokenizer.json"
EOT = "<|endoftext|>"
# a word or a punctuation mark, with the whitespace before it: "Hello", " World", "!"
WORD_PATTERN = re.compile(r"\s*\w+|\s*[^\w\s]|\s+$")


CONTEXT_IDS = 8  # ids of context decode_continuation decodes before the new ones


def check_fits(tokenizer: Any, vocab_size: int) -> None:
    """Raise when `tokenizer` (anything with a vocab_size) has more ids than a model's
    vocab_size: ids past it name no row, and the rest mean other text; the two come from
    different models."""
    if tokenizer.vocab_size > vocab_size:
        name = getattr(tokenizer, "name", type(tokenizer).__name__)
        raise ValueError(
            f"tokenizer {name!r} has {tokenizer.vocab_size} ids but the model's "
            f"vocab_size is {vocab_size}: they belong to different models; use the tokenizer "
            "saved with the model (load_checkpoint loads both)")


def token_text(tokenizer: Any, token_id: int) -> str:
    """One token's text alone (a predicted token's); one holding part of a character reads as
    its bytes ("<e6>", `Tokenizer.token_texts`) where the tokenizer can say, not as U+FFFD."""
    texts = getattr(tokenizer, "token_texts", None)
    return str(texts([token_id])[0]) if texts else str(tokenizer.decode([token_id]))


class Tokenizer(ABC):
    """Maps text to ids and back. Subclasses set `name`, `vocab_size`, `eot_id`, `pad_id`."""

    name: str
    vocab_size: int
    eot_id: int | None = None  # end-of-text id, if the vocabulary has one
    pad_id: int = 0  # id placed at padding positions (masked out, any valid id works)
    # ids below vocab_size that name no token (a tokenizer.json's holes): never sampled
    unused_ids: frozenset[int] = frozenset()
    # whether a text's `pieces.text_pieces`, encoded one by one, give the ids of the whole;
    # where they are cut (pieces.PIECE_CUT; GPT-2's regex and tiktoken's allow more)
    encodes_in_pieces: bool = False
    piece_cut: re.Pattern[str] = PIECE_CUT

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a generation: eot_id, or every EOS a Hugging Face directory lists
        (Llama 3.1 Instruct's generation_config: <|end_of_text|>, <|eom_id|>, <|eot_id|>)."""
        return () if self.eot_id is None else (self.eot_id,)

    @abstractmethod
    def encode(self, text: str) -> list[int]: ...

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str: ...

    @abstractmethod
    def _config(self) -> dict[str, Any]:
        """JSON-serialisable state for `save` (plus "type")."""

    def encode_pieces(self, pieces: Sequence[str]) -> list[list[int]]:
        """The ids of each of a text's `text_pieces` cut at `piece_cut` (where
        `encodes_in_pieces`)."""
        return [self.encode(piece) for piece in pieces]

    def encode_continuation(self, text: str) -> list[int]:
        """Ids of `text` as it reads after other text: without the BOS or other special
        tokens a tokenizer puts at the start of a sequence (a patching answer, one token)."""
        return self.encode(text)

    def decode_continuation(self, ids: Sequence[int], context: Sequence[int]) -> str:
        """The text `ids` add after `context` (the ids before them, e.g. the prompt).

        Decoded after the last few context ids and cut after their text: sentencepiece
        tokenizers (Llama 2, Mistral) drop the space of a "▁Paris" that starts a text, so
        decoding a completion alone gives "isParis" where the model wrote "is Paris"."""
        start = max(0, len(context) - CONTEXT_IDS)
        # Not from inside a character: a byte-fallback decoder (Llama 2, Mistral) writes a
        # whole run of <0xNN> tokens as U+FFFD when the run's bytes are not UTF-8, so a
        # window opening on 日's last byte turned the 本 after it into "���".
        for _ in range(3):  # a character has at most 3 bytes after its first
            first = self.token_bytes(context[start]) if start > 0 else None
            if not first or not 0x80 <= first[0] < 0xC0:
                break
            start -= 1
        tail = list(context[start:])
        if not tail:
            return self.decode(ids)
        before, text = self.decode(tail), self.decode([*tail, *ids])
        return text[len(before):] if text.startswith(before) else self.decode(ids)

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """Each token's text as it reads in `ids`: decoded after the ids before it, so a
        sentencepiece "▁Paris" keeps the space that decoding it alone drops. A token holding
        part of a character (decoded as U+FFFD, or as nothing) reads as its bytes: "日" in
        three byte tokens is "<e6>", "<97>", "<a5>"."""
        texts = []
        for k, i in enumerate(ids):
            text = self.decode_continuation([i], ids[max(0, k - CONTEXT_IDS):k])
            data = self.token_bytes(i) if "\ufffd" in text or not text else None
            texts.append(bytes_text(data) if data else text)
        return texts

    def token_bytes(self, token_id: int) -> bytes | None:
        """The bytes one token stands for, where the tokenizer knows them (else None)."""
        return None

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """One display string per token, for heatmap axes (" World", "\\n")."""
        return [visible_controls(text) for text in self.token_texts(ids)]

    def encode_batch(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Left-padded (input_ids, attention_mask), both (B, T) long; mask 1 = token, 0 = pad.

        Left padding keeps every row's last token in the last column, so generation appends
        to all rows at once (as Hugging Face's `padding_side="left"`).
        """
        if not texts:
            raise ValueError("encode_batch needs at least one text")
        rows = [self.encode(t) for t in texts]
        T = max(1, max(len(r) for r in rows))
        input_ids = torch.full((len(rows), T), self.pad_id, dtype=torch.long)  # (B, T)
        attention_mask = torch.zeros(len(rows), T, dtype=torch.long)  # (B, T)
        for b, row in enumerate(rows):
            if row:
                input_ids[b, T - len(row):] = torch.tensor(row, dtype=torch.long)
                attention_mask[b, T - len(row):] = 1
        return input_ids, attention_mask

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = {"type": self.name.split(":")[0], **self._config()}
        (directory / CONFIG_FILE).write_text(json.dumps(config, ensure_ascii=False))

    def identity(self) -> str:
        """A short hash of the tokenizer's state, to key caches of encoded data."""
        blob = json.dumps({"type": self.name, **self._config()}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


class CannotEncode(ValueError):
    """Text with a character or word outside a vocabulary built from training text. `what`
    says where; the message adds the advice, which a caller that knows more (the model's
    tokenizer is fixed, say) replaces."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}; it is not in the vocabulary built from the training text. "
                         "Remove it from the input, or train with a tokenizer that covers "
                         "every character (byte or bpe)")
        self.what = what


def _unknown(kind: str, text: str, position: int, what: str) -> CannotEncode:
    context = text[max(0, position - 10): position + 10]
    return CannotEncode(f"{kind} tokenizer cannot encode {what} at position {position} "
                        f"(near {context!r})")


def _check_ids(kind: str, ids: Sequence[int], vocab_size: int) -> None:
    bad = next((i for i in ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise ValueError(
            f"{kind} tokenizer cannot decode id {bad}: its ids are 0..{vocab_size - 1}. The ids "
            "come from a model with a larger vocabulary, or are not this tokenizer's"
        )


def _utf8(kind: str, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{kind} tokenizer cannot encode {text[err.start]!r} at position {err.start}: a lone "
            "surrogate is not Unicode text and has no UTF-8 bytes (text decoded with "
            "errors='surrogateescape'?); decode the input with errors='replace'"
        ) from None


class CharTokenizer(Tokenizer):
    def __init__(self, chars: Sequence[str]) -> None:
        if not chars:
            raise ValueError("a char tokenizer needs at least one character; the text is empty")
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.name, self.vocab_size = "char", len(self.chars)
        self.encodes_in_pieces = True

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError:
            pos = next(i for i, c in enumerate(text) if c not in self.stoi)
            raise _unknown("char", text, pos, f"character {text[pos]!r}") from None

    def decode(self, ids: Sequence[int]) -> str:
        _check_ids("char", ids, self.vocab_size)
        return "".join(self.chars[i] for i in ids)

    def _config(self) -> dict[str, Any]:
        return {"chars": self.chars}


class ByteTokenizer(Tokenizer):
    name, vocab_size, encodes_in_pieces = "byte", 256, True

    def encode(self, text: str) -> list[int]:
        return list(_utf8("byte", text))

    def decode(self, ids: Sequence[int]) -> str:
        _check_ids("byte", ids, 256)
        return bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes | None:
        return bytes([token_id])

    def pieces(self, ids: Sequence[int]) -> list[str]:
        _check_ids("byte", ids, 256)
        return [visible_controls(chr(i)) if 32 <= i < 127 or i in (9, 10, 13) else f"<{i:02x}>"
                for i in ids]

    def _config(self) -> dict[str, Any]:
        return {}


class WordTokenizer(Tokenizer):
    """Words and punctuation keeping their leading space, like GPT-2's " World"."""

    def __init__(self, words: Sequence[str]) -> None:
        if not words:
            raise ValueError("a word tokenizer needs at least one word; the text is empty")
        self.words = list(words)
        self.stoi = {w: i for i, w in enumerate(self.words)}
        self.name, self.vocab_size = "word", len(self.words)
        self.encodes_in_pieces = True

    @classmethod
    def from_text(cls, text: str) -> WordTokenizer:
        words: set[str] = set()
        for piece in text_pieces(text):  # a list of every word of a long text held ~60 B a char
            words.update(WORD_PATTERN.findall(piece))
        return cls(sorted(words))

    def encode(self, text: str) -> list[int]:
        ids, pos = [], 0
        for match in WORD_PATTERN.finditer(text):
            word = match.group()
            if word not in self.stoi:
                raise _unknown("word", text, match.start(), f"word {word!r}")
            ids.append(self.stoi[word])
            pos = match.end()
        if pos != len(text) and text[pos:].strip():
            raise _unknown("word", text, pos, f"text {text[pos:]!r}")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        _check_ids("word", ids, self.vocab_size)
        return "".join(self.words[i] for i in ids)

    def _config(self) -> dict[str, Any]:
        return {"words": self.words}


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` tokenizer (trained byte-level BPE or a tokenizer.json)."""

    piece_cut = GPT2_PIECE_CUT  # where it encodes in pieces: cuts_like_gpt2

    def __init__(self, backend: Any, name: str = "bpe") -> None:
        self.backend = backend
        # ids run to the largest one in the vocabulary, added tokens included; a
        # tokenizer.json may leave holes below it, so its token count (get_vocab_size) can
        # be smaller than that and would refuse real ids
        ids = set(backend.get_vocab(with_added_tokens=True).values())
        self.name, self.vocab_size = name, max(ids, default=-1) + 1
        # ids naming no token (none in a vocabulary numbered 0..n-1, nearly every one)
        self.unused_ids = frozenset(range(self.vocab_size)) - ids if len(ids) < self.vocab_size \
            else frozenset()
        # byte-level BPE (GPT-2, Qwen, Pythia): a token's characters stand for bytes
        decoder = backend.decoder
        self._byte_level = decoder is not None and '"ByteLevel"' in str(decoder.__getstate__())
        eot = backend.token_to_id(EOT)
        self.eot_id = eot
        self.pad_id = eot if eot is not None else 0

    @property
    def encodes_in_pieces(self) -> bool:  # type: ignore[override]
        # not where a subclass's encode adds to the text (a directory's BOS): each piece would
        return type(self).encode is HFTokenizer.encode and cuts_like_gpt2(self.backend)

    @classmethod
    def train(cls, text: str, vocab_size: int = 512) -> HFTokenizer:
        tk = import_tokenizers()
        if vocab_size < 257:
            raise ValueError(f"bpe vocab_size={vocab_size} must be >= 257 (256 bytes + <eot>)")
        backend = tk.Tokenizer(tk.models.BPE())
        backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = tk.decoders.ByteLevel()
        trainer = tk.trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
            initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        )
        # pieces, not the text's lines: a list of them took ~100 bytes a character, and a cut
        # before a line's leading spaces made words that encoding the text never makes
        backend.train_from_iterator(text_pieces(text, cut=GPT2_PIECE_CUT), trainer=trainer)
        return cls(backend)

    @classmethod
    def from_file(cls, path: str | Path) -> HFTokenizer:
        tk = import_tokenizers()
        if not Path(path).is_file():
            raise FileNotFoundError(f"no tokenizer file {path}")
        try:
            backend = tk.Tokenizer.from_file(str(path))
        except Exception as err:  # the Rust side raises plain Exception for any parse error
            raise ValueError(f"{path} is not a valid tokenizer.json ({err}): corrupted?") from err
        return cls(backend, name=f"hf:{Path(path).name}")

    def encode(self, text: str) -> list[int]:
        return self._encode(text, special=True)

    def encode_pieces(self, pieces: Sequence[str]) -> list[list[int]]:
        for piece in pieces:
            _utf8(self.name, piece)
        # in parallel; encode_batch_fast (tokenizers 0.20+) keeps no offsets
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        try:
            return [list(encoding.ids) for encoding in encode(list(pieces))]
        except Exception:  # the Rust side's bare Exception: `_encode` names the piece
            for piece in pieces:
                self._encode(piece, special=True)
            raise

    def encode_continuation(self, text: str) -> list[int]:
        # no post-processor template (Llama 3's tokenizer.json adds <|begin_of_text|>)
        return self._encode(text, special=False)

    def _encode(self, text: str, special: bool) -> list[int]:
        _utf8(self.name, text)  # the Rust side takes only valid Unicode (TypeError otherwise)
        try:
            return list(self.backend.encode(text, add_special_tokens=special).ids)
        except Exception as err:  # e.g. a word-level vocabulary without an unknown token
            raise ValueError(f"the {self.name} tokenizer cannot encode {text[:80]!r}: {err}; "
                             "use only text its vocabulary covers") from None

    def decode(self, ids: Sequence[int]) -> str:
        _check_ids(self.name, ids, self.vocab_size)  # unknown ids would vanish silently
        unused = self.unused_ids
        hole = next((i for i in ids if i in unused), None) if unused else None
        if hole is not None:
            raise ValueError(f"{self.name} tokenizer cannot decode id {hole}: its vocabulary "
                             f"has no token with that id (ids 0..{self.vocab_size - 1} have "
                             f"{len(unused)} such holes)")
        return str(self.backend.decode(list(ids), skip_special_tokens=False))

    def token_bytes(self, token_id: int) -> bytes | None:
        piece = self.backend.id_to_token(token_id)
        if piece is None:
            return None
        fallback = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)  # sentencepiece byte_fallback
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        byte_of = chars_as_bytes()
        if self._byte_level and all(c in byte_of for c in piece):
            return bytes(byte_of[c] for c in piece)
        return None

    def save(self, directory: str | Path) -> None:
        super().save(directory)
        self.backend.save(str(Path(directory) / HF_FILE))

    def _config(self) -> dict[str, Any]:
        return {"hf_name": self.name, "vocab_size": self.vocab_size}

    def identity(self) -> str:
        return hashlib.sha256(self.backend.to_str().encode()).hexdigest()[:16]


# tiktoken's cache file for a blob is sha1(url) in its cache dir; checking for it first
# means a missing file gives our message instead of a network timeout.
_TIKTOKEN_BLOBS = {
    "gpt2": [
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
    ],
    "r50k_base": ["https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"],
    "p50k_base": ["https://openaipublic.blob.core.windows.net/encodings/p50k_base.tiktoken"],
    "cl100k_base": ["https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"],
    "o200k_base": ["https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"],
}


def _tiktoken_cache_dir() -> Path:
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return Path(tempfile.gettempdir()) / "data-gym-cache"


class TiktokenTokenizer(Tokenizer):
    def __init__(self, encoding: str) -> None:
        if encoding not in _TIKTOKEN_BLOBS:
            raise ValueError(
                f"unknown tiktoken encoding {encoding!r}; known: {sorted(_TIKTOKEN_BLOBS)}"
            )
        cache = _tiktoken_cache_dir()
        missing = [
            f"{url.rsplit('/', 1)[1]} -> {cache / hashlib.sha1(url.encode()).hexdigest()}"
            for url in _TIKTOKEN_BLOBS[encoding]
            if not (cache / hashlib.sha1(url.encode()).hexdigest()).exists()
        ]
        if missing:
            raise FileNotFoundError(
                f"tiktoken encoding {encoding!r} needs its BPE files offline and they are not "
                f"cached: {'; '.join(missing)}. Copy them there from a machine that has them "
                "(or set TIKTOKEN_CACHE_DIR to a folder holding them), or use an offline "
                "tokenizer: --tokenizer word, char, byte or bpe"
            )
        try:
            import tiktoken
        except ImportError as err:
            raise ImportError("tiktoken is missing: pip install 'attnlab[bpe]'") from err
        self.encoding = tiktoken.get_encoding(encoding)
        self.name, self.vocab_size = f"tiktoken:{encoding}", self.encoding.n_vocab
        self.eot_id = self.pad_id = self.encoding.eot_token
        # gpt2's (r50k, p50k), cl100k's and o200k's words end at a pieces.GPT2_PIECE_CUT
        self.encodes_in_pieces, self.piece_cut = True, GPT2_PIECE_CUT

    def encode(self, text: str) -> list[int]:
        return list(self.encoding.encode(text, allowed_special={EOT}))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.encoding.decode(list(ids)))

    def _config(self) -> dict[str, Any]:
        return {"encoding": self.name.split(":", 1)[1]}


def import_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as err:
        raise ImportError(
            "the Hugging Face tokenizers package is missing: pip install 'attnlab[bpe]'"
        ) from err
    return tokenizers
