"""`TrainConfig`: how to train, validated, with the learning-rate schedule; `FittedSchedule`:
where a time budget's fits (budget.py) left that schedule; `TrainResult`: what a run returns.
Every field of TrainConfig is an `attnlab train` flag, its comment the flag's help."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..model.gpt import GPT
from ..tokenizers import Tokenizer
from .budget import parse_duration


@dataclass
class TrainConfig:
    """How to train. Defaults: nanoGPT's shakespeare_char CPU recipe, 2000 iterations."""

    max_iters: int = 2000  # optimizer steps
    # train for this long instead (90s, 5m, 1.5h): max_iters fitted to the measured speed,
    # and the lr schedule to max_iters (budget.py)
    time_budget: str | None = None
    batch_size: int = 12  # sequences per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3  # peak learning rate
    min_lr: float | None = None  # floor of the cosine decay; None = lr / 10
    warmup_iters: int = 100  # linear warmup steps
    decay_lr: bool = True  # cosine decay to min_lr at max_iters (False: constant after warmup)
    optimizer: str = "adamw"  # adamw | sgd (plain: no momentum, no weight decay)
    weight_decay: float = 0.1  # AdamW decay on 2-d weights only (not biases, norms)
    beta2: float = 0.99  # AdamW beta2; 0.99 suits small batches (nanoGPT char)
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    eval_interval: int = 250  # evaluate and checkpoint every this many steps
    # batches of each split per evaluation, each of the optimizer's batch_size x grad_accum
    # sequences (run as micro-batches of batch_size): the same sequences however it is split
    eval_iters: int = 20
    # stop after this many evaluations without a better val loss, the checkpoint keeping the
    # best one's weights; None: train to max_iters, checkpointing at every evaluation
    patience: int | None = None
    # float32 | bfloat16 (autocast: fast where the CPU or GPU has bfloat16 units, emulated
    # and slow elsewhere)
    dtype: str = "float32"
    compile: bool = False  # torch.compile the model
    # one CUDA GPU: record the whole step (forward, backward, clipping, AdamW) as one CUDA
    # graph after three eager steps, and replay it (train/graph_step.py)
    cuda_graph: bool = False
    # fused (SDPA) | explicit | auto: explicit under bfloat16 on CPU, where SDPA's backward
    # loses to the explicit path at short contexts
    # (docs/performance.md#explicit-attention-in-training)
    attention: str = "auto"
    device: str = "auto"  # auto (CUDA if present, else CPU) | cpu | cuda | cuda:N | mps
    seed: int = 1337  # seeds init, batches and dropout
    # tokens per training sequence on text; None: the model's whole context (block_size).
    # Fewer fine-tune a long-context model (2048 for SmolLM, 32k for Qwen) on a CPU
    seq_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_iters", "batch_size", "grad_accum", "eval_interval", "eval_iters",
                     "seq_len", "patience"):
            value = getattr(self, name)
            if name in ("seq_len", "patience") and value is None:
                continue
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainConfig.{name}={value!r} must be a positive integer")
        if not 0 < self.lr < math.inf:
            raise ValueError(f"lr={self.lr} must be a finite number > 0")
        if self.min_lr is not None and not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"min_lr={self.min_lr} must be in [0, lr={self.lr}]")
        if self.warmup_iters < 0:
            raise ValueError(f"warmup_iters={self.warmup_iters} must be >= 0")
        if self.time_budget is not None:
            parse_duration(self.time_budget)
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer={self.optimizer!r}; choose adamw or sgd")
        if self.cuda_graph and self.optimizer != "adamw":
            raise ValueError("cuda_graph records fused AdamW's step; use --optimizer adamw or "
                             "--cuda_graph false")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype={self.dtype!r}; choose float32 or bfloat16")
        if self.attention not in ("auto", "fused", "explicit"):
            raise ValueError(f"attention={self.attention!r}; choose auto, fused or explicit")
        if not (self.grad_clip >= 0 and 0 <= self.weight_decay < math.inf):  # False for nan
            raise ValueError(
                f"grad_clip={self.grad_clip} and weight_decay={self.weight_decay} must be >= 0 "
                "(weight_decay finite)"
            )

    def warmup_for(self, max_iters: int) -> int:
        """The warmup a run of `max_iters` steps gets from this config: its own, or a tenth of
        the run where its own is over a quarter of it (a recipe's 50-step warmup would leave
        a 20-step fine-tune rising all the way, never at lr nor decayed)."""
        return max_iters // 10 if self.warmup_iters > max_iters // 4 else self.warmup_iters

    def lr_at(self, step: int, fitted: FittedSchedule | None = None) -> float:
        """Linear warmup to lr, then cosine decay to min_lr at max_iters (nanoGPT's get_lr);
        `fitted`: the schedule as a time budget's last fit left it (`refit`)."""
        fitted = fitted or FittedSchedule(self.warmup_iters, self.warmup_iters)
        warmup, end = fitted.warmup_iters, fitted.warmup_end
        if step < end:  # a warmup of `warmup` steps, moved to end at `end`
            return self.lr * (step + 1 + warmup - end) / (warmup + 1)
        if not self.decay_lr:
            return self.lr
        min_lr = self.lr / 10 if self.min_lr is None else self.min_lr
        progress = self._progress(step, fitted)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (self.lr - min_lr)

    def _progress(self, step: int, fitted: FittedSchedule) -> float:
        """How far the cosine decay has come at `step` (past the warmup): from
        fitted.decay_from at the warmup's end to 1 at max_iters, and 1 from there on."""
        start, end = fitted.decay_from, fitted.warmup_end
        span = self.max_iters - end
        if span <= 0:  # a warmup to max_iters or past it: step is past max_iters
            return 1.0
        return min(1.0, start + (1 - start) * (step - end) / span)

    def refit(self, step: int, max_iters: int, fitted: FittedSchedule | None) -> FittedSchedule:
        """The schedule from `step` on when a time budget fits the run, which this config's
        max_iters and `fitted` describe until now, to `max_iters` steps. Its warmup is
        `warmup_for(max_iters)` of this config's warmup_iters (the recipe's, whatever an
        earlier fit took), and it goes on from the lr `step` has now, so a fit never makes
        the lr jump: a warmup under way climbs on at that warmup's slope (a shorter warmup
        than the run has done gets steeper, not cut short), and a decay under way goes on
        from where it is to min_lr at the new end."""
        fitted = fitted or FittedSchedule(self.warmup_iters, self.warmup_iters)
        warmup = self.warmup_for(max_iters)
        if step < fitted.warmup_end:
            climbed = (step + 1 + fitted.warmup_iters - fitted.warmup_end) / (
                fitted.warmup_iters + 1)  # the share of lr reached at `step`
            return FittedSchedule(warmup, step + (1 - climbed) * (warmup + 1))
        return FittedSchedule(warmup, float(step), self._progress(step, fitted))


