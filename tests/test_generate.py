"""generate/: cached == recomputed, padded rows == rows alone, sampling, windows, text."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab.generate as generate_mod
from attnlab import GPT, GPTConfig, build_mask
from attnlab.generate import (
    GenerationConfig,
    generate,
    generate_text,
    logits_to_probs,
    sample,
    stream,
    stream_text,
)
from attnlab.interp.edits import Edits
from attnlab.model.decode import decode_step
from attnlab.tokenizers import get_tokenizer
from helpers import left_padded, modern_switches


def _model(**overrides: object) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("nano", **overrides)).eval()  # type: ignore[arg-type]


@torch.no_grad()
def _greedy_by_recomputation(
    model: GPT, ids: torch.Tensor, mask: torch.Tensor, steps: int
) -> torch.Tensor:
    """The slow reference: rerun the whole (cropped) sequence for every new token."""
    block = model.config.block_size
    for _ in range(steps):
        logits = model(ids[:, -block:], attention_mask=mask[:, -block:]).logits[:, -1]
        nxt = logits.argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
    return ids


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3), seed=st.integers(0, 99),
    switches=modern_switches(),
)
def test_cached_greedy_equals_recomputation(
    lengths: list[int], seed: int, switches: dict[str, object]
) -> None:
    model = _model(n_head=4, **switches)
    ids, mask = left_padded(lengths, seed=seed)
    out = generate(model, ids, mask, max_new_tokens=8, temperature=0)
    assert torch.equal(out, _greedy_by_recomputation(model, ids, mask, 8))


def test_batch_of_one_without_mask_equals_recomputation() -> None:
    model = _model()
    ids = torch.randint(0, 65, (1, 7), generator=torch.Generator().manual_seed(3))
    out = generate(model, ids, max_new_tokens=20, temperature=0)
    assert torch.equal(out, _greedy_by_recomputation(model, ids, torch.ones_like(ids), 20))


def test_each_padded_row_equals_the_prompt_alone() -> None:
    model = _model()
    ids, mask = left_padded([3, 8, 5], seed=4)
    batch = generate(model, ids, mask, max_new_tokens=12, temperature=0)
    for b, n in enumerate([3, 8, 5]):
        alone = generate(model, ids[b:b + 1, -n:], max_new_tokens=12, temperature=0)
        assert torch.equal(batch[b:b + 1, -(n + 12):], alone)
        full_mask = torch.cat([mask[b:b + 1], torch.ones(1, 12, dtype=torch.long)], dim=1)
        with torch.no_grad():
            padded_logits = model(batch[b:b + 1], attention_mask=full_mask).logits[:, -(n + 12):]
            alone_logits = model(alone).logits
        torch.testing.assert_close(padded_logits, alone_logits, atol=1e-4, rtol=0)


@settings(max_examples=12, deadline=None)
@given(pad_id=st.integers(0, 64), penalty=st.sampled_from([1e-3, 0.5, 2.0, 1e3]),
       seed=st.integers(0, 99))
def test_greedy_with_a_repetition_penalty_equals_recomputation_row_by_row(
    pad_id: int, penalty: float, seed: int
) -> None:
    """Greedy generation with a repetition penalty, left-padded batch: each row's ids are
    what rerunning that row alone gives with every id it holds penalized, its prompt's and
    each one generated since, and never the id its padding is filled with (a penalty below
    1 favours seen ids, so a pad counted as seen, or a new id not counted, changes the ids)."""
    model = _model()
    lengths, steps = [2, 7, 4], 6
    ids, mask = left_padded(lengths, seed=seed)
    ids = ids.masked_fill(mask == 0, pad_id)  # (B, P)
    out = generate(model, ids, mask, max_new_tokens=steps, temperature=0,
                   repetition_penalty=penalty)
    for b, n in enumerate(lengths):
        row = ids[b, -n:]  # (n,)
        for _ in range(steps):
            with torch.no_grad():
                logits = model(row[None]).logits[0, -1]  # (V,)
            seen = torch.zeros_like(logits, dtype=torch.bool).index_fill(0, row, True)
            penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
            row = torch.cat([row, torch.where(seen, penalized, logits).argmax()[None]])
        assert torch.equal(out[b, -(n + steps):], row), (b, pad_id)


def test_a_bfloat16_model_is_sampled_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step's logits reach the sampler as float32 (transformers' generate() casts
    too): a bfloat16 softmax, cumulative sum and top-p cut are coarse (2**-8)."""
    model = _model().to(torch.bfloat16)
    ids, mask = left_padded([3, 5], seed=1)
    seen: list[torch.dtype] = []

    def spy(logits: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        seen.append(logits.dtype)
        return sample(logits, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(generate_mod, "sample", spy)
    generate(model, ids, mask, max_new_tokens=4, temperature=1.0, top_p=0.9, seed=0,
             repetition_penalty=1.3)
    assert seen == [torch.float32] * 4


def test_seeded_sampling_is_reproducible() -> None:
    model = _model()
    ids, mask = left_padded([4, 2])
    kwargs = dict(max_new_tokens=16, temperature=1.5, top_k=20, top_p=0.95)
    first = generate(model, ids, mask, seed=7, **kwargs)  # type: ignore[arg-type]
    again = generate(model, ids, mask, seed=7, **kwargs)  # type: ignore[arg-type]
    other = generate(model, ids, mask, seed=8, **kwargs)  # type: ignore[arg-type]
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    g = torch.Generator().manual_seed(7)
    with_generator = generate(model, ids, mask, generator=g, **kwargs)  # type: ignore[arg-type]
    assert torch.equal(first, with_generator)


def test_sampling_settings_that_change_nothing_or_everything() -> None:
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(0))
    plain = torch.softmax(logits, -1)
    torch.testing.assert_close(logits_to_probs(logits, 1.0, 0, 1.0), plain)
    torch.testing.assert_close(logits_to_probs(logits, 1.0, 30, 1.0), plain)
    torch.testing.assert_close(logits_to_probs(logits, 1.0, 99, 1.0), plain)
    torch.testing.assert_close(logits_to_probs(logits, 2.0), torch.softmax(logits / 2, -1))
    greedy = logits.argmax(-1)
    assert torch.equal(sample(logits, temperature=0.0), greedy)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        assert torch.equal(sample(logits, 1.0, top_k=1, generator=g), greedy)
        assert torch.equal(sample(logits, 1.0, top_p=0.0, generator=g), greedy)


def test_top_k_and_top_p_keep_the_right_ids() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.05, 0.3, 0.15]]))
    assert (logits_to_probs(logits, top_k=2) > 0).tolist() == [[True, False, True, False]]
    # nucleus 0.7: 0.5 alone is short of it, 0.5 + 0.3 reaches it, so two ids stay
    assert (logits_to_probs(logits, top_p=0.7) > 0).tolist() == [[True, False, True, False]]
    assert (logits_to_probs(logits, top_p=0.85) > 0).tolist() == [[True, False, True, True]]
    torch.testing.assert_close(logits_to_probs(logits, top_p=0.7).sum(), torch.tensor(1.0))


