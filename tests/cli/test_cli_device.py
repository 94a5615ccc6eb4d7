"""`--device` and `--dtype` on every command that runs a model, and every command run as a GPU
user runs it: on the CPU under `fake_device.on_fake_device`, which fails where CUDA would fail
because a tensor was made on the host (tests/fake_device.py). `--device cpu:0` is the fake
device; `fake_loads` reads checkpoints for it on the CPU (safetensors knows no "cpu:0") and
marks the model as on the device, as a GPU load would put it there."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab.train.recipes
from attnlab.checkpoint import OpenedCheckpoint
from attnlab.cli import build_parser, main
from attnlab.cli import heads as heads_cli
from fake_device import FAKE, mark, on_fake_device, place

MODEL_COMMANDS = ("generate", "inspect", "serve", "heads", "patch", "lens")


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every load (an opened directory's `load`, which load_checkpoint runs too) onto FAKE
    as described above; the checkpoints loaded, in order."""
    original = OpenedCheckpoint.load
    loaded: list[Any] = []

    def load(self: OpenedCheckpoint, *, map_location: Any = "cpu", **rest: Any) -> Any:
        fake = torch.device(map_location) == FAKE
        ckpt = original(self, map_location="cpu" if fake else map_location, **rest)
        if fake:
            mark(ckpt.model)
        loaded.append(ckpt)
        return ckpt

    monkeypatch.setattr(OpenedCheckpoint, "load", load)
    return loaded


def test_every_model_command_takes_device_auto_and_a_dtype() -> None:
    _, parsers = build_parser()
    for name in (*MODEL_COMMANDS, "demo", "train"):
        actions = {a.option_strings[0]: a for a in parsers[name]._actions if a.option_strings}
        assert "--device" in actions, name
        if name == "train":  # TrainConfig's fields: device auto, dtype an autocast
            assert "TrainConfig default: auto" in actions["--device"].help
            continue
        assert actions["--device"].default == "auto", name
        assert actions["--dtype"].default == "float32", name
        if name == "demo":  # it trains, and training autocasts to bfloat16 only (as train's)
            assert actions["--dtype"].choices == ("float32", "bfloat16")
            continue
        assert actions["--dtype"].choices == ("float32", "bfloat16", "float16"), name


def test_the_dtype_choices_are_the_ones_info_sizes_and_a_load_accepts() -> None:
    """--dtype's names are kept beside the parser (no torch import there); `attnlab info`'s
    table (memory.LOAD_DTYPES) and `load_dtype` must name the same dtypes."""
    from attnlab.cli.common import DTYPES
    from attnlab.model.materialize import load_dtype
    from attnlab.model.memory import LOAD_DTYPES

    assert tuple(LOAD_DTYPES) == DTYPES
    assert all(load_dtype(name) is dtype for name, dtype in LOAD_DTYPES.items())


def _argv(command: str, device: str, tmp_path: Path) -> list[str]:
    ckpt = str(tmp_path / "none")  # the device is checked before anything is read
    return {
        "train": ["train", "--device", device, "--out", str(tmp_path / "run")],
        "generate": ["generate", ckpt, "x", "--device", device],
        "inspect": ["inspect", ckpt, "x", "--device", device],
        "serve": ["serve", ckpt, "--device", device],
        "heads": ["heads", ckpt, "--device", device],
        "patch": ["patch", ckpt, "--clean", "a", "--corrupt", "b", "--answer", "c", "--wrong",
                  "d", "--device", device],
        "lens": ["lens", ckpt, "x", "--device", device],
        "demo": ["demo", "averaging", "--device", device],
    }[command]


@pytest.mark.parametrize("command", [*MODEL_COMMANDS, "demo", "train"])
def test_a_device_the_machine_lacks_is_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # one GPU, cuda:0
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert main(_argv(command, "cuda:7", tmp_path)) == 1
    err = capsys.readouterr().err
    assert err == (f"attnlab {command}: error: device='cuda:7' but this machine has 1 CUDA "
                   "device (cuda:0); use one of those, or auto\n")
    assert main(_argv(command, "mps", tmp_path)) == 1
    err = capsys.readouterr().err
    assert "device='mps' but MPS is not available here; use 'cpu'" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # eight commands, five of them drawing figures
