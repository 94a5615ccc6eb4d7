"""`attnlab train` and `attnlab info` end to end, in-process."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
import torch

from attnlab import __version__
from attnlab.cli import main
from attnlab.load import load_checkpoint


def _train(tmp_path: Path, *flags: str) -> int:
    return main(["train", "--quiet", "--out", str(tmp_path / "run"), *flags])


def test_default_task_learns_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _train(tmp_path, "--max_iters", "250") == 0
    out = capsys.readouterr().out
    before, after = (float(line.split("accuracy ")[1].split("%")[0])
                     for line in out.splitlines() if "answer accuracy" in line)
    assert before < 10 and after > 90, out
    assert "copy (char tokenizer" in out and "saved" in out
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["step"] == 250

    assert main(["info", str(tmp_path / "run" / "ckpt")]) == 0
    info = capsys.readouterr().out
    assert "2 layers, 4 heads, 64 dims" in info and "trained     250 steps on copy" in info

    # a second run does not silently overwrite the first; --resume continues it
    assert _train(tmp_path, "--max_iters", "250") == 1
    assert "--resume" in capsys.readouterr().err
    assert _train(tmp_path, "--max_iters", "260", "--resume") == 0
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["step"] == 260

    # --overwrite deletes the old checkpoint first: a new run that fails does not leave the
    # old weights beside its own metrics, nor point to them as its last good checkpoint
    capsys.readouterr()
    assert _train(tmp_path, "--overwrite", "--lr", "1e30", "--grad_clip", "0") == 1
    out, err = capsys.readouterr()
    assert f"removed  the checkpoint {tmp_path / 'run' / 'ckpt'} held (--overwrite)" in out
    assert "Last good checkpoint: none written by this run" in err
    assert not (tmp_path / "run" / "ckpt").exists()


def test_flags_map_onto_the_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    code = _train(tmp_path, "--data", str(text), "--n_layer", "1", "--n_head", "2",
                  "--n_embd", "16", "--block_size", "32", "--max_iters", "12", "--lr", "2e-3",
                  "--eval_interval", "6", "--eval_iters", "2", "--bias", "false")
    assert code == 0, capsys.readouterr().err
    ckpt = load_checkpoint(tmp_path / "run" / "ckpt")
    c = ckpt.model.config
    assert (c.n_layer, c.n_head, c.n_embd, c.block_size, c.bias) == (1, 2, 16, 32, False)
    assert c.vocab_size == ckpt.tokenizer.vocab_size
    assert ckpt.meta["train_config"]["lr"] == 2e-3
    # the recipe's 50-step warmup, fitted to 12 steps: a tenth of them, then the cosine
    assert ckpt.meta["train_config"]["warmup_iters"] == 1
    out = capsys.readouterr().out
    assert "sample" in out
    # bits per byte beside each loss (ASCII text, char tokenizer: one byte per token)
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    evals = [json.loads(line) for line in metrics if "val_loss" in line]
    assert [r["step"] for r in evals] == [6, 12]
    for row in evals:
        for split in ("train", "val"):
            assert row[f"{split}_bpb"] == pytest.approx(row[f"{split}_loss"] / math.log(2))
    assert ckpt.meta["val_bpb"] == evals[-1]["val_bpb"]
    assert f"val {evals[-1]['val_loss']:.4f}  ({evals[-1]['val_bpb']:.3f} bits/byte)" in out
    assert f"val loss {evals[-1]['val_loss']:.4f}, {evals[-1]['val_bpb']:.3f} bits/byte" in out
    assert main(["info", str(tmp_path / "run")]) == 0
    assert f"({evals[-1]['val_bpb']:.3f} bits/byte)" in capsys.readouterr().out
    lrs = [json.loads(line)["lr"] for line in metrics if '"lr"' in line]
    assert max(lrs) == pytest.approx(2e-3) and lrs[-1] < 2e-3 / 2  # at lr, then decayed
    # a warmup given is the one used
    code = _train(tmp_path / "again", "--data", str(text), "--n_layer", "1", "--n_head", "2",
                  "--n_embd", "16", "--block_size", "32", "--max_iters", "12",
                  "--warmup_iters", "8", "--eval_interval", "12", "--eval_iters", "1")
    assert code == 0, capsys.readouterr().err
    meta = load_checkpoint(tmp_path / "again" / "run" / "ckpt").meta
    assert meta["train_config"]["warmup_iters"] == 8


def test_a_step_graph_off_a_gpu_is_one_line_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _train(tmp_path, "--cuda_graph", "true", "--device", "cpu") == 1
    captured = capsys.readouterr()
    assert captured.err.strip() == ("attnlab train: error: --cuda_graph records the training step "
                                    "on one CUDA GPU; this run has 1 process(es) on cpu: pass "
                                    "--cuda_graph false")
    assert "accuracy" not in captured.out and not (tmp_path / "run").exists()


def test_unknown_flags_list_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--n_layers", "4"]) == 2
    err = capsys.readouterr().err
    assert "unknown arguments ['--n_layers', '4']" in err and "--n_layer" in err


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.write_text(""), "is empty"),
        (lambda p: p.write_bytes(b"\xff\xfe\xfa"), "not UTF-8"),
    ],
)
def test_bad_data_gives_one_line_and_no_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: object, message: str
) -> None:
    data = tmp_path / "data.txt"
    make(data)  # type: ignore[operator]
    assert _train(tmp_path, "--data", str(data)) == 1
    err = capsys.readouterr().err
    assert err.startswith("attnlab train: error:") and message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_folder_names_the_file_that_is_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder is read with its subfolders; one bad file among many is named."""
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_text("hello world " * 50)
    (corpus / "sub" / "latin1.txt").write_bytes(b"\xff\xfe bad")
    assert _train(tmp_path, "--data", str(corpus)) == 1
    err = capsys.readouterr().err
    assert f"{corpus / 'sub' / 'latin1.txt'} is not UTF-8 text" in err
    assert len(err.strip().splitlines()) == 1


