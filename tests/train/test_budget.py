"""Training for a time budget: durations, the fitted step count, a run that keeps to it."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from attnlab.cli import main
from attnlab.load import load_checkpoint
from attnlab.model.gpt import GPTConfig
from attnlab.train import loop
from attnlab.train.budget import (
    CALIBRATION_STEPS,
    UNTIMED_STEPS,
    Budget,
    fit_max_iters,
    parse_duration,
)
from attnlab.train.config import fitted_schedule
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
    schedule = fitted_schedule(result.history)
    assert final_lr == pytest.approx(saved.lr_at(last - 1, schedule))
    # the cosine ends at the last step
    assert saved.lr_at(last, schedule) == pytest.approx(saved.lr / 10)
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


def _clocked_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step_s: Callable[[int], float],
    stop_at: int | None = None, resume: bool = False, **overrides: Any,
) -> Any:
    """A budgeted copy-task run on a fake clock: step `step` takes step_s(step) seconds and an
    evaluation none, so its fits are the same on any machine. Its recipe warms up for 40
    steps; at 0.01 s a step its 0.5 s fit at step 12 to 48 steps makes that a tenth of them
    (4). Stopped with SIGINT after step `stop_at`."""
    dataset = load_dataset("copy")
    model = GPTConfig(vocab_size=dataset.tokenizer.vocab_size, block_size=dataset.max_block_size,
                      n_layer=1, n_head=2, n_embd=16, dropout=0.1)
    config = TrainConfig(**{"max_iters": 2000, "batch_size": 4, "lr": 3e-3, "warmup_iters": 40,
                            "eval_interval": 1000, "eval_iters": 2, "seed": 3,
                            "time_budget": "0.5s", **overrides})
    clock = [0.0]
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def tick(row: dict[str, Any]) -> None:  # a step's loss is logged before its fit
        if "loss" in row:
            clock[0] += step_s(row["step"])
            if row["step"] == stop_at:
                os.kill(os.getpid(), signal.SIGINT)

    if resume:  # the configs saved, as `attnlab train --resume` reads them: the fitted max_iters
        config = TrainConfig(**load_checkpoint(tmp_path / "ckpt").meta["train_config"])
    return train(model, config, dataset, tmp_path, resume=resume, callback=tick)


def _lrs(history: list[dict[str, Any]]) -> list[float]:
    return [row["lr"] for row in history if "loss" in row]


def test_a_fit_in_the_warmup_goes_on_from_the_lr_the_run_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fit at step 12 shortens the 40-step warmup to 4 steps, which the run is past: the
    lr used to jump from 13/41 of lr to lr in one step (a step 3x the last). It climbs on at
    a 4-step warmup's slope instead, reaches lr and decays to the end."""
    result = _clocked_run(tmp_path, monkeypatch, lambda step: 0.01)
    [fit] = _fits(result.history)
    assert (fit["step"], fit["max_iters"], fit["warmup_iters"]) == (12, 48, 4)
    lrs, lr = _lrs(result.history), 3e-3
    assert len(lrs) == 48 and lrs[11] == pytest.approx(lr * 12 / 41)  # the recipe's warmup
    steps = [b - a for a, b in itertools.pairwise(lrs)]
    assert max(steps) == pytest.approx(lr / 5)  # the 4-step warmup's slope, nothing steeper
    assert max(b / a for a, b in itertools.pairwise(lrs)) < 2.7
    assert max(lrs) == pytest.approx(lr, rel=1e-2) and lrs[-1] == pytest.approx(lr / 10, rel=0.05)
    assert all(a >= b for a, b in itertools.pairwise(lrs[lrs.index(max(lrs)):]))


def test_a_refit_to_more_steps_warms_up_from_the_recipes_warmup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the evaluation at step 13 the run is ten times faster and refits to hundreds of
    steps: their warmup is the recipe's 40 steps again, not the 4 of the first fit's 48
    (each fit used to shorten the last one's), and the lr climbs on at its slope."""
    result = _clocked_run(tmp_path, monkeypatch, lambda step: 0.01 if step <= 12 else 0.001,
                          stop_at=20, eval_interval=13)
    first, second = _fits(result.history)
    assert (first["step"], first["warmup_iters"]) == (12, 4)
    assert second["step"] == 14 and second["max_iters"] >= 4 * 40
    assert second["warmup_iters"] == 40
    lrs, lr = _lrs(result.history), 3e-3
    assert [b - a for a, b in itertools.pairwise(lrs[14:])] == pytest.approx([lr / 41] * 5)


def test_a_run_resumed_after_its_fit_goes_on_as_the_uninterrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stopped at step 14, in the warmup its fit moved, the resumed run takes the fitted
    schedule from its checkpoint's history: every lr and loss as the run never stopped."""
    whole = _clocked_run(tmp_path / "whole", monkeypatch, lambda step: 0.01)
    first = _clocked_run(tmp_path / "split", monkeypatch, lambda step: 0.01, stop_at=14)
    assert first.interrupted and len(_fits(first.history)) == 1
    rest = _clocked_run(tmp_path / "split", monkeypatch, lambda step: 0.01, resume=True)

    def timeless(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in row.items() if k != "tokens_per_s"} for row in history]

    assert timeless(rest.history) == timeless(whole.history)
    assert rest.val_loss == whole.val_loss


@pytest.mark.parametrize(("step", "max_iters"), [
    (12, 48), (12, 3000),  # in the recipe's warmup: a shorter one, a longer one
    (14, 30), (14, 900),  # in the warmup of a fit to 48 steps (4 of them): shorter, longer
    (30, 36), (30, 90), (48, 60),  # in its decay: sooner, later, past its end
])
def test_a_fit_keeps_the_lr_of_the_step_it_is_made_at(step: int, max_iters: int) -> None:
    """The schedule a fit makes gives its step the lr the last one did, then climbs or
    decays from there (never back up once decaying) to min_lr at the new end."""
    config = TrainConfig(max_iters=2000, lr=1.0, min_lr=0.1, warmup_iters=40)
    before = None
    if step > 12:  # after a first fit at step 12 to 48 steps
        before = config.refit(12, 48, None)
        config.max_iters = 48
    after = config.refit(step, max_iters, before)
    lr = config.lr_at(step, before)
    fitted = TrainConfig(**{**config.__dict__, "max_iters": max_iters})
    assert after.warmup_iters == fitted.warmup_for(max_iters)  # from the recipe's 40
    lrs = [fitted.lr_at(s, after) for s in range(step, max_iters + 1)]
    assert lrs[0] == pytest.approx(lr, rel=1e-12) and lrs[-1] == pytest.approx(0.1)
    peak = lrs.index(max(lrs))
    assert all(a < b for a, b in itertools.pairwise(lrs[:peak + 1]))
    assert all(a >= b for a, b in itertools.pairwise(lrs[peak:]))
    if after.warmup_end > step + 1:  # climbing on: at the slope of the new warmup
        assert lrs[1] - lrs[0] == pytest.approx(1 / (after.warmup_iters + 1))
