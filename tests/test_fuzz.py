"""Fuzzing the public entry points: every input gives a correct result or a clear error.

Tokenizers on arbitrary Unicode (lone surrogates included) and arbitrary ids, generation
with degenerate prompts and extreme sampling settings, the CLI with values of the wrong
type, and checkpoints truncated, garbled or mixed from two configs. "Clear" means a
ValueError (or FileNotFoundError) that names the problem from the library, and exit code 1
or 2 with one line on stderr and no traceback from the CLI.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from attnlab import GPT, GPTConfig
from attnlab.checkpoint import load_train_state
from attnlab.cli import main
from attnlab.generate import generate, generate_text, sample
from attnlab.load import load_checkpoint
from attnlab.tokenizers import Tokenizer, get_tokenizer, load_tokenizer
from attnlab.train.data import load_dataset
from attnlab.train.loop import TrainConfig, train

FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
# any code point, controls included, and often a lone surrogate (U+D800..U+DFFF: not text,
# but what errors="surrogateescape" decoding leaves; hypothesis draws them rarely by itself)
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=())
                   | st.sampled_from(["\ud800", "\udc80", "\udfff"]), max_size=60)
VALID_TEXT = st.text(max_size=60)  # hypothesis leaves surrogates out by default


def has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


# ----------------------------------------------------------------------------- tokenizers

_BPE: dict[str, Tokenizer] = {}


def bpe() -> Tokenizer:
    if not _BPE:
        _BPE["bpe"] = get_tokenizer("bpe:300", "the quick brown fox jumps over the lazy dog\n" * 20)
    return _BPE["bpe"]


def make(kind: str, corpus: str) -> Tokenizer:
    return bpe() if kind == "bpe" else get_tokenizer(kind, corpus)


@FUZZ
@given(kind=st.sampled_from(["char", "word", "byte", "bpe"]), corpus=ANY_TEXT, text=ANY_TEXT)
def test_encode_round_trips_or_names_the_problem(kind: str, corpus: str, text: str) -> None:
    try:
        tok = make(kind, corpus)
    except ValueError as err:
        assert kind in ("char", "word") and "text is empty" in str(err)
        return
    try:
        ids = tok.encode(text)
    except ValueError as err:
        assert "cannot encode" in str(err) and "position" in str(err), err
        assert kind in ("char", "word") or has_surrogate(text)
        return
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert len(tok.pieces(ids)) == len(ids)


@FUZZ
@given(kind=st.sampled_from(["char", "word", "byte", "bpe"]), corpus=VALID_TEXT.filter(str.strip),
       ids=st.lists(st.integers(-2**40, 2**40) | st.integers(-3, 400), max_size=20))
def test_decode_of_any_ids_is_text_or_names_the_id(kind: str, corpus: str, ids: list[int]) -> None:
    tok = make(kind, corpus)
    bad = [i for i in ids if not 0 <= i < tok.vocab_size]
    try:
        text = tok.decode(ids)
    except ValueError as err:
        assert bad and f"cannot decode id {bad[0]}" in str(err), err
        with pytest.raises(ValueError, match="cannot decode id"):
            tok.pieces(ids)
        return
    assert not bad and isinstance(text, str)
    if kind in ("char", "word"):  # one piece per id, no byte merging
        assert text == "".join(tok.decode([i]) for i in ids)


@settings(max_examples=15, deadline=None)
@given(kind=st.sampled_from(["char", "word", "bpe"]), corpus=ANY_TEXT)
def test_trained_tokenizers_save_and_load_or_refuse(kind: str, corpus: str) -> None:
    try:
        tok = get_tokenizer(kind if kind != "bpe" else "bpe:260", corpus)
    except ValueError as err:  # empty text, or a surrogate BPE training cannot take
        assert "empty" in str(err) or has_surrogate(corpus), err
        return
    with tempfile.TemporaryDirectory() as tmp:
        try:
            tok.save(tmp)
        except ValueError as err:  # UTF-8 files cannot hold lone surrogates
            assert has_surrogate(corpus) and "surrogate" in str(err), err
            return
        again = load_tokenizer(tmp)
    assert again.vocab_size == tok.vocab_size
    if not has_surrogate(corpus):
        assert again.encode(corpus) == tok.encode(corpus)


# ----------------------------------------------------------------------------- generate

V = 11


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=V, block_size=12, n_layer=1, n_head=2, n_embd=8)).eval()


@torch.no_grad()
def greedy(model: GPT, ids: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


NUMBERS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0.0, -0.0, 1e-6, 1e-30, 1e30, 1e308, -1.0, 1.0])
SETTINGS = dict(
    temperature=NUMBERS.filter(lambda t: not 0 < abs(t) < 1e-6),  # see test_tiny_temperature
    top_k=st.integers(-2, 2 * V) | st.sampled_from([0, 1, V, V + 1, 10**30, -(10**30)]),
    top_p=NUMBERS,
    seed=st.none() | st.integers(-(2**70), 2**70),
    max_new_tokens=st.integers(-2, 14),
)


def documented_valid(prompt_len: int, pad: int, *, temperature: float, top_k: int,
                     top_p: float, seed: int | None, max_new_tokens: int) -> bool:
    """Whether generate's documented rules (GenerationConfig's comments, `stream`'s and
    `_check_prompt`'s, docs/generate.md) take these settings for the 12-position model: a token
    in every row; max_new_tokens >= 1, the prompt and all new tokens but the last within
    block_size; temperature finite and >= 0 (0 = greedy); top_k an integer >= 0 (0 or >= V =
    all); top_p in [0, 1]; a seed torch.Generator.manual_seed takes (-2**63 to 2**64 - 1)."""
    return (prompt_len >= 1 and max_new_tokens >= 1 and pad + prompt_len + max_new_tokens - 1
            <= 12 and 0 <= temperature < math.inf and top_k >= 0 and 0 <= top_p <= 1
            and (seed is None or -(2**63) <= seed < 2**64))


@FUZZ
@given(prompt_len=st.integers(0, 4), pad=st.integers(0, 4), rows=st.integers(1, 3),
       **SETTINGS)
# the edges of the documented ranges, every one valid
@example(prompt_len=2, pad=1, rows=2, temperature=1e30, top_k=10**30, top_p=1.0,
         seed=2**64 - 1, max_new_tokens=3)
@example(prompt_len=1, pad=0, rows=1, temperature=-0.0, top_k=V + 1, top_p=0.0,
         seed=-(2**63), max_new_tokens=12)
@example(prompt_len=3, pad=0, rows=1, temperature=1e308, top_k=0, top_p=1e-30, seed=None,
         max_new_tokens=1)
def test_generate_extreme_settings(model: GPT, prompt_len: int, pad: int, rows: int,
                                   **kwargs: Any) -> None:
    """A result where the documented rules take the settings, a ValueError with a message
    where they do not: a valid setting refused fails, not only an invalid one taken."""
    g = torch.Generator().manual_seed(prompt_len * 7 + pad)
    ids = torch.randint(0, V, (rows, pad + prompt_len), generator=g)  # (B, P)
    mask = torch.ones_like(ids)
    mask[:, :pad] = 0  # left padding; prompt_len 0 leaves rows of nothing but padding
    valid = documented_valid(prompt_len, pad, **kwargs)
    try:
        out = generate(model, ids, mask if pad else None, **kwargs)
    except ValueError as err:
        assert str(err), "an empty message names nothing"
        assert not valid, f"documented-valid settings {kwargs} refused: {err}"
        return
    n = kwargs["max_new_tokens"]
    assert valid, f"settings {kwargs} taken, against the documented rules"
    assert out.shape == (rows, pad + prompt_len + n) and torch.equal(out[:, :ids.shape[1]], ids)
    assert bool(((out >= 0) & (out < V)).all())
    narrowest = kwargs["temperature"] == 0 or kwargs["top_k"] == 1 or kwargs["top_p"] == 0
    if narrowest and not pad:
        assert torch.equal(out, greedy(model, ids, n))


@pytest.mark.parametrize("temperature", [1e-38, 1e-40, 5e-324])
def test_tiny_temperature_tends_to_greedy(temperature: float) -> None:
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(0)) * 10  # (B, V)
    assert torch.equal(sample(logits, temperature=temperature), logits.argmax(-1))


@pytest.mark.parametrize("prompts", [[""], ["", "ab"], ["\ud800"]])
def test_generate_text_with_empty_or_invalid_prompts(model: GPT, prompts: list[str]) -> None:
    char = get_tokenizer("char", "abcdefghijk")
    with pytest.raises(ValueError, match=r"empty|surrogate|cannot encode"):
        generate_text(model, char, prompts, max_new_tokens=2)


# ----------------------------------------------------------------------------- CLI


def run_cli(argv: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of `attnlab ARGV`, whether it returns or exits."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
    return code, err.getvalue()


def assert_one_line_error(code: int, err: str, *names: str) -> None:
    assert code in (1, 2), (code, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert any(name in err for name in names), (names, err)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained checkpoint (weights, config, tokenizer, train state) of a 2-step run."""
    out = tmp_path_factory.mktemp("run")
    dataset = load_dataset("copy")
    config = GPTConfig(vocab_size=dataset.tokenizer.vocab_size, block_size=dataset.max_block_size,
                       n_layer=1, n_head=1, n_embd=8)
    train(config, TrainConfig(max_iters=2, batch_size=2, eval_interval=2, eval_iters=1),
          dataset, out)
    return out / "ckpt"