def test_characters_the_tokenizer_cannot_encode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "a.txt"
    first.write_text("abcabc " * 50)
    assert _train(tmp_path, "--data", str(first), "--max_iters", "1", "--n_layer", "1",
                  "--n_embd", "8", "--n_head", "1", "--block_size", "8") == 0
    second = tmp_path / "b.txt"
    second.write_text("abc xyz " * 50)
    code = main(["train", "--quiet", "--data", str(second), "--tokenizer",
                 str(tmp_path / "run" / "ckpt"), "--out", str(tmp_path / "run2")])
    assert code == 1
    assert "cannot encode character 'x'" in capsys.readouterr().err
    assert not (tmp_path / "run2").exists()


def test_block_size_larger_than_the_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "small.txt"
    data.write_text("only a little text here\n")
    assert _train(tmp_path, "--data", str(data), "--block_size", "64") == 1
    # "only a little text here\n": 24 characters, a validation split of 2
    assert "larger than the data allows (2 tokens in the smaller split); use --block_size 1 " \
        "or less" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    data.write_text("hello world\n")  # a split of 1 token: no --block_size can fix that
    assert _train(tmp_path, "--data", str(data), "--block_size", "1") == 1
    err = capsys.readouterr().err
    assert "is too short to train on: its smaller split has 1 token(s)" in err
    assert "--block_size" not in err


def test_a_task_longer_than_block_size_is_refused_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # it used to print the model and fail in the untrained model's report with a message
    # about a prompt the user never gave
    assert _train(tmp_path, "--block_size", "4") == 1
    out, err = capsys.readouterr()
    assert "dataset 'copy' needs block_size >= 16, the model has 4" in err
    assert "model" not in out and "prompt" not in err
    # a tokenizer for a built-in dataset, which brings its own, was silently ignored
    assert _train(tmp_path, "--tokenizer", "bpe") == 1
    assert "the built-in dataset 'copy' brings its own tokenizer" in capsys.readouterr().err


