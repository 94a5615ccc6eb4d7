"""`attnlab train --resume` end to end, in-process: the printed hint continues a stopped run
as it began, a finished run has nothing to resume, and a resume is refused where it would
change what the run learns (other text, tokenizer, architecture or recipe flags), where its
checkpoint is missing or damaged, and beside --overwrite."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.cli import main
from attnlab.load import load_checkpoint
from helpers import cli_train


def test_resume_without_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_train(tmp_path, "--resume") == 1
    assert "no checkpoint" in capsys.readouterr().err


def test_resume_and_overwrite_together_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the run was resumed and --overwrite ignored
    assert cli_train(tmp_path, "--max_iters", "2", "--n_layer", "1") == 0
    capsys.readouterr()
    assert cli_train(tmp_path, "--resume", "--overwrite", "--max_iters", "4") == 1
    assert "--overwrite deletes it to start over: choose one" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["step"] == 2


def _stop_after(monkeypatch: pytest.MonkeyPatch, steps: int) -> None:
    """Make the training loop see a Ctrl-C after `steps` optimizer steps."""
    from attnlab.train import loop as train_module

    class StopAfter(train_module.StopFlag):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.reads = 0

        @property
        def requested(self) -> bool:  # read once per step, before it
            self.reads += 1
            return self.reads > steps

        @requested.setter
        def requested(self, value: bool) -> None:
            pass

    monkeypatch.setattr(train_module, "StopFlag", StopAfter)


def _eval_rows(run: Path) -> list[int]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "val_loss" in r]


def test_the_printed_resume_hint_continues_the_run_as_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the hint used to drop --max_iters: a 30-step run interrupted and resumed ran the
    # recipe's 600 steps; and --resume on a finished run re-ran it and logged a second eval
    monkeypatch.chdir(tmp_path)
    _stop_after(monkeypatch, 12)
    flags = ["--max_iters", "30", "--eval_interval", "10", "--lr", "2e-3"]
    assert main(["train", "--quiet", *flags]) == 130
    out = capsys.readouterr().out
    # the loss printed is the evaluation's at step 10, not the checkpoint's step 12
    assert re.search(r"^val loss [0-9.]+ at step 10 \(the last evaluation\)", out, re.M), out
    hint = out.split("continue with: ")[1].splitlines()[0]
    assert hint == "attnlab train --data copy --out runs/copy --resume"
    assert main(["info", "runs/copy/ckpt"]) == 0  # info says so too
    assert re.search(r"^trained +12 steps on copy, val loss [0-9.]+ at step 10$",
                     capsys.readouterr().out, re.M)
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)

    assert main([*shlex.split(hint)[1:], "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "resumed  from step 12 of 30" in out and "before" not in out
    ckpt = load_checkpoint(tmp_path / "runs" / "copy" / "ckpt")
    assert ckpt.meta["step"] == 30 and ckpt.meta["train_config"]["lr"] == 2e-3
    assert _eval_rows(tmp_path / "runs" / "copy") == [10, 20, 30]

    assert main([*shlex.split(hint)[1:], "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "is at step 30 of 30; nothing to resume" in out and "before" not in out
    assert _eval_rows(tmp_path / "runs" / "copy") == [10, 20, 30]

    # a safe flag given again changes the run and says so; one that changes what is learned
    # is refused with the flags a resume may change
    assert main([*shlex.split(hint)[1:], "--quiet", "--max_iters", "35"]) == 0
    out = capsys.readouterr().out
    assert "changed: --max_iters 30 -> 35" in out and "resumed  from step 30 of 35" in out
    assert main([*shlex.split(hint)[1:], "--quiet", "--max_iters", "40", "--lr", "1e-3"]) == 1
    err = capsys.readouterr().err
    assert "--lr 0.002 -> 0.001" in err and "--max_iters" in err
    assert load_checkpoint(tmp_path / "runs" / "copy" / "ckpt").meta["step"] == 35


def test_a_text_run_resumes_from_its_own_file_and_refuses_another_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--resume without --data reads the file the run trained on (the checkpoint keeps its
    path); the same name over other text is refused (the checkpoint keeps a hash of it), and
    the same text under another name resumes."""
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    small = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "16",
             "--eval_interval", "5", "--eval_iters", "1"]
    assert cli_train(tmp_path, "--data", str(text), *small, "--max_iters", "5") == 0
    meta = load_checkpoint(tmp_path / "run" / "ckpt").meta
    assert meta["data_source"] == str(text.resolve()) and len(meta["data_fingerprint"]) == 20
    capsys.readouterr()
    assert cli_train(tmp_path, "--resume", "--max_iters", "8") == 0  # no --data
    out = capsys.readouterr().out
    assert "resumed  from step 5 of 8" in out and "text.txt" in out
    # a --max_iters the run already passed: refused, and nothing said changed first
    assert cli_train(tmp_path, "--resume", "--max_iters", "6") == 1
    out, err = capsys.readouterr()
    assert "changed" not in out
    assert "is at step 8; --max_iters 6 would not train it further" in err
    assert cli_train(tmp_path, "--resume", "--eval_interval", "3") == 0  # finished: not an error
    assert "is at step 8 of 8; nothing to resume" in capsys.readouterr().out
    other = tmp_path / "other" / "text.txt"
    other.parent.mkdir()
    other.write_text("that is the question, not to be or to be\n" * 30)  # same name and
    # characters, other text
    assert cli_train(tmp_path, "--data", str(other), "--resume", "--max_iters", "10") == 1
    assert "is not the text" in capsys.readouterr().err
    # other text with characters the run's tokenizer lacks: named as the wrong data
    foreign = tmp_path / "foreign.txt"
    foreign.write_text("# Zebra!\n" * 50)
    assert cli_train(tmp_path, "--data", str(foreign), "--resume", "--max_iters", "10") == 1
    err = capsys.readouterr().err
    assert "cannot encode character '#'" in err
    assert err.endswith("trained on 'text.txt': resume on that\n")
    moved = tmp_path / "renamed.txt"
    text.rename(moved)  # the run's file is gone: --data is needed, and the message says so
    assert cli_train(tmp_path, "--resume", "--max_iters", "10") == 1
    assert "trained on 'text.txt' from" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["step"] == 8
    # the same text under another name: resumed (it was refused by its name)
    assert cli_train(tmp_path, "--data", str(moved), "--resume", "--max_iters", "10") == 0
    assert "--data text.txt -> renamed.txt (the same text)" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["step"] == 10


