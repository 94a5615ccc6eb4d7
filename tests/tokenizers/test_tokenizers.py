"""Tokenizers: lossless round trips, left-padded batches, save/load, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.tokenizers import (
    ByteTokenizer,
    CharTokenizer,
    HFTokenizer,
    Tokenizer,
    WordTokenizer,
    get_tokenizer,
    load_tokenizer,
)
from attnlab.tokenizers.hf_dir import load_hf_tokenizer
from attnlab.tokenizers.token_bytes import bytes_as_chars, bytes_text
from helpers import byte_fallback_bpe

CORPUS = "First Citizen:\nBefore we proceed any further, hear me speak.\nAll: Speak, speak!\n"


@given(st.text(max_size=200))
def test_byte_round_trip_any_unicode(text: str) -> None:
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids) and len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text


@given(st.text(alphabet=sorted(set(CORPUS)), max_size=200))
def test_char_round_trip_within_vocabulary(text: str) -> None:
    tok = get_tokenizer("char", CORPUS)
    assert tok.vocab_size == len(set(CORPUS))
    assert tok.decode(tok.encode(text)) == text


def test_word_tokenizer_keeps_leading_spaces() -> None:
    tok = get_tokenizer("word", "Hello World!")
    ids = tok.encode("Hello World!")
    assert tok.pieces(ids) == ["Hello", " World", "!"]
    assert tok.decode(ids) == "Hello World!"


@settings(max_examples=25, deadline=None)
@given(st.text(max_size=80))
def test_bpe_round_trip_any_unicode(text: str) -> None:
    tok = _bpe()
    assert tok.decode(tok.encode(text)) == text


_BPE: list[Tokenizer] = []


def _bpe() -> Tokenizer:
    if not _BPE:
        _BPE.append(get_tokenizer("bpe:300", CORPUS * 20))
    return _BPE[0]


def test_bpe_is_trained_to_the_asked_size_and_compresses() -> None:
    tok = _bpe()
    assert 256 < tok.vocab_size <= 300
    assert len(tok.encode(CORPUS)) < len(CORPUS.encode())


@pytest.mark.parametrize("spec", ["char", "byte", "word", "bpe"])
def test_left_padded_batches(spec: str) -> None:
    tok = _bpe() if spec == "bpe" else get_tokenizer(spec, CORPUS)
    texts = ["First Citizen:", "First", "First Citizen:\nBefore we proceed"]
    ids, mask = tok.encode_batch(texts)
    assert ids.shape == mask.shape and ids.dtype == mask.dtype == torch.long
    for b, text in enumerate(texts):
        row = tok.encode(text)
        n = len(row)
        assert mask[b].tolist() == [0] * (ids.shape[1] - n) + [1] * n  # zeros, then ones
        assert ids[b, ids.shape[1] - n:].tolist() == row
        assert (ids[b, : ids.shape[1] - n] == tok.pad_id).all()


def test_left_padding_of_an_empty_text_is_all_padding() -> None:
    _, mask = ByteTokenizer().encode_batch(["", "ab"])
    assert mask.tolist() == [[0, 0], [1, 1]]


@pytest.mark.parametrize("spec", ["char", "byte", "word", "bpe"])
def test_save_and_load_give_the_same_tokenizer(spec: str, tmp_path: Path) -> None:
    tok = _bpe() if spec == "bpe" else get_tokenizer(spec, CORPUS)
    tok.save(tmp_path)
    back = load_tokenizer(tmp_path)
    assert type(back) is type(tok)
    assert back.identity() == tok.identity()
    assert back.encode(CORPUS) == tok.encode(CORPUS)
    # a saved directory is also a tokenizer spec (reuse a checkpoint's tokenizer)
    assert get_tokenizer(str(tmp_path)).encode(CORPUS) == tok.encode(CORPUS)


def test_hugging_face_tokenizer_json_from_a_local_path(tmp_path: Path) -> None:
    tok = _bpe()
    assert isinstance(tok, HFTokenizer)
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    for spec in (tmp_path / "tokenizer.json", tmp_path):
        loaded = get_tokenizer(str(spec))
        assert loaded.encode(CORPUS) == tok.encode(CORPUS)


def test_unknown_character_names_it_and_the_fix() -> None:
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match=r"character 'z' at position 2.*covers every "
                                         r"character \(byte or bpe\)"):
        tok.encode("abz")
    with pytest.raises(ValueError, match="not in the vocabulary"):
        WordTokenizer.from_text("Hello World").encode("Hello there")


def test_tiktoken_without_offline_files_says_how_to_provide_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"vocab\.bpe.*TIKTOKEN_CACHE_DIR"):
        get_tokenizer("tiktoken:gpt2")


@pytest.mark.parametrize("spec", ["nope", "bpe:many", "tiktoken:klingon"])
def test_bad_specs_are_rejected(spec: str) -> None:
    with pytest.raises(ValueError, match=r"bpe|unknown"):
        get_tokenizer(spec, CORPUS)


def test_corpus_tokenizers_need_the_corpus() -> None:
    with pytest.raises(ValueError, match="pass text"):
        get_tokenizer("char")
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer([])


def test_a_run_directory_names_its_checkpoint_tokenizer_and_a_bad_path_says_so(
    tmp_path: Path,
) -> None:
    from attnlab import GPT, GPTConfig, save_checkpoint
    from attnlab.tokenizers import CharTokenizer, get_tokenizer

    tok = CharTokenizer(list("abc"))
    model = GPT(GPTConfig.from_name("nano", vocab_size=3))
    save_checkpoint(tmp_path / "run" / "ckpt", model, tok)
    # `--tokenizer runs/x` as every command reads runs/x: its ckpt/
    assert get_tokenizer(str(tmp_path / "run")).encode("cab") == tok.encode("cab")
    with pytest.raises(ValueError, match=r"nothere.json'.*no tokenizer.json.*check the path"):
        get_tokenizer(str(tmp_path / "nothere.json"))
    with pytest.raises(ValueError, match="check the path"):
        get_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="unknown tokenizer 'bep'; use char"):
        get_tokenizer("bep")


@pytest.mark.parametrize("kind", ["byte", "bpe", "byte-fallback"])
def test_a_token_holding_part_of_a_character_is_labelled_by_its_bytes(kind: str) -> None:
    """Labels (inspect, viewer chips, figures) of "日" split over byte tokens read "�",
    "�", "�" (byte fallback) or "�", "", "�" (byte-level BPE: an empty chip)."""
    tok = {"byte": ByteTokenizer, "byte-fallback": byte_fallback_bpe,
           "bpe": lambda: HFTokenizer.train(CORPUS, 300)}[kind]()
    ids = tok.encode("a 日 a")
    for labels in (tok.token_texts(ids), tok.pieces(ids)):
        assert labels[labels.index("<e6>"):][:3] == ["<e6>", "<97>", "<a5>"]
        assert "".join(labels).replace("<e6><97><a5>", "日") == "a 日 a"  # the rest is text
        assert "\ufffd" not in "".join(labels) and all(labels)


def test_a_completion_after_a_prompt_of_byte_tokens_keeps_its_characters() -> None:
    """The prompt's last 8 ids, the context a completion is decoded after, opened inside a
    character: the byte-fallback decoder turned the whole run of byte tokens, the new 日本
    included, into U+FFFD (`generate` printed "�" x 6 after a Japanese prompt)."""
    tok = byte_fallback_bpe()
    prompt = tok.encode("a 日本語です")  # ▁a, ▁, then 15 byte tokens
    new = [1 + b for b in "日本".encode()] + tok.encode_continuation(" a")
    assert tok.decode_continuation(new, prompt) == "日本 a"
    assert "".join(tok.token_texts([*prompt, *new])[-7:]).endswith("<e6><9c><ac> a")


def test_a_tokenizer_json_with_holes_in_its_ids_decodes_every_id_it_has() -> None:
    """A tokenizer.json need not number its tokens 0..n-1 (a hand-made word-level vocabulary
    at the characters' code points; added tokens past a gap): its ids run to the largest,
    so decoding one of them works, and an id in a hole is refused by name, not dropped."""
    from helpers import tokenizer_with_holes

    tok = tokenizer_with_holes()
    assert tok.vocab_size == 100  # ids 0..99, six of them tokens
    assert tok.encode("cab") == [99, 97, 98]
    assert tok.decode([99, 97, 98]) == "cab"
    with pytest.raises(ValueError, match="cannot decode id 50: its vocabulary has no token"):
        tok.decode([97, 50])
    with pytest.raises(ValueError, match=r"cannot decode id 100: its ids are 0\.\.99"):
        tok.decode([100])


def test_a_completion_after_a_window_opening_on_a_four_byte_characters_last_byte() -> None:
    """The 8-id context window opens on the last of 😀's three continuation bytes: it moves
    back all three to the character's first byte, or the byte-fallback decoder turns the
    run into U+FFFD."""
    tok = byte_fallback_bpe()
    prompt = tok.encode("a 😀bbbbbbb")  # ▁a, ▁, 4 bytes of 😀, 7 byte tokens
    assert len(prompt) == 13 and prompt[5] == 1 + "😀".encode()[3]  # window opens at 5
    new = [1 + b for b in "日本".encode()] + tok.encode_continuation(" a")
    assert tok.decode_continuation(new, prompt) == "日本 a"


def test_a_four_byte_character_reads_as_itself() -> None:
    assert bytes_text("😀".encode()) == "😀"
    assert bytes_text("😀".encode()[:3]) == "<f0><9f><98>"


def test_gpt2s_byte_table_is_a_bijection_onto_its_printable_characters() -> None:
    """Bytes 33..126, 161..172 and 174..255 stand for themselves; the other 68 bytes (0xAD,
    the soft hyphen, among them) for chr(256 + i), in byte order: GPT-2's bytes_to_unicode."""
    table = bytes_as_chars()
    assert len(set(table.values())) == 256
    assert table[0xAC] == "\xac" and table[0xAE] == "\xae"
    assert table[0xAD] == chr(256 + 67)  # after 0..32 (33 bytes) and 127..160 (34)
    assert table[ord("!")] == "!" and table[0] == chr(256) and table[ord(" ")] == "Ġ"


def test_a_batch_of_empty_texts_has_one_masked_column() -> None:
    ids, mask = ByteTokenizer().encode_batch(["", ""])
    assert ids.shape == mask.shape == (2, 1)
    assert mask.sum() == 0


def test_a_tokenizer_json_that_adds_the_bos_itself_gets_no_second_one(tmp_path: Path) -> None:
    """Llama 3's tokenizer.json prepends <|begin_of_text|> in its post-processor while
    tokenizer_config.json also says add_bos_token: encode adds it once, as transformers."""
    tk = pytest.importorskip("tokenizers")
    words = ["<s>", "</s>", "the", "fox"]
    backend = tk.Tokenizer(tk.models.WordLevel({w: i for i, w in enumerate(words)},
                                               unk_token="<s>"))
    backend.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(words[:2])
    backend.post_processor = tk.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}))
    assert load_hf_tokenizer(tmp_path).encode("the fox") == [0, 2, 3]


