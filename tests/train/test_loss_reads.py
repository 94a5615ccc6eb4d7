"""Losses read from the device every few steps (a GPU's way: each read waits for the device),
and the device-side guard that keeps fused AdamW from applying non-finite gradients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.load import load_checkpoint
from attnlab.model.gpt import GPTConfig
from attnlab.train import loop
from attnlab.train.data import load_dataset
from attnlab.train.loop import TrainConfig, train
from helpers import read_metrics


def _config(**overrides: Any) -> tuple[GPTConfig, TrainConfig]:
    dataset = load_dataset("copy")
    model = GPTConfig(vocab_size=dataset.tokenizer.vocab_size, block_size=dataset.max_block_size,
                      n_layer=1, n_head=2, n_embd=16, dropout=0.1)
    return model, TrainConfig(**{"max_iters": 23, "batch_size": 4, "lr": 3e-3,
                                 "warmup_iters": 2, "eval_interval": 10, "eval_iters": 2,
                                 "seed": 5, **overrides})


def test_reading_every_seven_steps_logs_the_same_run(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model, config = _config()
    dataset = load_dataset("copy")
    every_step = train(model, config, dataset, tmp_path / "one")
    monkeypatch.setattr(loop, "read_interval", lambda device, config: 7)
    batched = train(model, config, dataset, tmp_path / "seven")
    ones, sevens = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "seven")
    assert [r["step"] for r in sevens] == [r["step"] for r in ones]
    for a, b in zip(ones, sevens, strict=True):  # the same losses, evaluations, schedule
        assert {k: v for k, v in a.items() if k != "tokens_per_s"} == \
            {k: v for k, v in b.items() if k != "tokens_per_s"}
    assert all(r["tokens_per_s"] > 0 for r in sevens if "loss" in r)
    for name, value in every_step.model.state_dict().items():
        assert torch.equal(value, batched.model.state_dict()[name]), name


def test_adamw_skips_non_finite_gradients_on_the_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, config = _config(max_iters=5, eval_interval=5)
    dataset = load_dataset("copy")
    good = train(model, config, dataset, tmp_path)
    saved = {k: v.clone() for k, v in good.model.state_dict().items()}
    monkeypatch.setattr(loop, "read_interval", lambda device, config: 4)
    calls = []

    def poisoned(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = real_forward(self, *args, **kwargs)
        if not self.training:
            return out
        calls.append(1)  # the second step on: every gradient NaN, as in a divergence
        return out if len(calls) < 2 else out._replace(loss=out.loss * float("nan"))

    real_forward = loop.GPT.forward
    monkeypatch.setattr(loop.GPT, "forward", poisoned)
    more = TrainConfig(**{**config.__dict__, "max_iters": 20})
    with pytest.raises(FloatingPointError, match=r"loss became nan at step 7; no update with "
                                                 r"non-finite gradients was applied"):
        train(model, more, dataset, tmp_path, resume=True)
    assert len(calls) == 5  # read at step 6 (a run's first step), then at 10: steps 7-10 ran
    kept = load_checkpoint(tmp_path / "ckpt")
    assert kept.meta["step"] == 5
    for name, value in kept.model.state_dict().items():
        assert torch.equal(value, saved[name]), name


def test_the_guard_leaves_weights_and_moments_untouched() -> None:
    model, config = _config()
    net = loop.GPT(model)
    optimizer = loop.make_optimizer(net, config)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    for p in net.parameters():
        p.grad = torch.full_like(p, float("nan"))
    optimizer.found_inf = torch.ones(())  # type: ignore[attr-defined]
    optimizer.step()
    for name, value in net.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert all(float(s["step"]) == 0 for s in optimizer.state.values())


def test_compiled_blocks_share_one_graph_and_are_released() -> None:
    from torch._dynamo.utils import counters

    from attnlab.model.runtime import quiet_compile
    from attnlab.train.state import compile_blocks, release_blocks

    model_config, _ = _config()
    torch.manual_seed(0)
    net = loop.GPT(GPTConfig(**{**model_config.to_dict(), "n_layer": 3, "dropout": 0.0}))
    x = torch.randint(0, net.config.vocab_size, (2, 8))
    eager = net(x, x).loss
    torch._dynamo.reset()
    graphs = counters["stats"]["unique_graphs"]  # other tests' compilations counted too
    compile_blocks(net, backend="eager")  # dynamo's capture alone: fast, and what is shared
    with quiet_compile():
        compiled = net(x, x).loss
    assert counters["stats"]["unique_graphs"] - graphs == 1  # three blocks, one compilation
    assert torch.allclose(compiled, eager)
    release_blocks(net)
    assert all("forward" not in vars(block) for block in net.blocks)
    assert torch.equal(net(x, x).loss, eager)
    torch._dynamo.reset()
    graphs = counters["stats"]["unique_graphs"]
    compile_blocks(net, ends=True, backend="eager")  # and the embedding, and head and loss
    with quiet_compile():
        compiled = net(x, x).loss
    assert counters["stats"]["unique_graphs"] - graphs == 3
    assert torch.allclose(compiled, eager)
    release_blocks(net)
    assert not {"_embed", "_head"} & set(vars(net))
    assert torch.equal(net(x, x).loss, eager)
    torch._dynamo.reset()


def test_compiled_training_on_a_cpu_compiles_the_blocks_and_releases_them(
        tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    model, config = _config(max_iters=6, eval_interval=3)
    model = GPTConfig(**{**model.to_dict(), "dropout": 0.0, "n_layer": 2})
    dataset = load_dataset("copy")
    eager = train(model, config, dataset, tmp_path / "eager")
    graphs = counters["stats"]["unique_graphs"]
    compiled = train(model, TrainConfig(**{**config.__dict__, "compile": True}), dataset,
                     tmp_path / "compiled")
    assert counters["stats"]["unique_graphs"] - graphs == 1  # two blocks, one compilation
    assert all("forward" not in vars(block) for block in compiled.model.blocks)  # released
    ones, twos = read_metrics(tmp_path / "eager"), read_metrics(tmp_path / "compiled")
    for a, b in zip(ones, twos, strict=True):  # the same math, Inductor's kernels
        for key in ("loss", "val_loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4), (a, b)
    assert eager.val_loss == pytest.approx(compiled.val_loss, rel=1e-4)
