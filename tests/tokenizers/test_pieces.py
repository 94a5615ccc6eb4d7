"""Pieces of a text encode to the ids of the whole text, for every tokenizer that says so;
the trained BPE is the same whoever trains it, on pieces or on the whole text."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from attnlab.tokenizers import (
    ByteTokenizer,
    CharTokenizer,
    HFDirTokenizer,
    HFTokenizer,
    Tokenizer,
    WordTokenizer,
)
from attnlab.tokenizers.core import EOT, import_tokenizers
from attnlab.tokenizers.pieces import GPT2_PIECE_CUT, PIECE_CUT, cuts_like_gpt2, text_pieces

# the characters around a word's edge in every pre-tokenizer: spaces, newlines (a CRLF too),
# tabs, punctuation, an apostrophe (contractions), digits, a capital, multi-byte letters, a
# combining mark, an emoji; CJK letters, kana, hangul, CJK punctuation (the katakana middle
# dot U+30FB, the prolonged sound mark U+30FC, a letter to some engines), the ideographic
# space, "/" (o200k's punctuation takes it in after newlines); and any other character
EDGES = ["a", "s", "Z", "1", "7", " ", " ", "\n", "\n", "\r", "\t", "!", ".", "'", "é", "日",
         "\u0301", "😀", "_", EOT, "我", "の", "カ", "한", "。", "」", "・", "ー", "\u3000", "/"]
# any characters, or lines of them: a line's last character and the next one's first meet
# across each kind of line end
LINES = st.lists(st.tuples(st.lists(st.sampled_from(EDGES), max_size=4).map("".join),
                           st.sampled_from(["\n", "\r\n", "\n\n", " \n", "\r\n\r\n"])
                           ).map("".join), max_size=30).map("".join)
TEXTS = st.one_of(st.lists(st.one_of(st.sampled_from(EDGES), st.characters(codec="utf-8")),
                           max_size=120).map("".join), LINES)
# random draws of them: a bpe trained on it merges across every such edge ("\n ", " \n",
# "\r\n\r", "\n\n\n", ...), so a cut inside a word changes ids
CORPUS = "".join(random.Random(0).choices(EDGES, k=30_000))
# where a cut elsewhere than PIECE_CUT changes ids (cut before any newline: " \n"; after one:
# "\n ", "\na" (word); after a letter's newline: "a\n\n" (o200k); before a newline after
# any non-space: "!\n", "。\n", "・\n" (cl100k and o200k take a newline into punctuation's
# word); between "\r" and "\n": "a\r\n"), or elsewhere than GPT2_PIECE_CUT (after "\r\n"
# (GPT-2), after a space's or a newline's newline, before "/" (o200k))
CUT_ELSEWHERE = [" \n", "a \n", "\n ", "\na", "a\na", "a\n ", "a\n\n", "!\n", "é\n\n",
                 "a\r\n", "。\n", "・\n", "我\r\n", "。\r\n我", "。\n\n我", "\u3000\n我",
                 " \n我", "。\n/", "。\n我", "a\nカ", "한\n\r\n"]


def with_cut_elsewhere(test: Any) -> Any:
    """The property test with each of CUT_ELSEWHERE as an example it always runs."""
    for text in CUT_ELSEWHERE:
        test = example(text, 1)(test)
    return test


def pieced(tok: Tokenizer, text: str, size: int) -> list[int]:
    pieces = list(text_pieces(text, size, tok.piece_cut))
    return [i for ids in tok.encode_pieces(pieces) for i in ids]


@with_cut_elsewhere
@given(TEXTS, st.integers(1, 6))
def test_pieces_are_the_text_cut_where_a_word_ends(text: str, size: int) -> None:
    for cut in (PIECE_CUT, GPT2_PIECE_CUT):
        pieces = list(text_pieces(text, size, cut))
        assert "".join(pieces) == text and all(pieces)
        start = 0
        for piece, after in itertools.pairwise(pieces):
            start += len(piece)
            assert len(piece) >= size and cut.match(text, start)
            line_end = not piece[-1].isspace() and after.startswith(("\n", "\r\n"))
            assert line_end or (cut is GPT2_PIECE_CUT and text[start - 1] == "\n"
                                and not text[start - 2].isspace() and not after[0].isspace())


def test_lines_of_cjk_and_crlf_text_are_cut() -> None:
    """A CJK line ends in punctuation ("。"), a Windows one in "\r\n": such a text was one
    piece, encoded all at once (Hugging Face: ~420 bytes a token)."""
    cjk, crlf = "我是猫。\n名前はまだない\n한국어\r\n" * 30, "To be, or not to be\r\n" * 30
    # before "\n" or "\r\n" after a letter; for GPT-2's regex and tiktoken's, after "。\n" too
    ends = [{piece[-2:] for piece in list(text_pieces(cjk, 4, cut))[:-1]}
            for cut in (PIECE_CUT, GPT2_PIECE_CUT)]
    assert ends == [{"ない", "국어"}, {"ない", "국어", "。\n"}]
    assert [piece[-2:] for piece in text_pieces(crlf, 100)][:3] == ["be", "be", "be"]
    assert HFTokenizer.piece_cut is GPT2_PIECE_CUT and WordTokenizer(["a"]).piece_cut is PIECE_CUT


def test_the_word_pattern_takes_a_newline_into_the_word_after_it() -> None:
    """Why words are cut at PIECE_CUT only: "\n我" is one word of core.WORD_PATTERN, so the cut
    after "。\n" that GPT-2's regex and tiktoken's allow would change its ids."""
    text = "我。\n我。\n"
    tok = WordTokenizer.from_text(text)
    assert tok.encode(text) == [tok.stoi[w] for w in ("我", "。", "\n我", "。", "\n")]
    pieces = list(text_pieces(text, 1, GPT2_PIECE_CUT))
    assert pieces == ["我。\n", "我。\n"]
    assert [i for ids in tok.encode_pieces(pieces) for i in ids] != tok.encode(text)


@settings(deadline=None)
@with_cut_elsewhere
@given(TEXTS, st.integers(1, 6))
def test_char_byte_word_encode_the_same_in_pieces(text: str, size: int) -> None:
    toks: list[Tokenizer] = [ByteTokenizer()]
    if text:
        toks.append(CharTokenizer.from_text(text))
    if text.strip():
        toks.append(WordTokenizer.from_text(text))
    for tok in toks:
        assert tok.encodes_in_pieces
        assert pieced(tok, text, size) == tok.encode(text), tok.name


_TRAINED: list[HFTokenizer] = []


def trained() -> HFTokenizer:
    if not _TRAINED:
        _TRAINED.append(HFTokenizer.train(CORPUS, 600))
    return _TRAINED[0]


@settings(deadline=None)
@with_cut_elsewhere
@given(TEXTS, st.integers(1, 6))
def test_trained_bpe_encodes_the_same_in_pieces(text: str, size: int) -> None:
    tok = trained()
    assert tok.encodes_in_pieces
    assert pieced(tok, text, size) == tok.encode(text)


_ENCODINGS: list[Any] = []


def tiktoken_encodings() -> list[Any]:
    """gpt2's (r50k), cl100k's and o200k's pre-tokenizer patterns and special tokens, as the
    installed tiktoken defines them, over a small vocabulary (their own files are not
    offline) whose merges reach across every edge of EDGES."""
    if not _ENCODINGS:
        with pytest.MonkeyPatch.context() as monkeypatch:
            _ENCODINGS.extend(_tiktoken_encodings(monkeypatch))
    return _ENCODINGS


def _tiktoken_encodings(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    tiktoken = pytest.importorskip("tiktoken")
    openai_public = pytest.importorskip("tiktoken_ext.openai_public")
    ranks = {bytes([b]): b for b in range(256)}
    chars = [c for c in EDGES if c != EOT]
    for token in [a + b for a in chars for b in chars] + [a + b + c for a in chars[:12]
                                                         for b in chars[:12] for c in chars[:12]]:
        ranks.setdefault(token.encode(), len(ranks))
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *_, **__: ranks)
    found = []
    for name in ("r50k_base", "cl100k_base", "o200k_base"):
        spec = getattr(openai_public, name)()
        spec.pop("explicit_n_vocab", None)  # the real vocabulary's size, not this one's
        found.append(tiktoken.Encoding(**spec))
    return found


@settings(deadline=None, max_examples=200)
@with_cut_elsewhere
@given(TEXTS, st.integers(1, 6))
def test_tiktoken_patterns_encode_the_same_in_pieces(text: str, size: int) -> None:
    for encoding in tiktoken_encodings():
        whole = encoding.encode(text, allowed_special={EOT})
        pieces = [i for piece in text_pieces(text, size, GPT2_PIECE_CUT)
                  for i in encoding.encode(piece, allowed_special={EOT})]
        assert pieces == whole, encoding.name


def test_a_tokenizer_that_adds_to_a_text_or_cuts_it_otherwise_encodes_whole(
        tmp_path: Path) -> None:
    """Pieces would each get a BOS, a template's tokens or a leading space: such tokenizers
    are encoded all at once."""
    tk = import_tokenizers()
    tok = trained()
    assert cuts_like_gpt2(tok.backend)
    backend = tk.Tokenizer.from_str(tok.backend.to_str())
    backend.post_processor = tk.processors.TemplateProcessing(
        single=f"{EOT} $A", special_tokens=[(EOT, tok.eot_id)])
    assert not HFTokenizer(backend).encodes_in_pieces
    backend = tk.Tokenizer.from_str(tok.backend.to_str())
    backend.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=True)
    assert not HFTokenizer(backend).encodes_in_pieces
    backend = tk.Tokenizer.from_str(tok.backend.to_str())
    backend.add_tokens([tk.AddedToken("a1", rstrip=True)])  # takes in the newline after it
    assert not HFTokenizer(backend).encodes_in_pieces
    special = {"bos": tok.eot_id, "eos": tok.eot_id, "pad": None, "add_bos": True}
    with_bos = HFDirTokenizer(tok.backend, "hf:dir", special)
    assert with_bos.add_bos and not with_bos.encodes_in_pieces


def test_bpe_training_is_deterministic_and_sees_the_words_of_the_whole_text() -> None:
    """Two trainings on one text give one tokenizer (a cached bpe stands for any later one),
    and training on pieces gives the merges of training on the whole text in one go: the
    words the trainer counts are the ones encoding makes (a text's lines were not: a line's
    leading spaces were a word of their own)."""
    text = (CORPUS + "".join(f"行{i}。\n" for i in range(5000)) + CORPUS
            + "".join(f"  line {i}\n" for i in range(3000)))
    first, again = HFTokenizer.train(text, 400), HFTokenizer.train(text, 400)
    assert first.backend.to_str() == again.backend.to_str()
    pieces = list(text_pieces(text, cut=GPT2_PIECE_CUT))  # the first cut after a "。\n"
    assert len(pieces) > 1 and pieces[0].endswith("。\n")
    tk = import_tokenizers()
    whole = tk.Tokenizer(tk.models.BPE())
    whole.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    whole.decoder = tk.decoders.ByteLevel()
    whole.train_from_iterator([text], trainer=tk.trainers.BpeTrainer(
        vocab_size=400, special_tokens=[EOT], show_progress=False,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet()))
    assert first.backend.to_str() == whole.to_str()