def test_a_directory_with_no_tokenizer_says_what_would_hold_one(tmp_path: Path) -> None:
    """It asked "is it an attnlab checkpoint?" instead of saying what to pass."""
    with pytest.raises(FileNotFoundError, match=r"has no tokenizer_config\.json, so it holds no "
                       r"tokenizer: pass a directory Tokenizer\.save wrote"):
        load_tokenizer(tmp_path)


def test_pieces_a_word_level_vocabulary_cannot_encode_are_one_clear_error() -> None:
    """A word-level tokenizer.json with no unknown token: encoding a text in pieces (a
    training text, train/token_cache.py) raised the Rust side's bare Exception ("Missing
    [UNK] token from the vocabulary"), a traceback in `attnlab train --init_from`."""
    tk = pytest.importorskip("tokenizers")
    backend = tk.Tokenizer(tk.models.WordLevel({"the": 0, "fox": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = tk.pre_tokenizers.WhitespaceSplit()
    tok = HFTokenizer(backend)
    assert tok.encode_pieces(["the fox", "fox"]) == [[0, 1], [1]]
    with pytest.raises(ValueError, match=r"cannot encode 'the cat': .*; use only text its "
                       "vocabulary covers"):
        tok.encode_pieces(["the fox", "the cat"])


def _gemma_style_dir(directory: Path) -> Path:
    """A tokenizer directory shaped as Gemma's (1, 2 and 3): BPE with byte fallback, spaces
    replaced by "▁" in a normalizer (no pre-tokenizer, no space prepended), <bos> prepended
    by the post-processor and by tokenizer_config.json's add_bos_token."""
    tk = pytest.importorskip("tokenizers")
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    vocab = {**{s: i for i, s in enumerate(specials)},
             **{f"<0x{b:02X}>": 4 + b for b in range(256)}}
    for piece in ["▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "hell", "hello", "▁w",
                  "▁wo", "▁wor", "▁worl", "▁world"]:
        vocab[piece] = len(vocab)
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("▁", "w"), ("▁w", "o"),
              ("▁wo", "r"), ("▁wor", "l"), ("▁worl", "d")]
    backend = tk.Tokenizer(tk.models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True,
                                         fuse_unk=True))
    backend.normalizer = tk.normalizers.Replace(" ", "▁")
    backend.decoder = tk.decoders.Sequence([tk.decoders.Replace("▁", " "),
                                            tk.decoders.ByteFallback(), tk.decoders.Fuse()])
    backend.add_special_tokens(specials)
    backend.post_processor = tk.processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", 2)])
    backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
         "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}))
    return directory


@pytest.mark.parametrize("text", ["hello world", " hello  world ", "héllo 日本 world😀", "\n"])
def test_a_gemma_style_tokenizer_encodes_as_transformers_and_round_trips(
    tmp_path: Path, text: str
) -> None:
    """Gemma's tokenizer.json (no space prepended, leading and doubled spaces kept as "▁",
    every other character as <0xNN> bytes): encode gives transformers' ids, <bos> once, and
    decode gives the text back."""
    transformers = pytest.importorskip("transformers")
    directory = _gemma_style_dir(tmp_path)
    tok = load_hf_tokenizer(directory)
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=str(directory /
                                                                     "tokenizer.json"))
    ids = tok.encode(text)
    assert ids == theirs(text)["input_ids"]
    assert ids[0] == 2 and ids.count(2) == 1  # <bos>, once
    assert tok.decode(ids[1:]) == text