def test_resume_refuses_another_tokenizer_or_arch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --tokenizer and --arch are no config fields: a byte run resumed with --tokenizer char
    # went on training on char ids (and saved the char tokenizer), --arch llama was ignored
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    small = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "16",
             "--eval_interval", "4", "--eval_iters", "1"]
    assert cli_train(tmp_path, "--data", str(text), "--tokenizer", "byte", *small,
                  "--max_iters", "4") == 0
    capsys.readouterr()
    for flags, said in ((["--tokenizer", "char"], "--tokenizer byte (256 ids) -> char ("),
                        (["--arch", "llama"], "--arch gpt2 -> llama")):
        assert cli_train(tmp_path, "--resume", "--max_iters", "8", *flags) == 1
        assert said in capsys.readouterr().err
    ckpt = load_checkpoint(tmp_path / "run" / "ckpt")
    assert ckpt.meta["step"] == 4 and ckpt.tokenizer.name == "byte"
    # the flags as the run began are no change
    assert cli_train(tmp_path, "--resume", "--max_iters", "8", "--tokenizer", "byte",
                  "--arch", "gpt2") == 0, capsys.readouterr().err
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["step"] == 8


def test_a_damaged_checkpoint_is_refused_before_resuming(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a missing train state printed "resumed from step 12 of 30" and then failed; a weights
    # file cut short on a finished run said "nothing to resume" and exited 0
    _stop_after(monkeypatch, 12)
    assert cli_train(tmp_path, "--max_iters", "30") == 130
    monkeypatch.undo()
    capsys.readouterr()
    ckpt = tmp_path / "run" / "ckpt"
    (ckpt / "train_state.pt").rename(tmp_path / "state.pt")
    assert cli_train(tmp_path, "--resume") == 1
    out, err = capsys.readouterr()
    assert "resumed" not in out and "has no train_state.pt" in err and "--overwrite" in err
    # a state file cut short: refused before "resumed" too
    whole = (tmp_path / "state.pt").read_bytes()
    (ckpt / "train_state.pt").write_bytes(whole[:3000])
    assert cli_train(tmp_path, "--resume") == 1
    out, err = capsys.readouterr()
    assert "resumed" not in out and "refusing or unable to load" in err and "train_state.pt" in err
    assert main(["info", str(ckpt)]) == 0  # info agrees: it said "resumable yes"
    assert re.search(r"^resumable +no \(refusing or unable to load .*train_state\.pt",
                     capsys.readouterr().out, re.M)
    # a state without the optimizer's moments would restart them from zero: refused
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    state["optimizer"]["state"] = {}
    torch.save(state, ckpt / "train_state.pt")
    assert cli_train(tmp_path, "--resume") == 1
    assert "holds moments for 0 of" in capsys.readouterr().err
    (ckpt / "train_state.pt").unlink()
    (tmp_path / "state.pt").rename(ckpt / "train_state.pt")
    assert cli_train(tmp_path, "--resume") == 0
    out = capsys.readouterr().out
    assert "resumed  from step 12 of 30" in out
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert cli_train(tmp_path, "--resume") == 1  # finished, and damaged
    out, err = capsys.readouterr()
    assert "nothing to resume" not in out and "model.safetensors is missing or damaged" in err
    assert cli_train(tmp_path, "--resume", "--max_iters", "40") == 1  # refused before "changed"
    out, err = capsys.readouterr()
    assert "changed" not in out and "model.safetensors is missing or damaged" in err


def test_resuming_with_another_process_count_says_dropout_will_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _stop_after(monkeypatch, 3)
    flags = ["--max_iters", "6", "--eval_interval", "3", "--dropout", "0.1", "--quiet"]
    assert main(["train", *flags]) == 130
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    config_file = tmp_path / "runs" / "copy" / "ckpt" / "config.json"
    config = json.loads(config_file.read_text())
    assert config["meta"]["world_size"] == 1
    config["meta"]["world_size"] = 2  # as if torchrun --nproc_per_node 2 had saved it
    config_file.write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["train", "--resume", "--quiet"]) == 0
    assert ("resume   the run used 2 processes, this one 1 process: dropout draws other masks"
            in capsys.readouterr().out)


