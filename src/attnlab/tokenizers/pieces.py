"""Pieces of a text that encode to the ids of the whole text, so that a long text is trained on
and encoded a piece at a time: neither a list of its lines nor one encoding of all of it (a
Python int per id, or Hugging Face's tokens and offsets, ~420 bytes a token) is held at once.
Which tokenizers encode exactly that way, and cut where, each says
(`Tokenizer.encodes_in_pieces`, `Tokenizer.piece_cut`, core.py); the cache that uses it is
`train/token_cache.py`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

# Letters and digits to every regex engine's Unicode tables for decades (Unicode 3.2, 2002):
# ASCII's, CJK Unified Ideographs, Hiragana, Katakana (not U+30FB, punctuation) and Hangul
# syllables. A letter too new for one engine's tables would be punctuation to it, and cl100k's
# punctuation takes in the newlines after it.
LETTERS = "0-9A-Za-z\u4e00-\u9fa5\u3041-\u3096\u30a1-\u30fa\uac00-\ud7a3"
# Characters no engine's \s has ever matched: printable ASCII but the space, those letters,
# dashes, quotes and ellipsis (U+2010-U+2027), CJK punctuation (U+3001-U+303F, not the
# ideographic space U+3000) and full-width forms (U+FF01-U+FF60)
VISIBLE = f"!-~{LETTERS}\u2010-\u2027\u3001-\u303f\uff01-\uff60"

# Before a line end ("\n" or "\r\n") after a letter or digit: every pre-tokenizer here
# (core.WORD_PATTERN; GPT-2's, r50k's/p50k's, cl100k's, o200k's regex) ends a word there,
# since no run of letters or digits takes in the whitespace after it, and none looks behind,
# so the words after the cut are the same too (tests/tokenizers/test_pieces.py).
PIECE_CUT = re.compile(f"(?<=[{LETTERS}])(?=\r?\n)")
# For GPT-2's regex and tiktoken's (not WORD_PATTERN, whose words take in the newline before
# them), also after a lone "\n" between a VISIBLE character and a letter or digit ("。\n我"):
# the newline is a word of its own there (GPT-2: \s+(?!\S) fails before a letter, so \s+
# takes it alone; cl100k and o200k: it ends the punctuation's word before it, or is
# \s*[\r\n] alone), and what comes before it, the text's end included, changes neither. Not
# after "\r\n": GPT-2's \s+(?!\S) then takes "\r" alone, but "\r\n" at a piece's end.
GPT2_PIECE_CUT = re.compile(f"{PIECE_CUT.pattern}|(?<=[{VISIBLE}]\n)(?=[{LETTERS}])")


def text_pieces(text: str, size: int = 1 << 16, cut: re.Pattern[str] = PIECE_CUT
                ) -> Iterator[str]:
    """`text` in pieces of `size` characters or more, each cut at a match of `cut`; the last
    holds the rest (all of a text with no such place)."""
    start = 0
    while start < len(text):
        found = cut.search(text, start + size) if start + size < len(text) else None
        end = found.start() if found else len(text)
        yield text[start:end]
        start = end


def cuts_like_gpt2(backend: Any) -> bool:
    """Whether a Hugging Face `tokenizers.Tokenizer` splits text into words as GPT-2's
    byte-level BPE does and adds nothing around it (a bpe trained here, GPT-2's
    tokenizer.json): then its pieces cut at `GPT2_PIECE_CUT` encode exactly."""
    def state(part: Any) -> dict[str, Any]:
        return dict(json.loads(part.__getstate__())) if part is not None else {}

    pre, post = state(backend.pre_tokenizer), state(backend.post_processor)
    return (backend.normalizer is None and post.get("type") in (None, "ByteLevel")
            and pre == {**pre, "type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
            # an added token is matched before the words are: none may reach over a cut
            and not any("\n" in t.content or t.lstrip or t.rstrip
                        for t in backend.get_added_tokens_decoder().values()))
