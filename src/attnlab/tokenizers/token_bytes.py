"""Tokens as bytes: the labels of tokens that hold part of a UTF-8 character, and GPT-2's
byte <-> printable character table that byte-level tokenizer.json files use."""

from __future__ import annotations

import re
from functools import lru_cache

# control characters: C0 (newline, tab and carriage return written \n, \t, \r), DEL and C1
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def bytes_text(data: bytes) -> str:
    """`data` as text, each byte outside a whole UTF-8 character written <e6> (a token holding
    part of a character: sentencepiece's byte-fallback "<0xE6>", byte-level BPE's "æ")."""
    out, i = [], 0
    while i < len(data):
        for n in range(1, 5):  # the shortest prefix that is one whole character
            try:
                out.append(data[i:i + n].decode("utf-8"))
                i += n
                break
            except UnicodeDecodeError:
                continue
        else:
            out.append(f"<{data[i]:02x}>")
            i += 1
    return "".join(out)


def _visible(char: str) -> str:
    code = ord(char)
    return _ESCAPES.get(char) or (f"<{code:02x}>" if code < 0x80 else f"<U+{code:04X}>")


def visible_controls(text: str) -> str:
    """`text` with each control character visible: newline, tab and carriage return as \\n,
    \\t, \\r, the others as their codes: ESC as <1b> (as ByteTokenizer labels its bytes),
    U+0085 as <U+0085>. Drawn as they are they are invisible on a page, and a missing-glyph
    box in a figure, with a matplotlib warning for each (a byte-level BPE's top tokens in
    `attnlab lens`)."""
    return _CONTROL.sub(lambda m: _visible(m[0]), text)


@lru_cache(maxsize=1)
def bytes_as_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which byte-level tokenizer.json uses."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


@lru_cache(maxsize=1)
def chars_as_bytes() -> dict[str, int]:
    """The inverse of `bytes_as_chars`: "æ" -> 0xe6."""
    return {c: b for b, c in bytes_as_chars().items()}
