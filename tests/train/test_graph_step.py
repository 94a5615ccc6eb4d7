"""The whole training step as one CUDA graph (train/graph_step.py), rehearsed on the CPU: there
the recording is skipped and each replay runs the recorded body eagerly, so these tests hold
what the graph path adds around the step (batches into fixed inputs, the learning rate as a
device scalar, gradients set to None before the recording, nothing read back from the device
inside the step, checkpoints any run resumes) to the plain step's run. The recording itself
is tested on a GPU (tests/cuda)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from attnlab.checkpoint import load_train_state
from attnlab.model.gpt import GPTConfig
from attnlab.train import graph_step, loop
from attnlab.train.data import load_dataset
from attnlab.train.loop import TrainConfig, train
from fake_device import FAKE, on_fake_device
from helpers import read_metrics


def _config(**overrides: Any) -> tuple[GPTConfig, TrainConfig]:
    dataset = load_dataset("copy")
    model = GPTConfig(vocab_size=dataset.tokenizer.vocab_size, block_size=dataset.max_block_size,
                      n_layer=1, n_head=2, n_embd=16, dropout=0.1)
    return model, TrainConfig(**{"max_iters": 9, "batch_size": 4, "grad_accum": 2, "lr": 3e-3,
                                 "warmup_iters": 2, "eval_interval": 5, "eval_iters": 2,
                                 "seed": 5, **overrides})


@pytest.fixture
def rehearse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graph_step, "DEVICES", ("cuda", "cpu"))


@pytest.fixture
def graph_steps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The steps GraphedStep took, in order: "eager" (a warm-up step) or "replay" (the
    recorded step; on a CPU, its rehearsal). The loop's plain step adds nothing."""
    taken: list[str] = []
    step = graph_step.GraphedStep.step

    def spied(self: graph_step.GraphedStep, *args: Any) -> Any:
        loss = step(self, *args)
        taken.append("eager" if self.graph is None else "replay")
        return loss

    monkeypatch.setattr(graph_step.GraphedStep, "step", spied)
    return taken


def _losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r.get("loss", r.get("val_loss"))) for r in read_metrics(out)]


def test_the_graph_step_trains_as_the_plain_step(tmp_path: Path, rehearse: None,
                                                  graph_steps: list[str]) -> None:
    """Same batches, dropout draws and updates: the same losses (the learning rate, a float32
    scalar for AdamW, rounds the schedule's float64 by 1e-8) and weights, through the eager
    warm-up steps, the recording and the replays, with two micro-batches a step."""
    model, config = _config()
    dataset = load_dataset("copy")
    plain = train(model, config, dataset, tmp_path / "plain")
    graphed = train(model, TrainConfig(**{**config.__dict__, "cuda_graph": True}), dataset,
                    tmp_path / "graph")
    # the graph step took every step: the warm-up, then the recording's replays
    assert graph_steps == ["eager"] * graph_step.WARMUP + ["replay"] * (
        config.max_iters - graph_step.WARMUP)
    got, want = _losses(tmp_path / "graph"), _losses(tmp_path / "plain")
    assert [s for s, _ in got] == [s for s, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-5)
    for name, value in plain.model.state_dict().items():
        assert (graphed.model.state_dict()[name] - value).abs().max() < 1e-5, name
    assert all(p.grad is None for p in graphed.model.parameters())  # released with the graph


def test_its_checkpoint_resumes_without_a_graph(tmp_path: Path, rehearse: None,
                                                graph_steps: list[str]) -> None:
    """The optimizer state saves the learning rate as a number and capturable off, as a plain
    step saves it: a run without the graph (on a CPU) resumes and continues it."""
    model, config = _config(max_iters=5)
    dataset = load_dataset("copy")
    train(model, TrainConfig(**{**config.__dict__, "cuda_graph": True}), dataset, tmp_path)
    assert graph_steps[-1] == "replay" and len(graph_steps) == 5  # saved after a recording
    groups = load_train_state(tmp_path / "ckpt")["optimizer"]["param_groups"]
    assert all(type(g["lr"]) is float and g["capturable"] is False for g in groups)
    result = train(model, TrainConfig(**{**config.__dict__, "max_iters": 9}), dataset, tmp_path,
                   resume=True)
    assert result.val_step == 9 and math.isfinite(result.val_loss or math.nan)
    assert len(graph_steps) == 5  # steps 6 to 9 were plain ones


def test_the_recorded_step_reads_nothing_back(tmp_path: Path, rehearse: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A read back from the device inside the step would fail in the middle of a recording:
    on the fake device (tests/fake_device.py) the graph path reads only where the plain one
    does (the losses, the evaluations' sums, the checkpoints) and the learning rates it saves."""
    model, config = _config(max_iters=9, eval_interval=5)
    config = TrainConfig(**{**config.__dict__, "cuda_graph": True, "device": str(FAKE)})
    monkeypatch.setattr(loop, "read_interval", lambda device, config: loop.READ_EVERY)
    with on_fake_device() as fake:
        train(model, config, load_dataset("copy"), tmp_path)
    reads = Counter(fake.reads)
    assert reads.pop("mean_all") == 3  # after step 1, before the evaluations at 5 and 9
    assert reads.pop("_split_loss") == 4 and reads.pop("plain_state") == 2 * 2  # 2 groups
    assert set(reads) == {"_host_copy"}


def test_where_it_cannot_record_it_says_so(tmp_path: Path) -> None:
    model, config = _config()
    with pytest.raises(ValueError, match="adamw or --cuda_graph false"):
        TrainConfig(**{**config.__dict__, "cuda_graph": True, "optimizer": "sgd"})
    graphed = TrainConfig(**{**config.__dict__, "cuda_graph": True, "device": "cpu"})
    with pytest.raises(ValueError, match=r"one CUDA GPU; this run has 1 process\(es\) on cpu: "
                                         r"pass --cuda_graph false"):
        train(model, graphed, load_dataset("copy"), tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before anything was written
