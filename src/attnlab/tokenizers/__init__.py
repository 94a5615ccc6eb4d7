"""Tokenizers: text <-> token ids, and everything a tokenizer comes with.

`core.py` holds the `Tokenizer` interface and its kinds (char, byte, word, BPE through the
Hugging Face `tokenizers` package, tiktoken); `loading.py` picks one by name or reads one
from a directory; `hf_dir.py` reads a Hugging Face model directory's tokenizer with its
special tokens, `chat.py` renders its chat template; `token_bytes.py` labels tokens that
hold part of a UTF-8 character; `streaming.py` turns a generation's new ids into new text as
they come (whole characters, stop strings).
"""

from .core import (
    EOT,
    ByteTokenizer,
    CannotEncode,
    CharTokenizer,
    HFTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    WordTokenizer,
    check_fits,
    token_text,
)
from .hf_dir import HFDirTokenizer, NoTokenizerError, is_hf_dir, load_hf_tokenizer, read_hf_config
from .loading import get_tokenizer, load_tokenizer

__all__ = [
    "EOT",
    "ByteTokenizer",
    "CannotEncode",
    "CharTokenizer",
    "HFDirTokenizer",
    "HFTokenizer",
    "NoTokenizerError",
    "TiktokenTokenizer",
    "Tokenizer",
    "WordTokenizer",
    "check_fits",
    "get_tokenizer",
    "is_hf_dir",
    "load_hf_tokenizer",
    "load_tokenizer",
    "read_hf_config",
    "token_text",
]
