"""`attnlab generate --compile`: the flag reaches generation and the compile time is printed.
torch.compile is replaced by the identity here (tests/test_generate_compile.py compiles)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab.model.compiled_decode as compiled_mod
from attnlab import GPT, GPTConfig
from attnlab.checkpoint import save_checkpoint
from attnlab.cli import main
from attnlab.generate import generate_text
from attnlab.tokenizers import get_tokenizer

TEXT = "the quick brown fox jumps over the lazy dog\n"


def test_compile_flag_generates_the_same_text_and_reports_the_compile_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = get_tokenizer("char", TEXT)
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tokenizer.vocab_size, block_size=32,
                                    init_std=0.3)).eval()
    path = save_checkpoint(tmp_path / "ckpt", model, tokenizer)
    compiled: list[Callable[..., Any]] = []

    def identity(fn: Callable[..., Any], **options: Any) -> Callable[..., Any]:
        assert options == {"mode": "reduce-overhead", "fullgraph": True, "dynamic": False}
        compiled.append(fn)
        return fn

    monkeypatch.setattr(compiled_mod.torch, "compile", identity)
    args = ["generate", str(path), "the fox", "--max-new-tokens", "12", "--temperature", "0"]
    assert main([*args, "--compile"]) == 0
    captured = capsys.readouterr()
    expected = generate_text(model, tokenizer, ["the fox"], max_new_tokens=12, temperature=0)[0]
    assert captured.out == "the fox" + expected + "\n"
    assert len(compiled) == 1
    assert "[decode step for 1 row x 32 cache slots compiled in" in captured.err
    assert main(args) == 0  # without the flag: nothing compiled, nothing said about it
    assert len(compiled) == 1 and "compiled in" not in capsys.readouterr().err


def test_compile_and_float16_weights_are_refused_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = get_tokenizer("char", TEXT)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tokenizer.vocab_size)).eval()
    path = save_checkpoint(tmp_path / "ckpt", model, tokenizer)
    assert main(["generate", str(path), "the", "--compile", "--weights", "float16"]) != 0
    assert "--compile reads the model's own weights" in capsys.readouterr().err
