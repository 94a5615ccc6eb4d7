"""Training for a time budget: durations, the fitted step count, a run that keeps to it."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from attnlab.cli import main
from attnlab.load import load_checkpoint
from attnlab.model.gpt import GPTConfig
from attnlab.train.budget import (
    CALIBRATION_STEPS,
    UNTIMED_STEPS,
    Budget,
    fit_max_iters,
    parse_duration,
)
from attnlab.train.data import load_dataset
from attnlab.train.loop import TrainConfig, train


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("90s", 90), ("5m", 300), ("5min", 300), ("1.5h", 5400), (".5m", 30),
    (" 2 m ", 120),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "0s", "-1m", "5d", "m", "1e3"])
def test_bad_durations_name_the_value_and_the_form(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"time_budget={text!r} must be a positive")):
        parse_duration(text)
    with pytest.raises(ValueError, match=re.escape("like 90s, 5m or 1.5h")):
        TrainConfig(time_budget=text)


def _simulate(budget_s: float, step_s: Any, eval_s: float, interval: int) -> tuple[float, int]:
    """train()'s loop on a simulated clock: (seconds the run took, steps it took).
    step_s(step) is the time of step `step`; every evaluation takes eval_s (which the budget
    estimates right from the first step's time until it has timed one)."""
    now, step, max_iters = 0.0, 0, 10**9
    budget = Budget(budget_s, step=0, now=now, eval_interval=interval,
                    eval_share=eval_s / step_s(0))
    while step < max_iters:
        if step % interval == 0 and step > 0:
            now += eval_s
            budget.evaluated(eval_s)
        now += step_s(step)
        step += 1
        fitted = budget.after_step(step, now)
        if fitted:
            max_iters = fitted
    return now + eval_s, step  # the final evaluation


@pytest.mark.parametrize(("budget_s", "eval_s", "interval"), [
    (60, 0.5, 100), (300, 2.0, 250), (10, 0.2, 50), (5, 0.1, 1000),
])
def test_a_steady_run_ends_at_its_budget(budget_s: float, eval_s: float, interval: int) -> None:
    took, steps = _simulate(budget_s, lambda step: 0.02, eval_s, interval)
    assert budget_s - 0.02 - eval_s < took <= budget_s + 1e-9, (took, steps)


def test_a_slow_start_is_corrected_after_the_evaluations() -> None:
    # the first 50 steps at a third of the speed: the calibration alone would stop early
    def step_s(step: int) -> float:
        return 0.06 if step < 50 else 0.02

    first = fit_max_iters(60, steps_done=UNTIMED_STEPS + CALIBRATION_STEPS,
                          elapsed_s=0.06 * (UNTIMED_STEPS + CALIBRATION_STEPS), step_s=0.06,
                          eval_s=0.5, eval_interval=100)
    took, steps = _simulate(60, step_s, 0.5, 100)
    assert steps > 2 * first  # refitted after each evaluation
    assert 60 - 0.5 - 0.02 < took <= 60 + 1e-9, (took, steps)


def _copy_run(**overrides: Any) -> tuple[Any, GPTConfig, TrainConfig]:
    dataset = load_dataset("copy")
    model = GPTConfig(vocab_size=dataset.tokenizer.vocab_size, block_size=dataset.max_block_size,
                      n_layer=1, n_head=2, n_embd=16)
    config = TrainConfig(max_iters=5, batch_size=4, lr=3e-3, warmup_iters=5, eval_interval=40,
                         eval_iters=2, seed=3, time_budget="2s", **overrides)
    return dataset, model, config


def _fits(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [row for row in history if "max_iters" in row]


def test_a_budgeted_run_fits_its_steps_and_ends_its_schedule_there(tmp_path: Path) -> None:
    dataset, model, config = _copy_run()
    result = train(model, config, dataset, tmp_path)

    assert config.max_iters == 5 and config.time_budget == "2s"  # the caller's is not changed
    fits = _fits(result.history)
    assert fits[0]["step"] == UNTIMED_STEPS + CALIBRATION_STEPS
    steps = [row["step"] for row in result.history if "loss" in row]
    last = fits[-1]["max_iters"]
    assert steps == list(range(1, last + 1)) and last > 5  # ran on past the recipe's 5
    meta = load_checkpoint(tmp_path / "ckpt").meta
    assert meta["step"] == meta["train_config"]["max_iters"] == last
    saved = TrainConfig(**meta["train_config"])
    assert saved.time_budget == "2s"
    final_lr = [row["lr"] for row in result.history if "loss" in row][-1]
    assert final_lr == pytest.approx(saved.lr_at(last - 1))
    assert saved.lr_at(last) == pytest.approx(saved.lr / 10)  # the cosine ends at the last step
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert _fits(logged) == fits


def test_a_resumed_budgeted_run_keeps_its_fitted_step_count(tmp_path: Path) -> None:
    dataset, model, config = _copy_run()
    stop_at = UNTIMED_STEPS + CALIBRATION_STEPS + 5

    def interrupt(row: dict[str, Any]) -> None:
        if row.get("step") == stop_at and "loss" in row:
            os.kill(os.getpid(), signal.SIGINT)

    first = train(model, config, dataset, tmp_path, callback=interrupt)
    assert first.interrupted
    fitted = _fits(first.history)[-1]["max_iters"]
    assert load_checkpoint(tmp_path / "ckpt").meta["train_config"]["max_iters"] == fitted
    saved = TrainConfig(**load_checkpoint(tmp_path / "ckpt").meta["train_config"])
    rest = train(model, saved, dataset, tmp_path, resume=True)
    assert not rest.interrupted
    assert _fits(rest.history) == _fits(first.history)  # no new fit after the resume
    assert [row["step"] for row in rest.history if "loss" in row][-1] == fitted


def test_a_run_stopped_before_its_fit_fits_when_resumed(tmp_path: Path) -> None:
    # it saved the recipe's max_iters with the budget, and the resume trained all of them
    # (700 steps, 730 s, for a 30 s budget)
    dataset, model, config = _copy_run()  # max_iters 5, a 2 s budget

    def interrupt(row: dict[str, Any]) -> None:
        if row.get("step") == UNTIMED_STEPS + 1 and "loss" in row:
            os.kill(os.getpid(), signal.SIGINT)

    first = train(model, config, dataset, tmp_path, callback=interrupt)
    assert first.interrupted and _fits(first.history) == []
    saved = TrainConfig(**load_checkpoint(tmp_path / "ckpt").meta["train_config"])
    rest = train(model, saved, dataset, tmp_path, resume=True)
    assert saved.max_iters == 5  # the recipe's, saved before the fit
    fits = _fits(rest.history)
    assert fits and fits[0]["step"] == UNTIMED_STEPS + 1 + UNTIMED_STEPS + CALIBRATION_STEPS
    last = [row["step"] for row in rest.history if "loss" in row][-1]
    assert last == fits[-1]["max_iters"] > 5
    assert load_checkpoint(tmp_path / "ckpt").meta["train_config"]["max_iters"] == last


def test_cli_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "run")
    assert main(["train", "--quiet", "--out", out, "--time_budget", "5m", "--max_iters", "9"]) == 1
    assert "--time_budget 5m and --max_iters 9: choose one" in capsys.readouterr().err
    assert main(["train", "--quiet", "--out", out, "--time_budget", "soon"]) == 1
    assert "must be a positive duration like 90s" in capsys.readouterr().err
    assert main(["train", "--out", out, "--time_budget", "3s", "--n_layer", "1"]) == 0
    said = capsys.readouterr().out
    assert "train    3s (3 s; steps fitted to the speed of the first 12) x" in said
    assert "budget   3s: " in said and "steps/s, evaluations included" in said
    # a resume trains on to a new max_iters: no budget line, and the time is since resuming
    step = load_checkpoint(Path(out) / "ckpt").meta["step"]
    assert main(["train", "--quiet", "--out", out, "--resume", "--max_iters", str(step + 2)]) == 0
    said = capsys.readouterr().out
    assert f"train    {step + 2} steps (the run began with a 3s budget) x" in said
    assert "s since resuming, " in said and "budget   " not in said