def test_a_tiny_model_is_described_in_whole_words_and_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # it said "1 layers, 1 heads, ...: 0.00M parameters"
    assert _train(tmp_path, "--n_layer", "1", "--n_head", "1", "--n_embd", "8",
                  "--max_iters", "1") == 0
    model_line = next(line for line in capsys.readouterr().out.splitlines()
                      if line.startswith("model"))
    assert "1 layer, 1 head, 8 dims" in model_line and "M parameters" not in model_line
    assert model_line.endswith(" parameters") and model_line.split()[-2].replace(",", "").isdigit()


def test_resume_without_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _train(tmp_path, "--resume") == 1
    assert "no checkpoint" in capsys.readouterr().err


def test_resume_and_overwrite_together_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the run was resumed and --overwrite ignored
    assert _train(tmp_path, "--max_iters", "2", "--n_layer", "1") == 0
    capsys.readouterr()
    assert _train(tmp_path, "--resume", "--overwrite", "--max_iters", "4") == 1
    assert "--overwrite deletes it to start over: choose one" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["step"] == 2


def test_arch_llama_trains_a_modern_model_that_every_command_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--arch llama: RoPE + RMSNorm + SwiGLU without biases, at about the GPT-2-style
    recipe's parameter count; generate, inspect, info and --resume work on it."""
    pytest.importorskip("matplotlib")
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    small = ("--data", str(text), "--n_layer", "2", "--n_embd", "32", "--block_size", "24",
             "--max_iters", "6", "--eval_interval", "3", "--eval_iters", "1")
    assert _train(tmp_path, *small, "--arch", "llama") == 0, capsys.readouterr().err
    ckpt = load_checkpoint(tmp_path / "run" / "ckpt")
    c = ckpt.model.config
    assert (c.pos, c.norm, c.mlp, c.bias, c.n_layer) == ("rope", "rmsnorm", "swiglu", False, 2)
    assert ckpt.model.wpe is None and "blocks.0.mlp.gate.weight" in ckpt.model.state_dict()
    # (test_train checks that the recipe's d_ff matches the GPT-2-style parameter count;
    # here the flags shrink n_embd after the recipe chose it)
    assert c.d_ff is not None
    capsys.readouterr()

    assert _train(tmp_path, *small, "--arch", "llama", "--max_iters", "8", "--resume") == 0
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["step"] == 8
    ckpt_dir = str(tmp_path / "run" / "ckpt")
    assert main(["info", ckpt_dir]) == 0
    info = capsys.readouterr().out
    assert "pos=rope" in info and "norm=rmsnorm" in info and "mlp=swiglu" in info
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("to be\nor\n")  # a batch: "or" is left-padded
    assert main(["generate", ckpt_dir, "--prompt-file", str(prompts), "--max-new-tokens", "15",
                 "--temperature", "0"]) == 0, capsys.readouterr().err
    assert "to be" in capsys.readouterr().out
    assert main(["generate", ckpt_dir, "to be", "--max-new-tokens", "40", "--sliding-window",
                 "--temperature", "0"]) == 0, capsys.readouterr().err
    assert len(capsys.readouterr().out) >= 40  # past block_size 24: the window slides
    assert main(["inspect", ckpt_dir, "to be or not", "--out", str(tmp_path / "insp"),
                 "--what", "embeddings,qkv", "--layer", "1", "--head", "0"]) == 0
    assert (tmp_path / "insp" / "attention.json").is_file()
    assert (tmp_path / "insp" / "embeddings.png").is_file()
    # the recipe refuses --arch where it has no meaning, and --arch with --preset (in a new
    # run directory: the one above already holds a checkpoint, which is refused first)
    fresh = ("--out", str(tmp_path / "fresh"))
    assert _train(tmp_path, "--data", "hello", "--arch", "llama", *fresh) == 1
    assert "--arch applies to text files and tasks" in capsys.readouterr().err
    assert _train(tmp_path, *small, "--arch", "llama", "--preset", "nano", *fresh) == 1
    assert "choose one" in capsys.readouterr().err