def test_top_k_1_and_top_p_0_stay_greedy_at_any_temperature() -> None:
    # divided by the largest float32 temperature, differences of 1e-7 underflow to 0 and all
    # ids tie; which id is most likely must still come from the logits themselves
    logits = torch.tensor([[0.0, 1e-7, -1e-7, 5e-8]])  # (1, V): argmax is id 1
    for filters in ({"top_k": 1}, {"top_p": 0.0}):
        probs = logits_to_probs(logits, temperature=3.4028235e38, **filters)
        assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]], filters


def test_rows_stop_at_eot_and_are_padded_after() -> None:
    model = _model()
    ids, mask = left_padded([3, 6], seed=2)
    greedy = generate(model, ids, mask, max_new_tokens=10, temperature=0)
    eot = int(greedy[0, 6 + 2])  # row 0's third new token
    out = generate(model, ids, mask, max_new_tokens=10, temperature=0, eot_id=eot, pad_id=64)
    row0 = out[0, 6:].tolist()
    first = row0.index(eot)
    assert first <= 2 and all(t == 64 for t in row0[first + 1:])
    assert torch.equal(out[1, :6 + first + 1], greedy[1, :6 + first + 1])
    alone = generate(model, ids[:1], mask[:1], max_new_tokens=10, temperature=0, eot_id=eot)
    assert alone.shape[1] == 6 + first + 1  # a batch whose rows all ended stops early