def _interrupt_at_evaluation(monkeypatch: pytest.MonkeyPatch, nth: int, times: int) -> None:
    """Send this process `times` SIGINTs during the loop's `nth` evaluation (1-based)."""
    import os
    import signal

    from attnlab.train import loop as train_module

    original, seen = train_module.evaluate, [0]

    def evaluate(*args: object, **kwargs: object) -> dict[str, float]:
        seen[0] += 1
        if seen[0] == nth:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(train_module, "evaluate", evaluate)


def test_ctrl_c_in_the_last_evaluation_still_saves_it_and_a_second_names_the_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last evaluation runs under the stop flag too: a Ctrl-C there lets it finish and
    save (it raised KeyboardInterrupt, and the checkpoint stayed at the one before). A
    second Ctrl-C quits at once and says where the last checkpoint is and how to go on."""
    flags = ["--max_iters", "20", "--eval_interval", "10", "--n_layer", "1"]
    _interrupt_at_evaluation(monkeypatch, nth=2, times=1)  # the last: at step 20
    assert cli_train(tmp_path, *flags) == 0
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["step"] == 20
    capsys.readouterr()
    _interrupt_at_evaluation(monkeypatch, nth=2, times=2)
    assert cli_train(tmp_path / "again", *flags) == 130
    err = capsys.readouterr().err
    run = tmp_path / "again" / "run"
    assert (f"quit: the last checkpoint, at step 10, is {run / 'ckpt'}; continue with: "
            f"attnlab train --data copy --out {run} --resume") in err
    monkeypatch.undo()
    _stop_after(monkeypatch, 1)  # resumed, then stopped before any evaluation of its own
    assert cli_train(tmp_path / "again", *flags, "--resume") == 130
    # the checkpoint's evaluation is still the one reported (it read as none)
    assert re.search(r"^val loss [0-9.]+ at step 10 \(the last evaluation\)",
                     capsys.readouterr().out, re.M)


def test_a_patience_run_that_ended_has_nothing_to_resume(tmp_path: Path) -> None:
    """A --patience run's checkpoint keeps its best evaluation's step, so where it ended
    comes from metrics.jsonl: `patience` evaluations past the best, or max_iters."""
    from attnlab.cli.train_resume import patience_end

    metrics = tmp_path / "metrics.jsonl"
    losses = {10: 3.0, 20: 2.0, 30: 2.5, 40: 2.2}
    metrics.write_text("".join(json.dumps({"step": s, "val_loss": v}) + "\n"
                               for s, v in losses.items()) + '{"step": 41, "loss": 1}\n')
    assert patience_end(metrics, patience=2, max_iters=100) == 40
    assert patience_end(metrics, patience=3, max_iters=100) is None  # it had more to go
    assert patience_end(metrics, patience=3, max_iters=40) == 40
    assert patience_end(tmp_path / "gone.jsonl", patience=1, max_iters=40) is None


def test_the_resume_hint_of_a_torchrun_run_continues_under_torchrun(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run as printed, a 2-process run's hint resumed it in one process."""
    import argparse

    from attnlab.cli.train_report import resume_command

    args = argparse.Namespace(data="my text.txt")
    assert resume_command(args, Path("runs/x")) == (
        "attnlab train --data 'my text.txt' --out runs/x --resume")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert resume_command(args, Path("runs/x")) == (
        "torchrun --standalone --nproc_per_node 2 -m attnlab train --data 'my text.txt' "
        "--out runs/x --resume")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # two nodes of one process each
    assert resume_command(args, Path("runs/x")).startswith(
        "torchrun --nnodes 2 --nproc_per_node 1 <this run's --rdzv flags, on each node> -m "
        "attnlab train")