def _stop_after(monkeypatch: pytest.MonkeyPatch, steps: int) -> None:
    """Make the training loop see a Ctrl-C after `steps` optimizer steps."""
    from attnlab.train import loop as train_module

    class StopAfter(train_module.StopFlag):
        def __init__(self) -> None:
            super().__init__()
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
    path); the same name over other text is refused (the checkpoint keeps a hash of it)."""
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    small = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "16",
             "--eval_interval", "5", "--eval_iters", "1"]
    assert _train(tmp_path, "--data", str(text), *small, "--max_iters", "5") == 0
    meta = load_checkpoint(tmp_path / "run" / "ckpt").meta
    assert meta["data_source"] == str(text.resolve()) and len(meta["data_fingerprint"]) == 20
    capsys.readouterr()
    assert _train(tmp_path, "--resume", "--max_iters", "8") == 0  # no --data
    out = capsys.readouterr().out
    assert "resumed  from step 5 of 8" in out and "text.txt" in out
    # a --max_iters the run already passed: refused, and nothing said changed first
    assert _train(tmp_path, "--resume", "--max_iters", "6") == 1
    out, err = capsys.readouterr()
    assert "changed" not in out
    assert "is at step 8; --max_iters 6 would not train it further" in err
    assert _train(tmp_path, "--resume", "--eval_interval", "3") == 0  # finished: not an error
    assert "is at step 8 of 8; nothing to resume" in capsys.readouterr().out
    other = tmp_path / "other" / "text.txt"
    other.parent.mkdir()
    other.write_text("that is the question, not to be or to be\n" * 30)  # same name and
    # characters, other text
    assert _train(tmp_path, "--data", str(other), "--resume", "--max_iters", "10") == 1
    assert "is not the text" in capsys.readouterr().err
    # other text with characters the run's tokenizer lacks: named as the wrong data
    foreign = tmp_path / "foreign.txt"
    foreign.write_text("# Zebra!\n" * 50)
    assert _train(tmp_path, "--data", str(foreign), "--resume", "--max_iters", "10") == 1
    err = capsys.readouterr().err
    assert "cannot encode character '#'" in err
    assert err.endswith("trained on 'text.txt': resume on that\n")
    text.unlink()  # the run's file is gone: --data is needed, and the message says so
    assert _train(tmp_path, "--resume", "--max_iters", "10") == 1
    assert "trained on 'text.txt' from" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["step"] == 8


def test_resume_refuses_another_tokenizer_or_arch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --tokenizer and --arch are no config fields: a byte run resumed with --tokenizer char
    # went on training on char ids (and saved the char tokenizer), --arch llama was ignored
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    small = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "16",
             "--eval_interval", "4", "--eval_iters", "1"]
    assert _train(tmp_path, "--data", str(text), "--tokenizer", "byte", *small,
                  "--max_iters", "4") == 0
    capsys.readouterr()
    for flags, said in ((["--tokenizer", "char"], "--tokenizer byte (256 ids) -> char ("),
                        (["--arch", "llama"], "--arch gpt2 -> llama")):
        assert _train(tmp_path, "--resume", "--max_iters", "8", *flags) == 1
        assert said in capsys.readouterr().err
    ckpt = load_checkpoint(tmp_path / "run" / "ckpt")
    assert ckpt.meta["step"] == 4 and ckpt.tokenizer.name == "byte"
    # the flags as the run began are no change
    assert _train(tmp_path, "--resume", "--max_iters", "8", "--tokenizer", "byte",
                  "--arch", "gpt2") == 0, capsys.readouterr().err
    assert load_checkpoint(tmp_path / "run" / "ckpt").meta["step"] == 8


def test_a_damaged_checkpoint_is_refused_before_resuming(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # a missing train state printed "resumed from step 12 of 30" and then failed; a weights
    # file cut short on a finished run said "nothing to resume" and exited 0
    _stop_after(monkeypatch, 12)
    assert _train(tmp_path, "--max_iters", "30") == 130
    monkeypatch.undo()
    capsys.readouterr()
    ckpt = tmp_path / "run" / "ckpt"
    (ckpt / "train_state.pt").rename(tmp_path / "state.pt")
    assert _train(tmp_path, "--resume") == 1
    out, err = capsys.readouterr()
    assert "resumed" not in out and "has no train_state.pt" in err and "--overwrite" in err
    # a state file cut short: refused before "resumed" too
    whole = (tmp_path / "state.pt").read_bytes()
    (ckpt / "train_state.pt").write_bytes(whole[:3000])
    assert _train(tmp_path, "--resume") == 1
    out, err = capsys.readouterr()
    assert "resumed" not in out and "refusing or unable to load" in err and "train_state.pt" in err
    # a state without the optimizer's moments would restart them from zero: refused
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    state["optimizer"]["state"] = {}
    torch.save(state, ckpt / "train_state.pt")
    assert _train(tmp_path, "--resume") == 1
    assert "holds moments for 0 of" in capsys.readouterr().err
    (ckpt / "train_state.pt").unlink()
    (tmp_path / "state.pt").rename(ckpt / "train_state.pt")
    assert _train(tmp_path, "--resume") == 0
    out = capsys.readouterr().out
    assert "resumed  from step 12 of 30" in out
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert _train(tmp_path, "--resume") == 1  # finished, and damaged
    out, err = capsys.readouterr()
    assert "nothing to resume" not in out and "model.safetensors is missing or damaged" in err
    assert _train(tmp_path, "--resume", "--max_iters", "40") == 1  # refused before "changed"
    out, err = capsys.readouterr()
    assert "changed" not in out and "model.safetensors is missing or damaged" in err


def test_help_says_what_each_flag_does_and_misspelt_flags_get_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # --help showed "TrainConfig.lr" for every flag; a misspelt flag only listed all flags
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--lr FLOAT peak learning rate (TrainConfig default: 0.001)" in help_text
    assert "--n_layer INT transformer blocks (GPTConfig default: 4)" in help_text
    # a comment above the field documents it too
    assert "--attention STR fused (SDPA) | explicit | auto" in help_text
    assert "TrainConfig.lr" not in help_text
    assert main(["train", "--n_layers", "4", "--max-iters=9"]) == 2
    err = capsys.readouterr().err
    # the closest first (GPTConfig's --window_layers is a second, farther match)
    assert "--n_layers (did you mean --n_layer or --window_layers?)" in err
    assert "--max-iters=9 (did you mean --max_iters?)" in err
    # a misspelt command or choice names the closest one
    for args, hint in ((["trian"], "did you mean 'train'?"),
                       (["generate", "ckpt", "--dtype", "bf16"], "did you mean 'bfloat16'?")):
        with pytest.raises(SystemExit):
            main(args)
        assert hint in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a value that starts with '-' reads as a flag
        main(["train", "--time_budget", "-5m"])
    assert "(a value that starts with '-' is written --time_budget=VALUE)" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith(f"attnlab {__version__} (torch ")


def test_every_command_takes_any_checkpoint_load_checkpoint_reads() -> None:
    """CHECKPOINT means the same in every command, and its help says all it may be."""
    from attnlab.cli import build_parser

    _, parsers = build_parser()
    helps = {name: action.help for name, parser in parsers.items()
             for action in parser._actions if action.dest == "checkpoint"}
    assert set(helps) >= {"generate", "inspect", "serve", "info", "export", "heads", "patch"}
    for help_text in helps.values():
        assert help_text is not None
        assert "run directory holding ckpt/" in help_text and "Hugging Face" in help_text


def test_text_of_one_distinct_token_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a file of NUL bytes trained silently on a 1-id vocabulary
    data = tmp_path / "zeros.bin"
    data.write_bytes(b"\0" * 4096)
    assert _train(tmp_path, "--data", str(data)) == 1
    err = capsys.readouterr().err
    assert "4,096 tokens of only 1 distinct one ('\\x00')" in err and "Is it a text file?" in err
    assert err.count("\n") == 1 and not (tmp_path / "run").exists()


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


def test_init_from_fine_tunes_a_hugging_face_directory_and_keeps_its_family(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--init_from: the run starts from the directory's weights, config and tokenizer (not
    the recipe's fresh model), its checkpoint remembers the family (a Mistral exports as a
    Mistral), and flags that would change the model are refused."""
    import torch

    from attnlab import GPT, GPTConfig, save_hf
    from attnlab.tokenizers import CharTokenizer

    text = "the quick brown fox jumps over the lazy dog\n" * 80
    (tmp_path / "text.txt").write_text(text)
    config = GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=4, n_kv_head=2,
                       n_embd=32, bias=False, mlp="swiglu", norm="rmsnorm", pos="rope",
                       sliding_window=6, init_std=None)
    torch.manual_seed(0)
    source = GPT(config)
    save_hf(tmp_path / "hf", source, CharTokenizer.from_text(text), family="mistral")
    flags = ["--data", str(tmp_path / "text.txt"), "--init_from", str(tmp_path / "hf"),
             "--max_iters", "2", "--eval_interval", "2", "--eval_iters", "1",
             "--batch_size", "2", "--lr", "1e-5", "--warmup_iters", "0"]
    assert _train(tmp_path, *flags) == 0
    assert "init     the weights of" in capsys.readouterr().out
    tuned = load_checkpoint(tmp_path / "run")
    assert tuned.model.config == load_checkpoint(tmp_path / "hf").model.config
    assert tuned.model.config.sliding_window == 6
    assert tuned.meta["family"] == "mistral"
    moved = max((a - b).abs().max().item() for a, b in zip(
        tuned.model.state_dict().values(), source.state_dict().values(), strict=True))
    assert 0 < moved < 1e-3  # two steps of lr 1e-5 from the source, not a fresh model
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    assert '"MistralForCausalLM"' in (tmp_path / "out" / "config.json").read_text()
    # a resumed fine-tune still knows where it came from (its checkpoints lost the family)
    assert main(["train", "--quiet", "--resume", "--out", str(tmp_path / "run"),
                 "--max_iters", "3"]) == 0
    resumed = load_checkpoint(tmp_path / "run").meta
    assert resumed["step"] == 3 and resumed["family"] == "mistral"
    assert resumed["init_from"] == str(tmp_path / "hf")
    capsys.readouterr()
    assert main(["info", str(tmp_path / "run")]) == 0  # it raised KeyError: 'architecture'
    assert f"fine-tuned  from {tmp_path / 'hf'} (Hugging Face mistral)" in (
        capsys.readouterr().out)

    for extra, refused in ((["--n_layer", "3"], "--n_layer would change them"),
                           (["--resume"], "choose one")):
        capsys.readouterr()
        assert main(["train", "--quiet", "--out", str(tmp_path / "other"), *flags,
                     *extra]) == 1
        assert refused in capsys.readouterr().err


