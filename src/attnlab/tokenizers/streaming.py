"""New ids to new text as a generation goes: whole characters, stop ids and stop strings.

A byte-level token can hold half of a UTF-8 character, and a stop string can arrive over
several tokens, so each row's ids are decoded whole and only the suffix that is settled is
emitted (`held_back` says how much must wait). `generate.stream_text` feeds `TextPieces`
the ids its steps sample.
"""

from __future__ import annotations

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


def ends_inside_a_character(tokenizer: Tokenizer, ids: Sequence[int]) -> bool:
    """Whether `ids` end with the first bytes of a UTF-8 character whose rest never came, so
    their text's trailing U+FFFD stands for that half character, not for a U+FFFD written
    whole. Where the tokenizer does not know its tokens' bytes, a trailing U+FFFD is taken
    for a half character."""
    tail = b""
    for i in reversed(ids[-4:]):  # a character has at most 4 bytes
        data = tokenizer.token_bytes(i)
        if data is None:
            return True
        tail = data + tail
        if len(tail) >= 4:
            break
    for k in range(1, min(4, len(tail)) + 1):
        byte = tail[-k]
        if byte < 0x80:  # ASCII: whatever came before it, the text does not end inside one
            return False
        if byte >= 0xC0:  # a first byte: it announces 2, 3 or 4 bytes, and k of them came
            return (2 if byte < 0xE0 else 3 if byte < 0xF0 else 4) > k
    return False


def first_stop(text: str, stops: Sequence[str], emitted: int) -> int | None:
    """Where the first of `stops` starts in `text` (None: nowhere), searching only where one
    could begin that was not there before the `emitted` characters were yielded."""
    hits = [i for i in (text.find(s, max(0, emitted - len(s))) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _settled(text: str, tokenizer: Tokenizer, ids: Sequence[int]) -> int:
    """The length of a row's final text once its ids have ended: a half character dropped."""
    return len(text.rstrip("\ufffd")) if ends_inside_a_character(tokenizer, ids) else len(text)


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
                if end is None:  # an ended row drops a character its last token left unfinished
                    end = _settled(text, tokenizer, ids[b]) if done[b] else (
                        len(text) - held_back(text, stops))
                pieces[b] = text[emitted[b]:end]
                emitted[b] = max(emitted[b], end)
            yield pieces
            if all(done):
                return
        # max_new_tokens reached: flush what was held back for a stop string that never came
        tail = [""] * B
        for b in range(B):
            if not done[b]:
                text = decode(b)
                text = text[:_settled(text, tokenizer, ids[b])]
                end = first_stop(text, stops, emitted[b])  # a stop a U+FFFD written whole ends
                tail[b] = text[emitted[b]:end]
        if any(tail):
            yield tail
