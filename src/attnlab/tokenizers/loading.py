"""Which tokenizer a name or a directory means: `get_tokenizer(spec, text)` builds one,
`load_tokenizer(directory)` reads what `Tokenizer.save` wrote or a Hugging Face directory's."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .core import (
    CONFIG_FILE,
    HF_FILE,
    ByteTokenizer,
    CharTokenizer,
    HFTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    WordTokenizer,
)
from .hf_dir import HFDirTokenizer, is_hf_dir, load_hf_tokenizer, read_hf_config

BPE_VOCAB = 512  # a bpe spec's vocabulary size when it names none


def named_spec(spec: str) -> str | None:
    """`spec` spelt one way ("bpe" is "bpe:512") where it names a kind of tokenizer, which the
    spec and the training text fix: char, word, bpe:N, byte, tiktoken:ENC. None for a path,
    whose file can change under the same name. Raises for a bpe size that is no number."""
    kind, _, arg = spec.partition(":")
    if kind in ("char", "word", "byte"):
        return kind
    if kind == "bpe":
        try:
            return f"bpe:{int(arg) if arg else BPE_VOCAB}"
        except ValueError:
            raise ValueError(f"bad bpe vocab size {arg!r} in {spec!r}; e.g. bpe:1024") from None
    return f"tiktoken:{arg or 'gpt2'}" if kind == "tiktoken" else None


def get_tokenizer(spec: str, text: str | None = None) -> Tokenizer:
    """Build a tokenizer from a spec (see the module docstring); `text` trains corpus-based ones."""
    kind, _, arg = (named_spec(spec) or spec).partition(":")
    if kind in ("char", "word", "bpe"):
        if text is None:
            raise ValueError(f"the {kind!r} tokenizer is built from the training text; pass text")
        if kind == "char":
            return CharTokenizer.from_text(text)
        if kind == "word":
            return WordTokenizer.from_text(text)
        return HFTokenizer.train(text, int(arg))
    if kind == "byte":
        return ByteTokenizer()
    if kind == "tiktoken":
        return TiktokenTokenizer(arg)
    path = Path(spec)
    if path.is_dir() and not (path / CONFIG_FILE).exists() and (path / "ckpt").is_dir():
        path = path / "ckpt"  # a run directory stands for its checkpoint, as in every command
    if path.is_dir() and (path / CONFIG_FILE).exists():  # an attnlab checkpoint's tokenizer
        return load_tokenizer(path)
    if path.is_dir() and (path / HF_FILE).exists():
        path = path / HF_FILE
    if path.suffix == ".json" and path.exists():
        return HFTokenizer.from_file(path)
    if path.suffix == ".json" or os.sep in spec or "/" in spec:  # meant as a path
        raise ValueError(f"tokenizer {spec!r}: no tokenizer.json, checkpoint or Hugging Face "
                         "model directory there (check the path)")
    raise ValueError(
        f"unknown tokenizer {spec!r}; use char, byte, word, bpe[:N], tiktoken:ENCODING, the "
        "path of a Hugging Face tokenizer.json, or a checkpoint directory to reuse its tokenizer"
    )


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """Load what `Tokenizer.save(directory)` wrote, or the tokenizer of a Hugging Face model
    directory (`load_hf_tokenizer`: tokenizer.json with its BOS/EOS)."""
    directory = Path(directory)
    path = directory / CONFIG_FILE
    # transformers writes a tokenizer_config.json too, without attnlab's "type": read as
    # attnlab's, it would be "corrupted or not written by attnlab" (load_tokenizer("smollm"))
    if is_hf_dir(directory):
        vocab = read_hf_config(directory).get("vocab_size")
        return load_hf_tokenizer(directory, vocab if isinstance(vocab, int) else None)
    if not path.exists():
        raise FileNotFoundError(
            f"{directory} has no {CONFIG_FILE}, so it holds no tokenizer: pass a directory "
            "Tokenizer.save wrote (every attnlab checkpoint holds one) or a Hugging Face model "
            "directory with tokenizer.json")
    try:  # a damaged file gets one ValueError naming it, whatever part of it broke
        config = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise TypeError(f"expected a JSON object, got {type(config).__name__}")
        return _from_config(directory, config)
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"{path} is not a valid tokenizer config ({type(err).__name__}: {err}); the "
            "checkpoint is corrupted or was not written by attnlab"
        ) from err


def _strings(config: dict[str, Any], key: str) -> list[str]:
    values = config[key]
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise TypeError(f"{key!r} must be a list of strings")
    return values


def _from_config(directory: Path, config: dict[str, Any]) -> Tokenizer:
    kind = config.get("type")
    if kind == "char":
        return CharTokenizer(_strings(config, "chars"))
    if kind == "word":
        return WordTokenizer(_strings(config, "words"))
    if kind == "byte":
        return ByteTokenizer()
    if kind == "tiktoken":
        return TiktokenTokenizer(str(config["encoding"]))
    if kind in ("bpe", "hf"):
        tokenizer = HFTokenizer.from_file(directory / HF_FILE)
        tokenizer.name = str(config.get("hf_name", kind))
        if config.get("special") is None:
            return tokenizer
        return HFDirTokenizer.from_saved(tokenizer, config)
    raise ValueError(f"unknown tokenizer type {kind!r}; expected char, word, byte, bpe or tiktoken")