@dataclass(frozen=True)
class FittedSchedule:
    """Where a time budget's last fit (`TrainConfig.refit`) left the lr schedule: the warmup
    climbs at the slope of a `warmup_iters`-step one and reaches lr at step `warmup_end`
    (not a whole step where it went on from the lr of the step fitted at), then the cosine
    decay goes from `decay_from` (0: at lr) to min_lr at max_iters. Each fit's row in a run's
    metrics (the row with "max_iters") holds its schedule, and a resumed run goes on with
    the last one (`fitted_schedule`)."""

    warmup_iters: int  # the warmup's slope: lr / (warmup_iters + 1) a step
    warmup_end: float  # the step the warmup reaches lr at
    decay_from: float = 0.0  # the cosine decay's progress at warmup_end, 0 to 1


def fitted_schedule(history: Sequence[dict[str, Any]]) -> FittedSchedule | None:
    """The schedule a run's last fit left (its row in the run's `history`); None before a fit,
    and for runs saved before fits kept theirs (their config holds the fitted warmup)."""
    fits = [row for row in history if "warmup_end" in row]
    if not fits:
        return None
    return FittedSchedule(fits[-1]["warmup_iters"], fits[-1]["warmup_end"],
                          fits[-1]["decay_from"])


@dataclass
class TrainResult:
    # model and history stay out of the repr a notebook shows for `train(...)`: with them, it
    # would print every module and a metrics row per step above the outcome
    model: GPT = field(repr=False)
    tokenizer: Tokenizer
    history: list[dict[str, Any]] = field(default_factory=list, repr=False)  # a row per step / eval
    checkpoint: Path | None = None
    val_loss: float | None = None
    val_bpb: float | None = None  # val loss in bits per byte of text (None for tasks)
    val_step: int | None = None  # the step val_loss was evaluated at (an interrupt saves later)
    # stopped by TrainConfig.patience: val_loss is the best evaluation's, the model its weights
    stopped_early: bool = False
    seconds: float = 0.0  # wall clock of this call: steps, evaluations, saves, compiling
    # throughput of the optimizer steps: evaluations, saves and the first step of the call
    # (torch.compile compiles there, and the allocator warms up) left out
    tokens_per_second: float = 0.0
    interrupted: bool = False
