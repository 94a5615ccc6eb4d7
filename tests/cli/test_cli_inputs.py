"""What commands are given is checked before their work and named in the error: --out naming
a file (nothing is loaded or trained first), an input the tokenizer cannot encode (which
flag, and advice that applies), a directory given as a file."""

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
    monkeypatch.setattr(load, "open_checkpoint", no_loading)  # the model commands' way in
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
        # below a file no directory can be made: said before any work, too
        assert main([*argv, "--out", str(afile / "sub")]) == 1, name
        assert f"{afile} is a file, so no directory can be made below it" in (
            capsys.readouterr().err), name
    assert afile.read_text() == "mine"


def test_patch_names_an_answer_that_is_also_the_wrong_token(
    ckpt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["patch", ckpt, "--clean", "abcd", "--corrupt", "xbcd", "--answer", "a",
            "--wrong", "a", "--out", str(tmp_path / "p")]
    assert main(argv) == 1
    assert "--answer 'a' and --wrong 'a' are the same token" in capsys.readouterr().err


def test_text_the_tokenizer_cannot_encode_is_named_by_its_flag(
    ckpt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    common = ["--out", str(tmp_path / "o")]
    assert main(["patch", ckpt, "--clean", "abcd", "--corrupt", "xbcd", "--answer", "Z",
                 "--wrong", "a", *common]) == 1
    assert capsys.readouterr().err.startswith(
        "attnlab patch: error: --answer: char tokenizer cannot encode character 'Z'")
    assert main(["lens", ckpt, "abZ", *common]) == 1
    assert capsys.readouterr().err.startswith(
        "attnlab lens: error: the text: char tokenizer cannot encode character 'Z'")
    text = tmp_path / "text.txt"
    text.write_text("abZ" * 100)
    assert main(["train", "--init_from", ckpt, "--data", str(text), *common]) == 1
    err = capsys.readouterr().err
    assert "cannot encode character 'Z'" in err and "--tokenizer" not in err
    assert err.endswith(f"the model of --init_from {ckpt} reads only its own tokenizer's "
                        "tokens, so give data they cover\n")
    assert main(["generate", ckpt, "--prompt-file", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (f"attnlab generate: error: --prompt-file {tmp_path} is "
                                       "a directory; give a text file with one prompt per "
                                       "line\n")


def test_train_refuses_an_out_that_is_a_model_and_init_from_a_built_in(
    ckpt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run saves into OUT/ckpt: with OUT a model directory (or a run's own ckpt) it was
    saved where nothing that loads OUT looks, and --resume then advised training afresh."""
    for resume in ([], ["--resume"]):
        assert main(["train", "--max_iters", "1", "--out", ckpt, *resume]) == 1
        assert capsys.readouterr().err.endswith(
            f"--out {ckpt} holds a model (config.json); a run keeps its checkpoint in "
            f"DIR/ckpt: pass --out {Path(ckpt).parent}\n")
    assert not (Path(ckpt) / "ckpt").exists()
    # --data copy was given: "--init_from needs --data" said otherwise
    assert main(["train", "--data", "copy", "--init_from", ckpt,
                 "--out", str(tmp_path / "run")]) == 1
    assert capsys.readouterr().err.endswith(
        "--init_from fine-tunes on text; --data copy is a built-in task with its own "
        "tokenizer: give a text file or folder\n")


def test_init_from_counts_what_training_holds_and_words_the_refusal_as_flags(
    ckpt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fine-tuning on the CPU holds the loaded weights and, beside them, the run's own copy,
    its gradients and AdamW's two moments: free memory for twice the weights passed the check
    before, and the refusal spoke the API's words (dtype=torch.bfloat16, force=True)."""
    import attnlab.model.memory as memory

    text = tmp_path / "text.txt"
    text.write_text("abcdx|" * 50)
    weights = 4 * sum(p.numel() for p in load.load_checkpoint(ckpt).model.parameters())
    monkeypatch.setattr(memory, "available_bytes", lambda device: 3 * weights)
    argv = ["train", "--init_from", ckpt, "--data", str(text), "--device", "cpu",
            "--max_iters", "1", "--out", str(tmp_path / "run")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"--init_from {ckpt}: " in err and "AdamW's two moments" in err
    assert "--force" in err and "force=True" not in err and "dtype=" not in err


def test_under_torchrun_only_rank_0_removes_the_run_overwrite_replaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank deleted the old checkpoint at once, and one found its files gone
    ('No such file or directory: model.safetensors') now and then."""
    from attnlab.cli import train as train_cli

    out = tmp_path / "run"
    assert main(["train", "--max_iters", "2", "--eval_interval", "1", "--quiet", "--out",
                 str(out)]) == 0
    removed: list[int] = []
    monkeypatch.setattr(train_cli, "_remove_checkpoint", lambda ckpt: removed.append(1))
    monkeypatch.setattr(train_cli, "_train", lambda *args: (_ for _ in ()).throw(
        KeyboardInterrupt))  # stop right after the configs: no training needed here
    for rank, expected in (("1", []), ("0", [1])):
        monkeypatch.setenv("RANK", rank)
        removed.clear()
        assert main(["train", "--max_iters", "2", "--out", str(out), "--overwrite",
                     "--quiet"]) == 130  # the stop _train stands in for
        assert removed == expected, rank
