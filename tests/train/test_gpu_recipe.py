"""The GPU recipe: which recipe a device gets (a pure function, tested here on the CPU), what
`attnlab train` on a GPU machine starts from, and TrainConfig.patience's stop at the best val
loss with that evaluation's checkpoint kept."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

import attnlab.train.loop
import attnlab.train.recipes
from attnlab.cli import main
from attnlab.load import load_checkpoint
from attnlab.model.gpt import GPTConfig
from attnlab.train.data import load_dataset
from attnlab.train.loop import TrainConfig, train
from attnlab.train.recipes import gpu_text_recipe, recipe


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("text")
    (folder / "text.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 400)
    return load_dataset(str(folder / "text.txt"), "char", cache_dir=folder)


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_text_on_cuda_gets_nanogpts_gpu_shape_and_a_stop_at_the_best(
    device: str, text: Any
) -> None:
    model, config = recipe(text, device=device)
    assert (model.n_layer, model.n_head, model.n_embd, model.block_size) == (6, 6, 384, 256)
    assert (model.dropout, model.bias, model.gelu) == (0.2, False, "exact")
    assert model.vocab_size == text.tokenizer.vocab_size
    assert (config.batch_size, config.lr, config.min_lr, config.warmup_iters, config.beta2) == (
        64, 1e-3, 1e-4, 100, 0.99)
    assert (config.dtype, config.eval_interval, config.patience) == ("bfloat16", 250, 2)
    assert config.eval_iters * config.batch_size * model.block_size == 819_200  # val tokens
    assert (model, config) == gpu_text_recipe(text.tokenizer.vocab_size)
    assert (config.cuda_graph, config.compile) == (True, False)  # one GPU: the step as a graph
    ddp = recipe(text, device=device, processes=2)[1]  # DDP: no step graph, compiled instead
    assert (ddp.cuda_graph, ddp.compile) == (False, True)
    assert dataclasses.replace(ddp, cuda_graph=True, compile=False) == config
    llama, _ = recipe(text, "llama", device=device)
    assert (llama.n_layer, llama.pos, llama.norm) == (6, "rope", "rmsnorm")


def test_the_cpu_and_tasks_keep_their_recipes(text: Any) -> None:
    assert recipe(text, device="cpu") == recipe(text)
    assert recipe(text, device="cpu")[0].n_layer == 4
    copy = load_dataset("copy")
    assert recipe(copy, device="cuda") == recipe(copy)  # two layers learn it anywhere


def test_attnlab_train_on_a_gpu_machine_starts_from_the_gpu_recipe(
    text: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`attnlab train --data FILE` with CUDA present (device auto): the configs it hands to
    train() (stopped there: this machine has no GPU to train on)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    handed: list[Any] = []

    def capture(model_config: GPTConfig, config: TrainConfig, *args: Any, **kw: Any) -> Any:
        handed.append((model_config, config))
        raise ValueError("stopped before training")

    monkeypatch.setattr(attnlab.train.loop, "train", capture)
    assert main(["train", "--quiet", "--data", str(text.source), "--out",
                 str(tmp_path / "run")]) == 1
    out = capsys.readouterr().out
    assert handed == [gpu_text_recipe(text.tokenizer.vocab_size)]
    assert main(["train", "--quiet", "--data", str(text.source), "--out", str(tmp_path / "s"),
                 "--optimizer", "sgd"]) == 1  # the step graph records AdamW: off for SGD
    assert (handed[-1][1].optimizer, handed[-1][1].cuda_graph) == ("sgd", False)
    assert ("train    2000 steps x 64 sequences, adamw lr 0.001, bfloat16 on cuda:0, each step "
            "one CUDA graph, stopping after 2 evaluations without a better val loss") in out, out
    # (runtime.fast_bf16 asks the GPU whenever CUDA is there: this CPU has no bf16 units)
    monkeypatch.setattr(attnlab.train.recipes, "fast_bf16", lambda: False)
    assert main(["train", "--quiet", "--data", str(text.source), "--out", str(tmp_path / "b"),
                 "--device", "cpu"]) == 1
    assert handed[-1][0].n_layer == 4  # --device cpu: the CPU recipe


def test_patience_stops_at_the_best_val_and_keeps_its_checkpoint(
    text: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted = iter([3.0, 2.0, 2.5, 2.6, 1.0])  # val losses of the evaluations in turn

    def evaluate(*args: Any, **kwargs: Any) -> dict[str, float]:
        return {"train_loss": 2.0, "val_loss": next(scripted)}

    monkeypatch.setattr(attnlab.train.loop, "evaluate", evaluate)
    model = GPTConfig(vocab_size=text.tokenizer.vocab_size, block_size=16, n_layer=1, n_head=2,
                      n_embd=16)
    config = TrainConfig(max_iters=40, batch_size=2, eval_interval=4, eval_iters=1,
                         patience=2, device="cpu")
    result = train(model, config, text, tmp_path)
    assert result.stopped_early and (result.val_loss, result.val_step) == (2.0, 8)
    evals = [(r["step"], r["val_loss"]) for r in result.history if "val_loss" in r]
    assert evals == [(4, 3.0), (8, 2.0), (12, 2.5), (16, 2.6)]  # stopped: two without better
    saved = load_checkpoint(tmp_path / "ckpt")
    assert (saved.meta["step"], saved.meta["val_loss"]) == (8, 2.0)
    for name, value in saved.model.state_dict().items():  # the model is the best one's too
        torch.testing.assert_close(result.model.state_dict()[name], value, rtol=0, atol=0)
    with pytest.raises(ValueError, match="patience=0 must be a positive integer"):
        TrainConfig(patience=0)