def test_every_command_on_the_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    loads: list[Any],
) -> None:
    """train (the copy task, then text), generate (one prompt, a left-padded batch), inspect
    (figures and the html page), heads with its ablation, patch, lens: every one on the fake
    device, without a host tensor meeting the model."""
    run, fake = tmp_path / "run", str(FAKE)
    monkeypatch.setattr(heads_cli, "MIN_INDUCTION", 0.0)  # ablate even an untrained model
    (tmp_path / "prompts.txt").write_text("abc|\nqwertyu|\n")
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    with on_fake_device():
        assert main(["train", "--quiet", "--out", str(run), "--max_iters", "20",
                     "--device", fake]) == 0
        assert "after    answer accuracy" in capsys.readouterr().out
        assert main(["train", "--quiet", "--out", str(tmp_path / "text"), "--data", str(text),
                     "--max_iters", "4", "--eval_interval", "2", "--eval_iters", "1",
                     "--batch_size", "2", "--device", fake]) == 0
        assert "sample   (temperature 0.8" in capsys.readouterr().out
        ckpt = str(run / "ckpt")
        for argv in (
            ["generate", ckpt, "abc|", "--max-new-tokens", "3", "--device", fake],
            ["generate", ckpt, "--prompt-file", str(tmp_path / "prompts.txt"), "--seed", "1",
             "--max-new-tokens", "3", "--device", fake, "--ablate", "0.1"],
            ["inspect", ckpt, "abc|abc", "--what", "embeddings,grid",
             "--layer", "1", "--head", "0", "--format", "png,html", "--out",
             str(tmp_path / "i"), "--device", fake],
            ["heads", ckpt, "--out", str(tmp_path / "h"), "--device", fake],
            ["patch", ckpt, "--clean", "ab|a", "--corrupt", "cb|c", "--answer", "b",
             "--wrong", "d", "--out", str(tmp_path / "p"), "--device", fake, "--blocks"],
            ["patch", ckpt, "--clean", "ab|a", "--corrupt", "cb|c", "--answer", "b",
             "--wrong", "d", "--method", "attribution", "--out", str(tmp_path / "p"),
             "--device", fake],
            ["lens", ckpt, "abc|ab", "--out", str(tmp_path / "l"), "--device", fake, "--mid"],
        ):
            assert main(argv) == 0, (argv, capsys.readouterr().err)
    assert loads and all(place(c.model.wte.weight) == "device" for c in loads)
    assert json.loads((tmp_path / "h" / "heads.json").read_text())["ablation"]["top_heads"]
    assert (tmp_path / "i" / "attention.html").stat().st_size > 1000


def test_the_demos_on_the_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    loads: list[Any],
) -> None:
    """hello and animals (trained for a few steps here: the fake device's checks make every
    op slower) and averaging, then hello again from its checkpoint (figures: the same traced
    values `inspect` draws in the test above)."""
    original = attnlab.train.recipes.seed_experiment

    def short(name: str, dataset: Any = None) -> Any:
        model, config, data = original(name, dataset)
        return model, dataclasses.replace(config, max_iters=6, eval_interval=6), data

    monkeypatch.setattr(attnlab.train.recipes, "seed_experiment", short)
    fake = str(FAKE)
    with on_fake_device():
        for name in ("hello", "animals", "averaging", "hello"):
            argv = ["demo", name, "--out", str(tmp_path / name), "--device", fake,
                    "--no-figures"]
            assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "check    'Hello' ->" in out and "found    the three forms agree" in out
    assert f"reused {tmp_path / 'hello' / 'ckpt'}" in out  # the second hello: loaded, on FAKE
    assert "last word right in" in out
    assert place(loads[-1].model.wte.weight) == "device"


@pytest.mark.filterwarnings("ignore::attnlab.model.runtime.SlowBF16Warning")  # CPUs without
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])  # bfloat16 units warn, as they should
def test_dtype_loads_the_model_in_it(
    dtype: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], loads: list[Any],
) -> None:
    run = tmp_path / "run"
    assert main(["train", "--quiet", "--out", str(run), "--max_iters", "2",
                 "--eval_interval", "2", "--eval_iters", "1", "--device", "cpu"]) == 0
    ckpt = str(run / "ckpt")
    assert main(["generate", ckpt, "abc|", "--max-new-tokens", "3", "--temperature", "0",
                 "--device", "cpu", "--dtype", dtype]) == 0
    assert main(["lens", ckpt, "abc|", "--out", str(tmp_path / "l"), "--dtype", dtype]) == 0
    assert [c.model.wte.weight.dtype for c in loads] == [getattr(torch, dtype)] * 2
    assert capsys.readouterr().out.startswith("data ")
