"""Pieces of a text that encode to the ids of the whole text, so that a long text is trained on
and encoded a piece at a time: neither a list of its lines nor one encoding of all of it (a
Python int per id, or Hugging Face's tokens and offsets, ~420 bytes a token) is held at once.
Which tokenizers encode exactly that way each says (`Tokenizer.encodes_in_pieces`, core.py);
the cache that uses it is `train/data.py`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

# Before a newline after an ASCII letter or digit: every pre-tokenizer here (core.WORD_PATTERN;
# GPT-2's, cl100k's, o200k's regex) ends a word there, since no run of letters or digits takes
# in a newline after it, and none looks behind, so the words after the cut are the same too
# (tests/tokenizers/test_pieces.py). ASCII only: a letter too new for one regex engine's
# Unicode tables would be punctuation to it, and cl100k's punctuation takes in newlines.
PIECE_CUT = re.compile(r"(?<=[0-9A-Za-z])\n")


def text_pieces(text: str, size: int = 1 << 16) -> Iterator[str]:
    """`text` in pieces of `size` characters or more, each cut at a `PIECE_CUT`; the last
    holds the rest (all of a text with no such place)."""
    start = 0
    while start < len(text):
        cut = PIECE_CUT.search(text, start + size) if start + size < len(text) else None
        end = cut.start() if cut else len(text)
        yield text[start:end]
        start = end


def cuts_like_gpt2(backend: Any) -> bool:
    """Whether a Hugging Face `tokenizers.Tokenizer` splits text into words as GPT-2's
    byte-level BPE does and adds nothing around it (a bpe trained here, GPT-2's
    tokenizer.json): then its pieces cut at `PIECE_CUT` encode exactly."""
    def state(part: Any) -> dict[str, Any]:
        return dict(json.loads(part.__getstate__())) if part is not None else {}

    pre, post = state(backend.pre_tokenizer), state(backend.post_processor)
    return (backend.normalizer is None and post.get("type") in (None, "ByteLevel")
            and pre == {**pre, "type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
            # an added token is matched before the words are: none may reach over a cut
            and not any("\n" in t.content or t.lstrip or t.rstrip
                        for t in backend.get_added_tokens_decoder().values()))
