"""Training to quality: wall time until `attnlab.train.loop.train` reaches val loss 1.90.

tiny Shakespeare, char tokenizer, the real training loop (evaluations and checkpoints
included in the time, as in nanoGPT's own run). Two recipes: attnlab running nanoGPT's
shakespeare_char CPU recipe (4 layers, 4 heads, 128 dims, context 64, batch 12, lr 1e-3,
2000 iterations, dropout 0), and attnlab's best CPU recipe. Target: the best recipe needs at
most half the time of nanoGPT's recipe (nanoGPT itself: 93 s to val loss 1.886 on the
project's machine of the time, measured by an earlier session).

Levers that `train.py` cannot express yet (explicit attention in training, fused AdamW) are
switched on by `levers()`, which patches them in for the duration of one run; the report
gives the diff that makes them TrainConfig fields.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from attnlab.model.gpt import GPT, GPTConfig
from attnlab.model.runtime import SlowBF16Warning
from attnlab.train.data import Dataset, load_dataset
from attnlab.train.loop import TrainConfig, evaluate, sequence_length

from .common import machine, table

# the module, not the `attnlab.train.loop` function that attnlab/__init__.py re-exports
train_mod: Any = importlib.import_module("attnlab.train.loop")

TARGET_LOSS = 1.90
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
NANOGPT_SECONDS = 93.0  # nanoGPT's own CPU recipe, an earlier session's machine, val 1.886


@dataclass(frozen=True)
class Recipe:
    model: dict[str, Any]  # GPTConfig fields over the "tiny" preset
    train: dict[str, Any]  # TrainConfig fields over its defaults
    threads: int = 1
    explicit_attention: bool = False  # model(x, y, fused=False) in training and evaluation
    fused_adamw: bool = False  # AdamW(fused=True) instead of foreach=True
    note: str = ""


NANOGPT_TRAIN = dict(max_iters=2000, batch_size=12, lr=1e-3, min_lr=1e-4, warmup_iters=100,
                     eval_interval=250, eval_iters=20, beta2=0.99, weight_decay=0.1)
RECIPES: dict[str, Recipe] = {
    "nanoGPT recipe": Recipe({"dropout": 0.0}, NANOGPT_TRAIN, note="float32, 1 thread"),
    "attnlab best": Recipe(
        {"dropout": 0.0},
        {**NANOGPT_TRAIN, "max_iters": 700, "batch_size": 24, "lr": 4e-3, "min_lr": 4e-4,
         "warmup_iters": 50, "eval_interval": 100, "dtype": "bfloat16"},
        explicit_attention=True, fused_adamw=True,
        note="bf16 autocast, explicit attention, fused AdamW, 1 thread; batch 24, lr 4e-3, "
             "700 iterations",
    ),
}


class _Reached(Exception):
    """Raised from the metrics callback to stop a run once it reached the target."""


@contextlib.contextmanager
def levers(recipe: Recipe) -> Iterator[None]:
    """Patch in the levers train.py has no field for, and set the thread count."""
    forward, make_optimizer = GPT.forward, train_mod.make_optimizer
    threads = torch.get_num_threads()
    if recipe.explicit_attention:
        def explicit_forward(self: GPT, *args: Any, fused: bool | None = None,
                             **kwargs: Any) -> Any:
            return forward(self, *args, fused=False if fused is None else fused, **kwargs)
        GPT.forward = explicit_forward  # type: ignore[method-assign]
    if recipe.fused_adamw:
        def fused_optimizer(model: GPT, config: TrainConfig) -> torch.optim.Optimizer:
            optimizer = make_optimizer(model, config)
            groups = [{"params": g["params"], "weight_decay": g["weight_decay"]}
                      for g in optimizer.param_groups]
            return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, config.beta2),
                                     fused=True)
        train_mod.make_optimizer = fused_optimizer
    torch.set_num_threads(recipe.threads)
    try:
        yield
    finally:
        GPT.forward = forward  # type: ignore[method-assign]
        train_mod.make_optimizer = make_optimizer
        torch.set_num_threads(threads)


def time_to_loss(
    recipe: Recipe, dataset: Dataset, target: float = TARGET_LOSS, stop_at_target: bool = True
) -> dict[str, Any]:
    """Train with `recipe`; seconds (from the start of `train`) until val loss <= target."""
    vocab = dataset.tokenizer.vocab_size
    model_config = GPTConfig.from_name("tiny", **{"vocab_size": vocab, **recipe.model})
    config = TrainConfig(**{**recipe.train, "device": "cpu"})
    evals: list[dict[str, Any]] = []
    t0 = c0 = 0.0

    def on_row(row: dict[str, Any]) -> None:
        if "val_loss" in row:
            evals.append({"step": row["step"], "val_loss": row["val_loss"],
                          "seconds": time.perf_counter() - t0,
                          "cpu_seconds": time.process_time() - c0})
            if stop_at_target and row["val_loss"] <= target:
                raise _Reached

    with tempfile.TemporaryDirectory() as out, levers(recipe), warnings.catch_warnings():
        warnings.simplefilter("ignore", SlowBF16Warning)  # bfloat16's speed is what we measure
        t0, c0 = time.perf_counter(), time.process_time()
        result = None
        with contextlib.suppress(_Reached):
            result = train_mod.train(model_config, config, dataset, out, callback=on_row)
        seconds = time.perf_counter() - t0
        final_fp32 = None
        if result is not None:  # the final model's val loss without autocast, for honesty
            fp32 = dataclasses.replace(config, dtype="float32")
            final_fp32 = evaluate(result.model, dataset, fp32,
                                  sequence_length(model_config, dataset))["val_loss"]
    reached = next((e for e in evals if e["val_loss"] <= target), None)
    return {
        "recipe": dataclasses.asdict(recipe),
        "evals": evals,
        "seconds_to_target": reached["seconds"] if reached else None,
        "cpu_seconds_to_target": reached["cpu_seconds"] if reached else None,
        "step_at_target": reached["step"] if reached else None,
        "seconds": seconds,
        "final_val_loss": evals[-1]["val_loss"] if evals else None,
        "final_val_loss_fp32": final_fp32,
    }


def run(
    quick: bool = False,
    *,
    data: str | Path | None = None,
    recipes: dict[str, Recipe] | None = None,
    target: float = TARGET_LOSS,
) -> dict[str, Any]:
    """Quick mode trains each recipe for 1/20 of its iterations: a smoke test, not a result."""
    path = Path(data) if data is not None else DATA
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; pass data= a text file (tiny Shakespeare)")
    recipes = recipes or RECIPES
    if quick:
        recipes = {name: _shortened(r, 20) for name, r in recipes.items()}
    with tempfile.TemporaryDirectory() as cache:
        dataset = load_dataset(str(path), "char", cache_dir=cache)
        results = {name: time_to_loss(r, dataset, target, stop_at_target=not quick)
                   for name, r in recipes.items()}
    return summarize(results, path.name, target, quick)


def summarize(
    results: dict[str, dict[str, Any]], data_name: str, target: float = TARGET_LOSS,
    quick: bool = False, extra_notes: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The suite's result from `time_to_loss` results keyed by recipe name."""

    def ratio(name: str, key: str) -> float | None:
        mine = results.get(name, {}).get(key)
        base = results.get("nanoGPT recipe", {}).get(key)
        return None if mine is None or not base else mine / base

    rows = []
    for name, r in results.items():
        wall, cpu = ratio(name, "seconds_to_target"), ratio(name, "cpu_seconds_to_target")
        rows.append([name, r["recipe"]["note"], r["step_at_target"] or "-",
                     r["seconds_to_target"] or "not reached", r["cpu_seconds_to_target"] or "-",
                     "-" if wall is None else wall, "-" if cpu is None else cpu, r["seconds"],
                     r["final_val_loss"], r["final_val_loss_fp32"] or "-"])
    wall, cpu = ratio("attnlab best", "seconds_to_target"), ratio("attnlab best",
                                                                 "cpu_seconds_to_target")
    met = None if wall is None else wall <= 0.5
    notes = [
        f"data: {data_name}, char tokenizer; seconds (wall, and this process's CPU time) from "
        f"the start of train() to the first evaluation with val loss <= {target:.2f}, evaluations "
        "and checkpoints included; the run stops there. One torch thread, on a shared 2-core "
        "machine where other processes ran at the same time: CPU time is what wall time "
        "would be on an idle core.",
        f"nanoGPT itself: {NANOGPT_SECONDS:.0f} s to val loss 1.886 on an earlier session's "
        "machine (not in this run; compare with the nanoGPT recipe row, run here).",
    ]
    if wall is not None and cpu is not None:
        notes.append(f"target: best recipe <= 1/2 of nanoGPT's recipe time: "
                     f"{'met' if met else 'missed'} ({wall:.2f}x wall, {cpu:.2f}x CPU time).")
    notes += extra_notes
    if quick:
        notes.append("quick: 1/20 of the iterations, a smoke test; times mean nothing.")
    return {
        "suite": "quality",
        "machine": machine(),
        "target_loss": target,
        "results": results,
        "target_met": met,
        "tables": [table(
            f"Time to val loss {target:.2f} (tiny Shakespeare, char)",
            ["recipe", "levers", "step", "seconds", "CPU s", "x nanoGPT recipe",
             "x (CPU time)", "run s", "last val loss", "final val loss (fp32 eval)"],
            rows,
        )],
        "notes": notes,
    }


def _shortened(recipe: Recipe, factor: int) -> Recipe:
    t = recipe.train
    iters = max(2, t["max_iters"] // factor)
    short = {**t, "max_iters": iters, "eval_interval": iters, "eval_iters": 2,
             "warmup_iters": min(t.get("warmup_iters", 0), iters // 2)}
    return dataclasses.replace(recipe, train=short)