def test_any_of_several_eot_ids_ends_a_row() -> None:
    """Llama 3.1 Instruct lists three EOS ids; a turn ends with the third (<|eot_id|>). With
    only the first honoured, generation ran past the end of the answer."""
    model = _model()
    ids, mask = left_padded([3, 6], seed=2)
    greedy = generate(model, ids, mask, max_new_tokens=10, temperature=0)
    second = int(greedy[0, 6 + 1])  # row 0's second new token
    never = next(i for i in range(64) if i not in greedy.tolist()[0] + greedy.tolist()[1])
    out = generate(model, ids[:1], mask[:1], max_new_tokens=10, temperature=0,
                   eot_id=[never, second])
    first = greedy[0, 6:].tolist().index(second)
    assert torch.equal(out[0], greedy[0, :6 + first + 1])  # ended at `second`, not padded on
    assert torch.equal(generate(model, ids[:1], mask[:1], max_new_tokens=10, temperature=0,
                                eot_id=(second,)), out)


def test_prompt_past_block_size_errors_or_slides() -> None:
    model = _model(block_size=12)
    ids, mask = left_padded([7, 4], seed=5)
    generate(model, ids, mask, max_new_tokens=6)  # 7 + 6 - 1 = 12 positions: fits exactly
    with pytest.raises(ValueError, match=r"exceeds block_size=12.*sliding_window=True"):
        generate(model, ids, mask, max_new_tokens=7)
    with pytest.raises(ValueError, match=r"prompt of 1 token \+ max_new_tokens=13 exceeds"):
        generate(model, ids[:1, -1:], max_new_tokens=13)
    out = generate(model, ids, mask, max_new_tokens=15, temperature=0, sliding_window=True)
    assert torch.equal(out, _greedy_by_recomputation(model, ids, mask, 15))
    long_prompt = torch.randint(0, 65, (1, 20), generator=torch.Generator().manual_seed(1))
    out = generate(model, long_prompt, max_new_tokens=4, temperature=0, sliding_window=True)
    expected = _greedy_by_recomputation(model, long_prompt, torch.ones_like(long_prompt), 4)
    assert torch.equal(out, expected)


def test_float_ids_are_not_told_to_add_a_batch_dimension() -> None:
    """A float (B, P) tensor was told "add a batch dimension with input_ids[None]"; it has
    one (GPT.forward's copy of the check said nothing of a fix)."""
    model = _model()
    with pytest.raises(ValueError, match=r"input_ids must be .*torch.float32 of shape "
                       r"\(2, 3\); pass the tokenizer's ids as torch.long"):
        generate(model, torch.zeros(2, 3), max_new_tokens=2)
    with pytest.raises(ValueError, match=r"input_ids has no tokens"):
        generate(model, torch.zeros(2, 0, dtype=torch.long), max_new_tokens=2)


