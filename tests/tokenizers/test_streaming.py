"""tokenizers/streaming.py: new text only once it is settled (whole characters, stop strings)."""

from __future__ import annotations

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from attnlab.tokenizers import ByteTokenizer
from attnlab.tokenizers.streaming import TextPieces, held_back


def test_held_back_waits_for_a_character_and_a_stop_strings_start() -> None:
    assert held_back("caf\ufffd", []) == 1  # half of "é"
    assert held_back("hello wor", ["world"]) == 3  # "wor" may become "world"
    assert held_back("hello wor\ufffd", ["world"]) == 4
    assert held_back("hello", ["world"]) == 0
    assert held_back("ab", ["b", "abc"]) == 2  # the longest start of any stop string


@given(st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=3))
@example("\ufffd", "0")  # a U+FFFD written whole was dropped at the end as half a character
@example("\x80", "\ufffd")  # U+0080's first byte alone decodes as U+FFFD: no stop string yet
def test_pieces_add_up_to_the_text_up_to_the_stop_string(text: str, stop: str) -> None:
    """Streamed byte by byte, a row's pieces join to its text cut just before the first
    `stop` (half characters and stop-string starts held back, nothing emitted twice, a
    U+FFFD in the text kept)."""
    tok = ByteTokenizer()
    ids = tok.encode(text)
    steps = iter([torch.tensor([i]) for i in ids])
    joined = "".join(p[0] for p in TextPieces(steps, tok, [[]], [stop]))
    at = text.find(stop)
    assert joined == (text if at < 0 else text[:at])