NOT_INT = st.sampled_from(["two", "1.5", "", "1e3", "0x10", "nan", "- 1", "1_"])
NOT_POSITIVE = st.integers(-(10**12), 0).map(str)
# (command, flag, values that are each wrong for it); CHECKPOINT is filled in per test
CASES = st.one_of(
    st.tuples(st.just("train"), st.sampled_from(["--n_layer", "--n_head", "--n_embd",
              "--block_size", "--max_iters", "--batch_size", "--eval_interval", "--eval_iters",
              "--grad_accum"]), NOT_INT | NOT_POSITIVE),
    st.tuples(st.just("train"), st.sampled_from(["--lr", "--weight_decay", "--grad_clip"]),
              st.sampled_from(["abc", "-1", "-1e-9", "1,5", "--"])),
    st.tuples(st.just("train"), st.just("--lr"), st.just("nan")),
    st.tuples(st.just("train"), st.just("--dropout"), st.sampled_from(["1", "-0.1", "7", "x"])),
    st.tuples(st.just("train"), st.sampled_from(["--bias", "--compile", "--mlp"]),
              st.sampled_from(["maybe", "2", ""])),
    st.tuples(st.just("train"), st.sampled_from(["--dtype", "--optimizer"]),
              st.sampled_from(["float16", "adam", ""])),
    st.tuples(st.just("train"), st.just("--threads"), NOT_INT | NOT_POSITIVE),
    st.tuples(st.just("generate"), st.sampled_from(["--max-new-tokens", "--batch-size",
              "--threads"]), NOT_INT | NOT_POSITIVE),
    st.tuples(st.just("generate"), st.just("--temperature"), st.sampled_from(["-1", "hot", "nan"])),
    st.tuples(st.just("generate"), st.just("--top-k"), st.sampled_from(["-1", "1.5", "all"])),
    st.tuples(st.just("generate"), st.just("--top-p"),
              st.sampled_from(["-0.1", "1.5", "nan", "p"])),
    st.tuples(st.just("generate"), st.just("--seed"), NOT_INT),
    st.tuples(st.just("serve"), st.just("--port"), NOT_INT | st.sampled_from(["0", "-1", "70000"])),
    st.tuples(st.just("serve"), st.sampled_from(["--max_body_bytes", "--max_new_tokens",
              "--max_text_chars"]), NOT_INT | NOT_POSITIVE),
)