def test_clear_errors() -> None:
    model = _model()
    ids = torch.zeros(2, 3, dtype=torch.long)
    for bad in (-1, float("inf"), float("nan")):  # inf spread NaN through the softmax
        with pytest.raises(ValueError, match=rf"temperature={bad} must be finite and >= 0"):
            generate(model, ids, max_new_tokens=2, temperature=bad)
    with pytest.raises(ValueError, match="top_k=-2"):
        generate(model, ids, max_new_tokens=2, top_k=-2)
    with pytest.raises(ValueError, match=r"top_p=1.5 must be in \[0, 1\]"):
        generate(model, ids, max_new_tokens=2, top_p=1.5)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        generate(model, ids, max_new_tokens=0)
    with pytest.raises(ValueError, match="left-padded"):
        generate(model, ids, torch.tensor([[1, 1, 0], [1, 1, 1]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="attention_mask holds 2"):  # as GPT.forward
        generate(model, ids, torch.tensor([[0, 1, 2], [1, 1, 1]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="seed or generator"):
        generate(model, ids, max_new_tokens=2, seed=1, generator=torch.Generator())
    with pytest.raises(ValueError, match="input_ids\\[None\\]"):
        generate(model, torch.zeros(3, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(ValueError, match="temperature=0 has no distribution"):
        logits_to_probs(torch.zeros(1, 4), temperature=0.0)
    dropout_model = GPT(GPTConfig.from_name("nano", dropout=0.1))
    with pytest.raises(ValueError, match=r"model.eval\(\)"):
        stream(dropout_model, ids, max_new_tokens=2)


def test_decode_step_mask_has_no_square_part() -> None:
    assert build_mask(1, 500).may_attend is None
    padded = build_mask(1, 500, torch.ones(3, 500))
    assert padded.may_attend is not None and padded.may_attend.shape == (3, 1, 1, 500)


def test_stream_yields_the_ids_generate_returns() -> None:
    model = _model()
    ids, mask = left_padded([2, 5])
    steps = list(stream(model, ids, mask, max_new_tokens=6, seed=3))
    assert len(steps) == 6 and all(s.shape == (2,) for s in steps)
    out = generate(model, ids, mask, max_new_tokens=6, seed=3)
    assert torch.equal(torch.stack(steps, 1), out[:, 5:])


def _scripted(rows: list[list[int]]) -> object:
    def fake_stream(*args: object, **kwargs: object) -> Iterator[torch.Tensor]:
        for column in zip(*rows, strict=True):
            yield torch.tensor(column)

    return fake_stream


def test_stream_text_never_splits_a_character(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = get_tokenizer("byte")
    snow = list("é☃!".encode())  # 2-byte, 3-byte, 1-byte characters
    monkeypatch.setattr(generate_mod, "stream", _scripted([snow]))
    pieces = [p[0] for p in stream_text(_model(vocab_size=256), tok, ["a"], max_new_tokens=6)]
    assert "".join(pieces) == "é☃!"
    assert all("\ufffd" not in p for p in pieces)
    assert [p for p in pieces if p] == ["é", "☃", "!"]


def test_a_tokenizer_larger_than_the_model_is_refused_up_front() -> None:
    """A 256-id byte tokenizer on a 65-id model: its prompts may happen to fit, the sampled
    text then means nothing; refused before any step, as load_checkpoint refuses it."""
    with pytest.raises(ValueError, match="tokenizer 'byte' has 256 ids but the model's "
                                         "vocab_size is 65: they belong to different models"):
        generate_text(_model(), get_tokenizer("byte"), ["\n !"], max_new_tokens=3)


@pytest.mark.parametrize("text,stop,expected", [
    ("Hi —bye", " —", "Hi"),       # the stop's second character arrives in 3 bytes
    ("ab😀cd", "b😀", "a"),
    ("1 é 2", " é", "1"),
    ("ok日", "zz", "ok"),           # max_new_tokens cuts 日 short: its part is dropped
])
def test_a_stream_holds_a_stop_start_before_an_unfinished_character(
    text: str, stop: str, expected: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not one character of a stop string is emitted, even where the stop goes on with a
    character still arriving byte by byte (' ' of ' —' was emitted at —'s first byte), and
    no U+FFFD either."""
    tok = get_tokenizer("byte")
    data = list(text.encode())[:-1] if text.endswith("日") else list(text.encode())
    monkeypatch.setattr(generate_mod, "stream", _scripted([data]))
    pieces = [p[0] for p in stream_text(_model(vocab_size=256), tok, ["x"],
                                        max_new_tokens=len(data), stop=[stop])]
    assert "".join(pieces) == expected
    assert not any("\ufffd" in piece for piece in pieces)


def test_stream_text_stops_at_stop_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = get_tokenizer("byte")
    rows = [list(b"ab\nc\n\nde"), list(b"x\ny\nz\n\nw")]
    monkeypatch.setattr(generate_mod, "stream", _scripted(rows))
    model = _model(vocab_size=256)
    steps = list(stream_text(model, tok, ["p", "q"], max_new_tokens=8, stop=["\n\n"]))
    texts = ["".join(s[b] for s in steps) for b in range(2)]
    assert texts == ["ab\nc", "x\ny\nz"]
    assert len(steps) == 7  # both rows ended (steps 6 and 7), so the loop stopped early
    monkeypatch.setattr(generate_mod, "stream", _scripted(rows))
    assert generate_text(model, tok, ["p", "q"], max_new_tokens=8, stop=["zz"]) == [
        "ab\nc\n\nde", "x\ny\nz\n\nw"
    ]
    # one string is one stop string, not a stop at each of its characters
    monkeypatch.setattr(generate_mod, "stream", _scripted(rows))
    assert generate_text(model, tok, ["p", "q"], max_new_tokens=8, stop="\n\n") == [
        "ab\nc", "x\ny\nz"
    ]


def test_generate_text_matches_token_generation() -> None:
    tok = get_tokenizer("char", "abcdefgh \n")
    model = _model(vocab_size=16)
    prompts = ["abc", "h", "fed cba"]
    texts = generate_text(model, tok, prompts, max_new_tokens=10, temperature=0)
    for prompt, text in zip(prompts, texts, strict=True):
        ids = torch.tensor([tok.encode(prompt)])
        alone = generate(model, ids, max_new_tokens=10, temperature=0, vocab_size=tok.vocab_size)
        assert text == tok.decode(alone[0, len(prompt):].tolist())
    config = GenerationConfig(max_new_tokens=10, temperature=0)
    assert generate_text(model, tok, prompts, **dataclasses.asdict(config)) == texts
    with pytest.raises(TypeError, match=r"unknown sampling argument\(s\) \['temprature'\]; "
                                        r"choose from \['compile', "):
        generate_text(model, tok, prompts, max_new_tokens=3, temprature=0.5)


def test_sampling_names_every_stream_argument_the_text_functions_leave_to_the_caller() -> None:
    """SAMPLING is stream()'s keywords less those stream_text sets itself: a keyword added to
    stream reaches generate_text only once it is named here."""
    import inspect

    set_by_stream_text = {"model", "input_ids", "attention_mask", "max_new_tokens", "eot_id",
                          "pad_id", "vocab_size", "unused_ids", "edits"}
    left = set(inspect.signature(stream).parameters) - set_by_stream_text
    assert left == generate_mod.SAMPLING


def test_generate_takes_what_stream_takes() -> None:
    model = _model()
    ids = torch.randint(0, 65, (3, 4), generator=torch.Generator().manual_seed(0))
    kwargs = {"max_new_tokens": 6, "row_seeds": [3, 1, 2], "unused_ids": [5, 7]}
    steps = torch.stack(list(stream(model, ids, **kwargs)), dim=1)  # type: ignore[arg-type]
    assert torch.equal(generate(model, ids, **kwargs)[:, 4:], steps)  # type: ignore[arg-type]
    assert not bool(torch.isin(steps, torch.tensor([5, 7])).any())
    with pytest.raises(TypeError, match=r"input_ids is a list; pass a \(B, P\) tensor"):
        generate(model, [[1, 2, 3]], max_new_tokens=2)  # type: ignore[arg-type]


def test_the_float32_step_is_kept_and_follows_the_weights() -> None:
    """decode_step keeps a float32 model's step (its stacked q/k/v copy) between generations
    and copies q/k/v again each time, so generation computes the weights as they are now:
    after an edit through .data (no version counter sees it), a tracked in-place edit (a new
    step) and a weight replaced by another tensor. Reference: GPT.forward (the edits path)."""
    model = _model(init_std=0.3)
    ids = torch.randint(0, 65, (2, 5), generator=torch.Generator().manual_seed(0))

    def greedy() -> torch.Tensor:
        fast = generate(model, ids, max_new_tokens=10, temperature=0)
        assert torch.equal(fast, generate(model, ids, max_new_tokens=10, temperature=0,
                                          edits=Edits()))
        return fast

    step, before = decode_step(model), greedy()
    assert decode_step(model) is step
    attn = model.blocks[0].attn
    attn.query.weight.data.mul_(-4)  # untracked: the kept step copies q/k/v again
    assert decode_step(model) is step
    edited = greedy()
    assert not torch.equal(edited, before)  # the edit changes what the model says
    with torch.no_grad():
        model.blocks[1].attn.value.weight.mul_(3)  # tracked: a new step
    assert decode_step(model) is not step
    greedy()
    attn.key.weight.data = attn.key.weight.data * -2  # another tensor: a new step
    greedy()


def test_an_empty_prompt_without_an_end_of_text_id_is_named_by_its_index() -> None:
    from attnlab.generate import generate_text
    from attnlab.tokenizers import CharTokenizer

    tok = CharTokenizer(list("abc"))  # no <|endoftext|> to start an empty prompt from
    model = GPT(GPTConfig.from_name("nano", vocab_size=3)).eval()
    with pytest.raises(ValueError, match=r"prompts\[1\] is empty and tokenizer 'char'"):
        generate_text(model, tok, ["ab", ""], max_new_tokens=2)


def test_generation_never_samples_an_id_its_tokenizer_has_no_token_for() -> None:
    """A tokenizer.json with holes in its ids (here 6 tokens among ids 0..99): sampling from
    a random model would pick a hole nearly every step; generate_text leaves them out
    (`Tokenizer.unused_ids`), as it leaves out ids past the tokenizer's vocab_size."""
    from helpers import tokenizer_with_holes

    tok = tokenizer_with_holes()
    model = _model(vocab_size=100)
    text = generate_text(model, tok, ["abc"], max_new_tokens=25, temperature=2.0, seed=0)[0]
    assert re.fullmatch(r"(a|b|c|<unk>|<s>|</s>){25}", text), text
    assert len(tok.unused_ids) == 94


def test_top_p_drops_an_id_once_the_ids_before_it_hold_exactly_top_p() -> None:
    """Four equal ids (probabilities exactly 0.25): sorted ascending, the first two hold
    exactly 1 - top_p = 0.5, so with top_p=0.5 they are dropped and two stay (the smallest
    set holding top_p, as HF's TopP warper); which two is the sort's tie order, here the
    higher ids, as transformers keeps (tests/test_sampling.py compares many more)."""
    four = torch.zeros(1, 4)
    assert (logits_to_probs(four, top_p=0.5) > 0).tolist() == [[False, False, True, True]]
    assert logits_to_probs(torch.zeros(1, 2), top_p=0.5).tolist() == [[0.0, 1.0]]


def test_an_ended_row_is_padded_with_the_eot_id_when_no_pad_id_is_given() -> None:
    """stream's documented default: pad_id None pads an ended row with the (first) eot id."""
    model = _model()
    ids, mask = left_padded([3, 6], seed=2)
    greedy = generate(model, ids, mask, max_new_tokens=10, temperature=0)
    eot = int(greedy[0, 6 + 2])  # row 0's third new token
    out = generate(model, ids, mask, max_new_tokens=10, temperature=0, eot_id=eot)
    row0 = out[0, 6:].tolist()
    first = row0.index(eot)
    assert first < len(row0) - 1  # row 0 ended while row 1 went on
    assert row0[first + 1:] == [eot] * (len(row0) - first - 1)


def test_a_row_ended_stays_ended_when_its_pad_id_is_no_eot_id() -> None:
    """A pad_id that is no eot id (a tokenizer's own pad) fed back does not end the row
    again; the row must stay ended, padded to the last step, while the others sample on. (A
    greedy untrained model repeats the id it was fed, which hides a row that starts again:
    sampling does not.)"""
    model = _model()
    ids, mask = left_padded([3, 6], seed=2)
    kwargs: dict = dict(max_new_tokens=12, temperature=3.0, row_seeds=[1, 2])
    free = generate(model, ids, mask, **kwargs)  # (2, 6 + 12)
    eot = next(int(t) for t in free[0, 6:] if t not in free[1, 6:])  # row 0's alone
    pad = 0 if eot else 1
    out = generate(model, ids, mask, eot_id=eot, pad_id=pad, **kwargs)
    first = free[0, 6:].tolist().index(eot)
    assert first < 11  # row 0 ended before the last step
    assert torch.equal(out[0, :6 + first + 1], free[0, :6 + first + 1])
    assert out[0, 6 + first + 1:].tolist() == [pad] * (11 - first)
    assert torch.equal(out[1], free[1])


@pytest.mark.parametrize("mask", [[[1, 0, 1]], [[0, 1, 1], [1, 0, 1]]])
def test_a_mask_with_a_hole_is_refused_as_not_left_padded(mask: list[list[int]]) -> None:
    """A pad between tokens (not left padding) would give every later token the wrong
    position; generate refuses it, as it refuses a pad in the last column."""
    model = _model()
    m = torch.tensor(mask)
    ids = torch.ones_like(m)
    with pytest.raises(ValueError, match="left-padded"):
        generate(model, ids, m, max_new_tokens=2, temperature=0)


def test_row_seeds_give_each_row_the_ids_it_gets_alone() -> None:
    """row_seeds: one generator per row, so a row's samples do not depend on the rows that
    share its batch: each row of a batch equals that prompt generated alone with its seed."""
    model = _model()
    ids = torch.randint(0, 65, (3, 4), generator=torch.Generator().manual_seed(0))
    seeds = [3, 1, 2]
    batch = generate(model, ids, max_new_tokens=6, row_seeds=seeds)
    for b, seed in enumerate(seeds):
        alone = generate(model, ids[b:b + 1], max_new_tokens=6, row_seeds=[seed])
        assert torch.equal(batch[b:b + 1], alone), b
