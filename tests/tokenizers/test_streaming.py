"""tokenizers/streaming.py: new text only once it is settled (whole characters, stop strings)."""

from __future__ import annotations

import codecs

import torch
from hypothesis import example, given
from hypothesis import strategies as st

from attnlab.tokenizers import ByteTokenizer, Tokenizer
from attnlab.tokenizers.streaming import TextPieces, held_back
from helpers import byte_fallback_bpe


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


def _streamed(tok: Tokenizer, ids: list[int], prompt: list[int], stops: list[str]) -> str:
    steps = iter([torch.tensor([i]) for i in ids])
    return "".join(p[0] for p in TextPieces(steps, tok, [prompt], stops))


@given(st.binary(min_size=1, max_size=12))
@example(b"s\xe6\xe6")  # the first 0xE6 can never become a character: its U+FFFD was dropped
@example(b"\xf0\x9f\x98")  # a 4-byte character cut short
def test_a_completion_ending_inside_a_character_drops_that_half_only(data: bytes) -> None:
    """Any bytes, streamed to the end: the text is what UTF-8 decoding with U+FFFD shows for
    everything but a character whose last bytes never came (Python's incremental decoder
    holds exactly those back)."""
    expected = codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)
    assert _streamed(ByteTokenizer(), list(data), [], []) == expected


@given(st.text(max_size=6), st.sampled_from(["日", "😀", "é"]), st.data())
def test_a_byte_fallback_completion_keeps_its_whole_characters(
    text: str, char: str, data: st.DataObject,
) -> None:
    """A byte-fallback decoder (Llama 2, Mistral) turns a whole run of byte tokens into one
    U+FFFD per byte once the run ends inside a character: the characters before the half
    one come back whole, not as U+FFFD and not dropped, also those held back for a stop
    string that may have begun (the last character and the cut one, then "!")."""
    tok = byte_fallback_bpe()
    cut = data.draw(st.integers(1, len(char.encode()) - 1))
    half = [1 + b for b in char.encode()[:cut]]  # <0xNN> is id 1 + NN
    new = tok.encode_continuation(text) + half
    stops = [text[-1:] + char + "!"]
    assert _streamed(tok, new, tok.encode("a"), stops) == tok.decode_continuation(
        new[:len(new) - cut], tok.encode("a"))