@FUZZ
@given(case=CASES)
def test_cli_wrong_values_get_one_line(
    tiny_run: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[str, str, str]
) -> None:
    command, flag, value = case

    def accepted(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"{command} {flag}={value!r} was accepted")

    import uvicorn

    monkeypatch.setattr(uvicorn, "run", accepted)  # never serve or train for real here
    monkeypatch.setattr(sys.modules["attnlab.train.loop"], "train", accepted)
    with tempfile.TemporaryDirectory() as tmp:
        monkeypatch.chdir(tmp)  # a run that wrongly starts writes nothing into the repo
        where = {"train": ["--quiet", "--out", str(Path(tmp) / "run")],
                 "generate": [str(tiny_run), "hi"], "serve": [str(tiny_run)]}[command]
        code, err = run_cli([command, *where, f"{flag}={value}"])
    # the message names the flag (argparse, CLI checks) or its config field (validation)
    assert_one_line_error(code, err, flag, flag.lstrip("-").replace("-", "_"))


@pytest.mark.parametrize("field", ["grad_clip", "weight_decay", "lr"])
def test_non_finite_training_numbers_are_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{field: float("nan" if field != "lr" else "inf")})


# ----------------------------------------------------------------------------- checkpoints

FILES = ["model.safetensors", "config.json", "train_state.pt", "tokenizer_config.json"]


@contextlib.contextmanager
def damaged_copy(source: Path, name: str, damage: Any) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt"
        shutil.copytree(source, ckpt)
        path = ckpt / name
        path.write_bytes(damage(path.read_bytes()))
        yield ckpt


