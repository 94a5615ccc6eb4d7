"""Training for a time budget (`TrainConfig.time_budget`, `attnlab train --time_budget 5m`).

The run takes its first steps on the recipe's warmup, times `CALIBRATION_STEPS` of them and
sets `max_iters` to the steps that fit in the budget, evaluations included; after every
evaluation it fits again from the speed of the steps since the last fit (the first steps of a
run are often slower than the rest, and a shared machine's speed drifts). The cosine
schedule ends at the fitted last step, and each fit goes on from the lr the run has, with no
jump, its warmup fitted from the recipe's (`TrainConfig.refit`). A resumed run keeps the
step count and schedule its checkpoint saved: the budget is not fitted again (a run stopped
before its first fit fits when it resumes, to the whole budget from there).
"""

from __future__ import annotations

import re
from collections.abc import Callable

UNTIMED_STEPS = 2  # first steps: allocator and kernel warm-up, not representative
CALIBRATION_STEPS = 10  # timed steps that measure the speed

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|min|m|h)?\s*")


def parse_duration(text: str) -> float:
    """Seconds in "90", "90s", "5m", "5min" or "1.5h"."""
    match = _DURATION.fullmatch(text)
    seconds = float(match[1]) * _UNITS[match[2] or ""] if match else 0.0
    if seconds <= 0:
        raise ValueError(
            f"time_budget={text!r} must be a positive duration like 90s, 5m or 1.5h"
        )
    return seconds


class Budget:
    """Fits a run's step count to `seconds` of wall-clock time (see the module docstring).

    `reduce` makes every process of a distributed run agree (the mean over ranks): each must
    arrive at the same step count.
    """

    def __init__(self, seconds: float, *, step: int, now: float, eval_interval: int,
                 eval_share: float, reduce: Callable[[float], float] = float) -> None:
        self.seconds = seconds
        self.started = now
        self.start_step = step
        self.eval_interval = eval_interval
        # an evaluation before one is timed: eval_share training steps (forward passes only)
        self.eval_share = eval_share
        self.reduce = reduce
        self.timed: tuple[int, float] | None = None  # (step, time) of the last fit
        self.eval_s: float | None = None  # the last evaluation's time (and its checkpoint)
        self.eval_total = 0.0  # evaluation time since then
        self.refit = False  # an evaluation since the last fit
        self.fitted = False
        self.step_s = 0.0  # the last fit's measured seconds per step

    def evaluated(self, seconds: float) -> None:
        self.eval_s = seconds
        self.refit = True
        if self.timed is not None:
            self.eval_total += seconds

    def after_step(self, step: int, now: float) -> int | None:
        """The new step count when it is time to fit (after the calibration steps, then
        after every evaluation), else None."""
        if self.timed is None:
            if step - self.start_step >= UNTIMED_STEPS:
                self.timed = (step, now)
            return None
        timed_step, timed_at = self.timed
        calibrated = not self.fitted and step - timed_step == CALIBRATION_STEPS
        if not (calibrated or (self.fitted and self.refit and step > timed_step)):
            return None
        self.refit = False
        step_s = self.reduce((now - timed_at - self.eval_total) / (step - timed_step))
        eval_s = self.reduce(self.eval_s if self.eval_s is not None
                             else self.eval_share * step_s)
        elapsed = self.reduce(now - self.started)
        self.fitted, self.step_s = True, step_s
        self.timed, self.eval_total = (step, now), 0.0  # the next fit times the steps from here
        return fit_max_iters(self.seconds, steps_done=step, elapsed_s=elapsed, step_s=step_s,
                             eval_s=eval_s, eval_interval=self.eval_interval)


def fit_max_iters(
    budget_s: float, *, steps_done: int, elapsed_s: float, step_s: float, eval_s: float,
    eval_interval: int,
) -> int:
    """The step count that ends the run, its final evaluation included, at `budget_s`:
    each step costs `step_s` and every `eval_interval`-th one also an evaluation, `eval_s`."""
    per_step = step_s + eval_s / eval_interval  # a step plus its share of the evaluations
    left = budget_s - elapsed_s - eval_s  # the final evaluation always runs
    return steps_done + max(1, int(left / per_step))
