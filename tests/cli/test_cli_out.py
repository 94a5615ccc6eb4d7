"""Every command that writes files checks --out before its work: a file there is named with
the fix, in one line, and nothing is loaded or trained first."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnlab import GPT, GPTConfig, load
from attnlab.checkpoint import save_checkpoint
from attnlab.cli import main
from attnlab.tokenizers import get_tokenizer


@pytest.fixture
def ckpt(tmp_path: Path) -> str:
    tokenizer = get_tokenizer("char", "abcdx|")
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", vocab_size=tokenizer.vocab_size)).eval()
    return str(save_checkpoint(tmp_path / "ckpt", model, tokenizer))


def test_a_file_given_as_out_is_named_before_any_work(
    ckpt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine")

    def no_loading(*args: object) -> None:
        raise AssertionError("loaded a model before checking --out")

    monkeypatch.setattr(load, "load_checkpoint", no_loading)
    commands = {
        "heads": ["heads", ckpt],
        "lens": ["lens", ckpt, "abcd"],
        "patch": ["patch", ckpt, "--clean", "abcd", "--corrupt", "xbcd", "--answer", "a",
                  "--wrong", "b"],
        "inspect": ["inspect", ckpt, "abcd"],
        "train": ["train", "--max_iters", "1"],
        "demo": ["demo", "hello"],
        "bench": ["bench", "--quick", "attention"],
    }
    for name, argv in commands.items():
        assert main([*argv, "--out", str(afile)]) == 1, name
        err = capsys.readouterr().err
        assert err == (f"attnlab {name}: error: --out {afile} is a file; give a directory "
                       "(it is created if missing)\n"), name
    assert afile.read_text() == "mine"


def test_patch_names_an_answer_that_is_also_the_wrong_token(
    ckpt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["patch", ckpt, "--clean", "abcd", "--corrupt", "xbcd", "--answer", "a",
            "--wrong", "a", "--out", str(tmp_path / "p")]
    assert main(argv) == 1
    assert "--answer 'a' and --wrong 'a' are the same token" in capsys.readouterr().err
