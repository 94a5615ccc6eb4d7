"""train/state.py and the loop's resume path at their edges: what a checkpoint must hold
to continue from its first step, what a fine-tune's checkpoints keep of their source, what
--patience counts as no better, and a second signal under torchrun. (Exact resume itself:
tests/train/test_loop.py.)"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnlab.checkpoint import STATE_FILE, Checkpoint
from attnlab.load import load_checkpoint
from attnlab.model.gpt import GPT, GPTConfig
from attnlab.train.data import load_dataset
from attnlab.train.loop import TrainConfig, train
from attnlab.train.state import StopFlag, since_best


def _copy_run(max_iters: int, eval_interval: int) -> tuple[Any, GPTConfig, TrainConfig]:
    dataset = load_dataset("copy")
    model = GPTConfig(vocab_size=dataset.tokenizer.vocab_size,
                      block_size=dataset.max_block_size, n_layer=1, n_head=2, n_embd=16)
    config = TrainConfig(max_iters=max_iters, batch_size=4, lr=3e-3, warmup_iters=1,
                         eval_interval=eval_interval, eval_iters=1, seed=3)
    return dataset, model, config


def test_a_checkpoint_of_step_1_missing_a_moment_is_refused(tmp_path: Path) -> None:
    """After one step every AdamW parameter has its moments: a state of step 1 without one
    would restart it from zero. (Only step 0, before any update, holds none.)"""
    dataset, model, config = _copy_run(max_iters=1, eval_interval=1)
    train(model, config, dataset, tmp_path)
    path = tmp_path / "ckpt" / STATE_FILE
    state = torch.load(path, weights_only=True)
    assert state["step"] == 1
    moments = state["optimizer"]["state"]
    del moments[next(iter(moments))]
    torch.save(state, path)
    longer = TrainConfig(**{**config.__dict__, "max_iters": 2})
    with pytest.raises(ValueError, match=r"holds moments for \d+ of \d+ parameters"):
        train(model, longer, dataset, tmp_path, resume=True)


def test_a_fine_tunes_checkpoints_keep_its_source_through_a_resume(tmp_path: Path) -> None:
    """init's path and Hugging Face family go into every checkpoint of the run (an export
    keeps a Mistral a Mistral), and a resumed run, which has no init, keeps them from the
    checkpoint it continues."""
    dataset, model_config, config = _copy_run(max_iters=4, eval_interval=2)
    torch.manual_seed(0)
    source = Checkpoint(GPT(model_config).eval(), dataset.tokenizer,
                        {"family": "mistral", "step": 100}, tmp_path / "source")
    origin = {"family": "mistral", "init_from": str(tmp_path / "source")}

    def stop_at_3(row: dict[str, Any]) -> None:
        if row.get("step") == 3 and "loss" in row:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does

    first = train(model_config, config, dataset, tmp_path / "run", init=source,
                  callback=stop_at_3)
    assert first.interrupted
    meta = load_checkpoint(tmp_path / "run" / "ckpt").meta
    assert meta["step"] == 3 and {k: meta.get(k) for k in origin} == origin
    train(model_config, config, dataset, tmp_path / "run", resume=True)
    meta = load_checkpoint(tmp_path / "run" / "ckpt").meta
    assert meta["step"] == 4 and {k: meta.get(k) for k in origin} == origin


@given(st.lists(st.sampled_from([3.0, 2.0, 1.0, 1.5]), max_size=8))
def test_evaluations_since_the_best_count_from_its_first_occurrence(losses: list[float]) -> None:
    """An evaluation that only equals the best is no better: --patience counts it."""
    best, stale = since_best(losses)
    if not losses:
        assert (best, stale) == (float("inf"), 0)
        return
    first = min(range(len(losses)), key=lambda i: (losses[i], i))
    assert (best, stale) == (losses[first], len(losses) - 1 - first)


def test_an_equal_val_loss_is_no_better() -> None:
    assert since_best([3.0, 2.0, 2.0, 2.0]) == (2.0, 2)


@pytest.mark.parametrize(("torchrun", "quits"), [(True, True), (False, False)])
def test_under_torchrun_any_signal_after_a_sigint_quits_at_once(
        torchrun: bool, quits: bool) -> None:
    """torchrun's agent passes the terminal's first Ctrl-C on as SIGINT and answers a second
    with SIGTERM: under torchrun that SIGTERM is the second Ctrl-C and quits. Without
    torchrun a SIGTERM after a Ctrl-C is one more request to stop after the step."""
    heard: list[str] = []
    with StopFlag(on_stop=heard.append, torchrun=torchrun) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        if quits:
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGTERM)
        else:
            os.kill(os.getpid(), signal.SIGTERM)
    assert stop.requested and heard == ["SIGINT"]