def check_loading(ckpt: Path) -> None:
    """Each loader gives its result or a clear error; `attnlab info` one line or success."""
    try:
        load_checkpoint(ckpt)
    except (ValueError, FileNotFoundError) as err:
        assert str(ckpt) in str(err), err  # names the file or directory
    try:
        state = load_train_state(ckpt)
        assert isinstance(state, dict)
    except (ValueError, FileNotFoundError) as err:
        assert str(ckpt) in str(err), err
    code, err = run_cli(["info", str(ckpt)])
    if code != 0:
        assert_one_line_error(code, err, str(ckpt))


@FUZZ
@given(name=st.sampled_from(FILES), where=st.floats(0, 1), data=st.data())
def test_truncated_or_garbled_checkpoints(tiny_run: Path, name: str, where: float,
                                          data: st.DataObject) -> None:
    garbage = data.draw(st.binary(min_size=1, max_size=16) | st.just(b"\x00" * 64))
    truncate = data.draw(st.booleans())

    def damage(blob: bytes) -> bytes:
        at = int(where * len(blob))
        return blob[:at] if truncate else blob[:at] + garbage + blob[at + len(garbage):]

    with damaged_copy(tiny_run, name, damage) as ckpt:
        check_loading(ckpt)


@pytest.mark.parametrize("name", FILES)
def test_missing_files(tiny_run: Path, name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt"
        shutil.copytree(tiny_run, ckpt)
        (ckpt / name).unlink()
        check_loading(ckpt)
        if name != "train_state.pt":
            with pytest.raises(FileNotFoundError, match=name):
                load_checkpoint(ckpt)


BAD_JSON = [
    ("config.json", {"model": {"n_layer": "1"}}, "n_layer='1' is not of type int"),
    ("config.json", {"model": {"init_std": "x"}}, "init_std='x'"),
    ("config.json", {"model": {"attn_scale": [1]}}, "attn_scale=[1]"),
    ("config.json", {"model": {"bias": "yes"}}, "bias='yes'"),
    ("config.json", {"model": {"dropout": float("nan")}}, "dropout=nan"),
    ("config.json", {"model": {"n_layer": True}}, "n_layer=True"),
    ("config.json", {"model": {"n_embd": 16}}, "another config"),
    ("config.json", {"model": {"colour": 1}}, "unknown GPTConfig fields ['colour']"),
    ("config.json", {"model": None}, "not an object"),
    ("config.json", {"meta": "ab"}, "meta is str"),
    ("tokenizer_config.json", {"chars": 5}, "'chars' must be a list of strings"),
    ("tokenizer_config.json", {"chars": ["a"] * 99}, "has 99 ids but the model's vocab_size is"),
    ("tokenizer_config.json", {"type": "bpe"}, "no tokenizer file"),
    ("tokenizer_config.json", {"type": "nope"}, "unknown tokenizer type 'nope'"),
    ("tokenizer_config.json", {"type": None, "chars": None}, "unknown tokenizer type None"),
]


@pytest.mark.parametrize(("name", "change", "message"), BAD_JSON)
def test_json_that_parses_but_is_wrong(tiny_run: Path, name: str, change: dict[str, Any],
                                       message: str) -> None:
    def damage(blob: bytes) -> bytes:
        config = json.loads(blob)
        for key, value in change.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
        return json.dumps(config).encode()

    with damaged_copy(tiny_run, name, damage) as ckpt:
        with pytest.raises((ValueError, FileNotFoundError), match=re.escape(message)):
            load_checkpoint(ckpt)
        assert_one_line_error(*run_cli(["info", str(ckpt)]), message)


def test_weights_from_another_config(tiny_run: Path, tmp_path: Path) -> None:
    """model.safetensors of a wider model under this config.json: refused, not misread."""
    dataset = load_dataset("copy")
    wider = GPTConfig(vocab_size=dataset.tokenizer.vocab_size, block_size=dataset.max_block_size,
                      n_layer=1, n_head=1, n_embd=16)
    train(wider, TrainConfig(max_iters=1, batch_size=2, eval_iters=1), dataset, tmp_path)
    other = (tmp_path / "ckpt" / "model.safetensors").read_bytes()
    with damaged_copy(tiny_run, "model.safetensors", lambda _: other) as ckpt:
        with pytest.raises(ValueError, match="belongs to another config"):
            load_checkpoint(ckpt)
        assert_one_line_error(*run_cli(["info", str(ckpt)]), "another config")