def test_seq_len_fine_tunes_a_long_context_model_on_shorter_windows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fine-tune trained on windows of the model's whole context, so a text shorter than
    that (a 512-token model here; 32k for Qwen) could not be used; --seq_len sets the
    windows and leaves the model's context as it was."""
    import torch

    from attnlab import GPT, GPTConfig, save_hf
    from attnlab.tokenizers import CharTokenizer

    text = "the quick brown fox jumps over the lazy dog\n" * 80  # ~350 validation tokens
    (tmp_path / "text.txt").write_text(text)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=32, block_size=512, n_layer=1, n_head=2, n_embd=16,
                       bias=False, mlp="swiglu", norm="rmsnorm", pos="rope", init_std=None)
    save_hf(tmp_path / "hf", GPT(config), CharTokenizer.from_text(text), family="llama")
    flags = ["--data", str(tmp_path / "text.txt"), "--init_from", str(tmp_path / "hf"),
             "--max_iters", "2", "--eval_interval", "2", "--eval_iters", "1",
             "--batch_size", "2", "--lr", "1e-5", "--warmup_iters", "0"]
    assert _train(tmp_path, *flags) == 1
    assert "block_size=512 is larger than the data allows" in capsys.readouterr().err
    assert _train(tmp_path, *flags, "--seq_len", "32") == 0
    tuned = load_checkpoint(tmp_path / "run")
    assert tuned.model.config.block_size == 512 and tuned.meta["train_config"]["seq_len"] == 32
    assert _train(tmp_path, *flags, "--seq_len", "600", "--overwrite") == 1
    assert "seq_len=600 is longer than the model's context (block_size=512)" in (
        capsys.readouterr().err)