def test_a_max_iters_the_run_has_reached_is_refused_not_taken_for_its_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run stopped at step 4 of 8, resumed with --max_iters 4: the user asked for more
    steps than it has and would get none, which is said as an error, not as a finished
    run."""
    assert cli_train(tmp_path, "--max_iters", "4", "--eval_interval", "2",
                     "--n_layer", "1") == 0
    config_file = tmp_path / "run" / "ckpt" / "config.json"
    config = json.loads(config_file.read_text())
    config["meta"]["train_config"]["max_iters"] = 8  # as if stopped at step 4 of 8
    config_file.write_text(json.dumps(config))
    capsys.readouterr()
    assert cli_train(tmp_path, "--resume", "--max_iters", "4") == 1
    assert "is at step 4; --max_iters 4 would not train it further (pass --max_iters N > 4)" \
        in capsys.readouterr().err


def test_a_resume_may_change_patience_and_says_nothing_of_dropout_it_does_not_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--patience is how long, not what is learned (RESUME_SAFE); a run without dropout
    resumed with another process count draws no dropout masks to differ."""
    _stop_after(monkeypatch, 3)
    flags = ["--max_iters", "6", "--eval_interval", "3", "--n_layer", "1", "--dropout", "0"]
    assert cli_train(tmp_path, *flags) == 130
    monkeypatch.undo()
    config_file = tmp_path / "run" / "ckpt" / "config.json"
    config = json.loads(config_file.read_text())
    config["meta"]["world_size"] = 2  # as if torchrun --nproc_per_node 2 had saved it
    config_file.write_text(json.dumps(config))
    capsys.readouterr()
    assert cli_train(tmp_path, "--resume", "--patience", "5") == 0
    out = capsys.readouterr().out
    assert "resume   changed: --patience None -> 5" in out and "dropout" not in out
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["train_config"]["patience"] == 5


def test_a_patience_run_that_ended_resumes_when_a_flag_asks_for_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --patience run that ended (its metrics say so) has nothing to resume as it is; a
    changed --max_iters is a new request, which resumes it."""
    assert cli_train(tmp_path, "--max_iters", "4", "--eval_interval", "2", "--n_layer", "1",
                     "--patience", "1") == 0
    metrics = tmp_path / "run" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    for row in rows:  # the best evaluation first, a worse one last: patience 1 has run out
        if "val_loss" in row:
            row["val_loss"] = float(row["step"])
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    capsys.readouterr()
    assert cli_train(tmp_path, "--resume", "--max_iters", "4") == 0
    assert "nothing to resume" in capsys.readouterr().out
    assert cli_train(tmp_path, "--resume", "--max_iters", "8") == 0
    out = capsys.readouterr().out
    assert "nothing to resume" not in out and "resume   changed: --max_iters 4 -> 8" in out
