"""Out of device memory in `attnlab train`, `generate` and `inspect`: one line naming what to
reduce, exit 1, and training's last checkpoint intact. `torch.OutOfMemoryError` (what CUDA
raises) is injected on the CPU where each command would meet it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.cli import main
from attnlab.load import load_checkpoint
from attnlab.model.gpt import GPT
from attnlab.model.trace import Trace

CUDA_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.19 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has "
            "78.11 GiB memory in use.")


def _raise(*args: Any, **kwargs: Any) -> Any:
    raise torch.OutOfMemoryError(CUDA_OOM)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("oom") / "run"
    assert main(["train", "--quiet", "--out", str(run), "--max_iters", "2", "--eval_interval",
                 "2", "--eval_iters", "1", "--device", "cpu"]) == 0
    return run / "ckpt"


def test_train_names_what_to_reduce_and_keeps_the_last_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    forward, steps = GPT.forward, []

    def failing(self: GPT, *args: Any, **kwargs: Any) -> Any:
        steps.extend([1] if self.training else [])
        if len(steps) == 5:  # the fifth step, after the checkpoint of step 4
            _raise()
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(GPT, "forward", failing)
    run = tmp_path / "run"
    assert main(["train", "--quiet", "--out", str(run), "--max_iters", "8", "--eval_interval",
                 "4", "--eval_iters", "1", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "attnlab train: error: out of memory on cpu (CUDA out of memory. Tried to allocate "
        "2.00 GiB); try a smaller --batch_size (with --grad_accum to keep the batch), a "
        "shorter context (--block_size or --seq_len), or --dtype bfloat16; the last "
        f"checkpoint is intact: {run / 'ckpt'}\n")
    assert load_checkpoint(run / "ckpt").meta["step"] == 4  # whole, and the one named
    assert not list(run.glob("ckpt.*"))  # no half-written copy beside it


def test_train_out_of_memory_before_any_checkpoint_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    forward = GPT.forward

    def failing(self: GPT, *args: Any, **kwargs: Any) -> Any:  # the "before" score runs
        return _raise() if self.training else forward(self, *args, **kwargs)

    monkeypatch.setattr(GPT, "forward", failing)
    assert main(["train", "--quiet", "--out", str(tmp_path / "run"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.endswith("; the last checkpoint was never written\n") and err.count("\n") == 1
    assert not (tmp_path / "run" / "ckpt").exists()


def test_generate_names_what_to_reduce(
    trained: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(GPT, "forward", _raise)
    for argv in (["abc|"], ["--prompt-file", "-"]):
        if argv[0] == "--prompt-file":
            monkeypatch.setattr("sys.stdin.read", lambda: "abc|\nqw|\n")
        assert main(["generate", str(trained), *argv, "--device", "cpu"]) == 1
        err = capsys.readouterr().err
        assert err == (
            "attnlab generate: error: out of memory on cpu (CUDA out of memory. Tried to "
            "allocate 2.00 GiB); try a smaller --batch-size, fewer --max-new-tokens, shorter "
            "prompts, or --dtype bfloat16\n")


@pytest.mark.parametrize("command", ["generate", "inspect"])
def test_out_of_memory_while_loading_says_so_not_what_the_command_would_reduce(
    command: str, trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--batch-size or --max-new-tokens cannot help a model that does not load."""
    monkeypatch.setattr(GPT, "load_state_dict", _raise)  # the load's last step
    argv = {"generate": ["generate", str(trained), "abc|", "--max-new-tokens", "2"],
            "inspect": ["inspect", str(trained), "abc|", "--out", str(tmp_path / "i")]}
    assert main([*argv[command], "--device", "cpu"]) == 1
    assert capsys.readouterr().err == (
        f"attnlab {command}: error: out of memory on cpu while loading the model (CUDA out "
        "of memory. Tried to allocate 2.00 GiB); try --dtype bfloat16, a device with more "
        "free memory, or a smaller model\n")


def test_inspect_names_what_to_reduce(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Trace, "run", _raise)
    assert main(["inspect", str(trained), "abc|", "--out", str(tmp_path / "i"),
                 "--device", "cpu"]) == 1
    assert capsys.readouterr().err == (
        "attnlab inspect: error: out of memory on cpu (CUDA out of memory. Tried to allocate "
        "2.00 GiB); try fewer traced layers or heads (--layer, --head), fewer figures "
        "(--what), a shorter text, or --dtype bfloat16\n")
    assert not (tmp_path / "i").exists()


def test_any_other_command_says_out_of_memory_in_one_line(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(GPT, "forward", _raise)
    assert main(["lens", str(trained), "abc|", "--out", str(tmp_path / "l")]) == 1
    assert capsys.readouterr().err == (
        "attnlab lens: error: out of memory (CUDA out of memory. Tried to allocate 2.00 GiB); "
        "try a smaller input, or --dtype bfloat16\n")


@pytest.mark.parametrize("command", ["train", "generate", "inspect", "lens"])
def test_the_cpu_allocators_failure_is_out_of_memory_too(
    command: str, trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CPU allocator raises a plain RuntimeError (`--block_size 100000` in training
    asked for 1.9 TB): the same one line as CUDA's, not a traceback."""
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                           "can't allocate memory: you tried to allocate 1920000000000 bytes. "
                           "Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(GPT, "forward", refused)
    monkeypatch.setattr(Trace, "run", refused)
    argv = {"train": ["train", "--quiet", "--out", str(tmp_path / "run"), "--max_iters", "2"],
            "generate": ["generate", str(trained), "abc|", "--max-new-tokens", "2"],
            "inspect": ["inspect", str(trained), "abc|", "--out", str(tmp_path / "i")],
            "lens": ["lens", str(trained), "abc|", "--out", str(tmp_path / "l")]}[command]
    assert main([*argv, "--device", "cpu"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"attnlab {command}: error: out of memory")
    assert "(can't allocate memory: you tried to allocate 1920000000000 bytes); try " in err
