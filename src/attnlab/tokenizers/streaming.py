"""New ids to new text as a generation goes: whole characters, stop ids and stop strings.

A byte-level token can hold half of a UTF-8 character, and a stop string can arrive over
several tokens, so each row's ids are decoded whole and only the suffix that is settled is
emitted (`held_back` says how much must wait). `generate.stream_text` feeds `TextPieces`
the ids its steps sample.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

    from .core import Tokenizer


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of `text` must wait: an unfinished UTF-8 character
    (decoded as U+FFFD) and, before it, the start of a stop string (whose next character
    may be the one still arriving)."""
    unfinished = len(text) - len(text.rstrip("\ufffd"))
    done = text[:len(text) - unfinished]
    start = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(done)), start, -1):
            if done.endswith(stop[:k]):
                start = k
                break
    return unfinished + start


def _unfinished(tail: bytes) -> int:
    """How many of `tail`'s last bytes begin a UTF-8 character whose rest is missing (0: it
    ends on a whole character, or on bytes no byte could complete, like 0xF5, or 0xE0 0x80):
    the bytes UTF-8's incremental decoder keeps waiting on."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decoder.decode(tail, final=False)
    return len(decoder.getstate()[0])


def half_character(tokenizer: Tokenizer, ids: Sequence[int]) -> tuple[int, bytes]:
    """Where `ids` end with the first bytes of a character whose rest never came: how many
    trailing ids hold those bytes, from the start of a character on, and the bytes those ids
    hold before the half character ((0, b""): no half character). A token whose bytes the
    tokenizer does not know ("▁the", a word) is text: whole characters."""
    known: list[bytes] = []
    for i in reversed(ids):  # a character has at most 4 bytes
        data = tokenizer.token_bytes(i)
        if data is None or sum(map(len, known)) >= 4:
            break
        known.insert(0, data)
    k = _unfinished(b"".join(known))
    if k == 0:
        return 0, b""
    cut, held = 0, b""
    while len(held) < k or (cut < len(known) and 0x80 <= held[0] < 0xC0):
        # the ids holding the k bytes, then back to a character's first byte (a token can
        # end one character and start the next)
        cut += 1
        held = known[-cut] + held
    return cut, held[:-k]


def settled_text(tokenizer: Tokenizer, ids: Sequence[int], context: Sequence[int]) -> str:
    """A row's final text once its ids have ended: decoded as it continues `context`, less
    a half character its last ids left unfinished. That half decodes as one U+FFFD or, in a
    byte-fallback decoder (Llama 2, Mistral), turns its whole run of byte tokens into one
    U+FFFD per byte: so the ids holding it are decoded without it, and a U+FFFD standing for
    bytes no later byte could complete (or written whole) is kept, as `decode` shows it."""
    text = tokenizer.decode_continuation(ids, context)
    cut, before = half_character(tokenizer, ids) if text.endswith("\ufffd") else (0, b"")
    if cut == 0:
        return text
    return (tokenizer.decode_continuation(ids[:len(ids) - cut], context)
            + before.decode("utf-8", errors="replace"))


def first_stop(text: str, stops: Sequence[str], emitted: int) -> int | None:
    """Where the first of `stops` starts in `text` (None: nowhere), searching only where one
    could begin that was not there before the `emitted` characters were yielded."""
    hits = [i for i in (text.find(s, max(0, emitted - len(s))) for s in stops) if i >= 0]
    return min(hits) if hits else None


class TextPieces(Iterator[list[str]]):
    """Each step's new ids (B,) -> each row's new text, decoded as it continues the row's
    prompt ids (`generate.stream_text`'s loop). A row ends at one of the tokenizer's stop ids
    (not emitted) or at the first of `stops` (emitted up to it); once steps run out, what was
    held back for a stop string that never came is flushed. `made[b]`: the ids row b has
    taken so far (its stop id included, nothing after it ended), for counting new tokens."""

    def __init__(self, steps: Iterator[Tensor], tokenizer: Tokenizer, prompts: list[list[int]],
                 stops: list[str]) -> None:
        self.made = [0] * len(prompts)
        self._pieces = self._run(steps, tokenizer, prompts, stops)

    def __next__(self) -> list[str]:
        return next(self._pieces)

    def _run(self, steps: Iterator[Tensor], tokenizer: Tokenizer, prompts: list[list[int]],
             stops: list[str]) -> Iterator[list[str]]:
        B = len(prompts)

        def decode(b: int) -> str:
            return tokenizer.decode_continuation(ids[b], prompts[b])

        ids: list[list[int]] = [[] for _ in range(B)]
        emitted = [0] * B  # characters of each row's text already yielded
        done = [False] * B
        for next_ids in steps:
            pieces = [""] * B
            for b, token in enumerate(next_ids.tolist()):
                if done[b]:
                    continue
                self.made[b] += 1
                if token in tokenizer.stop_ids:
                    done[b] = True
                    text, end = decode(b), None
                else:
                    ids[b].append(token)
                    text = decode(b)
                    # not in a trailing U+FFFD: it may be half a character still arriving
                    end = first_stop(text.rstrip("\ufffd"), stops, emitted[b])
                    done[b] = end is not None
                if end is None and done[b]:  # less a character its last ids left unfinished
                    text = settled_text(tokenizer, ids[b], prompts[b])
                    end = len(text)
                elif end is None:
                    end = len(text) - held_back(text, stops)
                pieces[b] = text[emitted[b]:end]
                emitted[b] = max(emitted[b], end)
            yield pieces
            if all(done):
                return
        # max_new_tokens reached: flush what was held back for a stop string that never came
        tail = [""] * B
        for b in range(B):
            if not done[b]:
                text = settled_text(tokenizer, ids[b], prompts[b])
                end = first_stop(text, stops, emitted[b])  # a stop a U+FFFD written whole ends
                tail[b] = text[emitted[b]:end]
        if any(tail):
            yield tail
