"""A command's files reach --out together (cli/outputs.py): a run stopped halfway leaves the
earlier run's files, whole and side by side."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnlab.viz as viz
from attnlab import GPT, GPTConfig, save_checkpoint
from attnlab.cli import main
from attnlab.cli.outputs import written_together
from attnlab.train.data import load_dataset


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    tokenizer = load_dataset("copy").tokenizer
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=2, n_head=2,
                       n_embd=16)
    return save_checkpoint(tmp_path / "ckpt", GPT(config).eval(), tokenizer,
                           meta={"dataset": "copy"})


RUNS = {  # (an earlier run, the run interrupted): another text, another answer
    "heads": (["abcabc", "--no-ablation"], ["abcab", "--no-ablation"]),
    "lens": (["abcd|ab"], ["abcd|a"]),
    "patch": (["--clean", "abcd|ab", "--corrupt", "abxd|ab", "--answer", "c", "--wrong", "x"],
              ["--clean", "abcd|ab", "--corrupt", "abxd|ab", "--answer", "c", "--wrong", "d"]),
}


@pytest.mark.parametrize("command", sorted(RUNS))
def test_ctrl_c_while_the_figure_is_drawn_keeps_the_earlier_run(
        command: str, checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON was written first, then the figure drawn (a second, matplotlib's import
    included): a Ctrl-C there left the new JSON beside the earlier run's figure."""
    out = tmp_path / "out"
    earlier, interrupted = RUNS[command]
    assert main([command, str(checkpoint), *earlier, "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == [f"{command}.json", f"{command}.png"]

    def drawing(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(viz, "save_figure", drawing)
    capsys.readouterr()
    assert main([command, str(checkpoint), *interrupted, "--out", str(out)]) == 130
    assert capsys.readouterr().err.endswith(f"attnlab {command}: interrupted\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no stage left either


def test_a_failed_first_run_leaves_no_directory(tmp_path: Path) -> None:
    out = tmp_path / "new"
    with pytest.raises(OSError, match="disk full"), written_together(out, "heads") as stage:
        (stage / "heads.json").write_text("{}")
        raise OSError("disk full")
    assert not out.exists()


def test_files_move_in_together_and_a_killed_runs_stage_goes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "heads.json").write_text("old")
    (out / "notes.txt").write_text("the user's")  # not ours: kept
    # the stage of a run killed outright (SIGKILL): its process is gone
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    killed = out / f".heads-{gone.stdout.strip()}-x1"
    killed.mkdir()
    (killed / "heads.json").write_text("half")
    running = out / f".heads-{os.getpid()}-x2"  # a run still going (this one): kept
    running.mkdir()
    with written_together(out, "heads") as stage:
        (stage / "heads.json").write_text("new")
        (stage / "heads.png").write_bytes(b"png")
        assert (out / "heads.json").read_text() == "old"  # nothing moved before the end
    assert sorted(p.name for p in out.iterdir()) == [
        running.name, "heads.json", "heads.png", "notes.txt"]
    assert (out / "heads.json").read_text() == "new"
