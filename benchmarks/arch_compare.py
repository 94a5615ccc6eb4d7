"""`attnlab train --arch llama` vs the GPT-2-style recipe on tiny Shakespeare, side by side.

Both arches train the text recipe of `attnlab.train.recipes.recipe` (the "tiny" shape, its
schedule and dtype); `--arch llama` swaps in RoPE, RMSNorm, SwiGLU and no biases with d_ff
chosen for the same parameter count. One torch thread; the clock is this process's CPU
time (`common.clock`), so the budget is the same for both: the GPT-2-style run's time to
finish its schedule. Reported: each arch's val loss at the end of its schedule, its time,
and the llama run's last val loss inside the GPT-2-style run's budget.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from attnlab.model.gpt import count_params
from attnlab.train.data import load_dataset
from attnlab.train.loop import train
from attnlab.train.recipes import recipe

from .common import machine, table

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"


def _train(arch: str, data: Path, max_iters: int | None) -> dict[str, Any]:
    dataset = load_dataset(str(data), "char")
    model_config, config = recipe(dataset, arch)
    if max_iters is not None:
        config = dataclasses.replace(config, max_iters=max_iters,
                                     eval_interval=max(1, max_iters // 2), eval_iters=2)
    evals: list[tuple[float, int, float]] = []  # (cpu seconds, step, val loss)
    t0 = time.process_time()

    def on_row(row: dict[str, Any]) -> None:
        if "val_loss" in row:
            evals.append((time.process_time() - t0, int(row["step"]), float(row["val_loss"])))

    with tempfile.TemporaryDirectory() as out:
        result = train(model_config, config, dataset, Path(out), callback=on_row)
    return {
        "arch": arch, "params": count_params(model_config), "d_ff": model_config.ff_size,
        "steps": config.max_iters, "dtype": config.dtype, "cpu_s": time.process_time() - t0,
        "wall_s": result.seconds, "val_loss": result.val_loss, "evals": evals,
    }


def run(quick: bool = False, data: Path = DATA, max_iters: int | None = None) -> dict[str, Any]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if quick and max_iters is None:
            max_iters = 4
        runs = {arch: _train(arch, data, max_iters) for arch in ("gpt2", "llama")}
    finally:
        torch.set_num_threads(threads)
    budget = runs["gpt2"]["cpu_s"]
    in_budget = [e for e in runs["llama"]["evals"] if e[0] <= budget]
    rows = [
        [arch, f"{r['params']:,}", r["d_ff"], r["steps"], r["dtype"], f"{r['cpu_s']:.1f}",
         f"{r['val_loss']:.4f}" if r["val_loss"] is not None else "-"]
        for arch, r in runs.items()
    ]
    notes = [
        f"llama val loss within the gpt2 run's {budget:.1f} CPU s: "
        + (f"{in_budget[-1][2]:.4f} at step {in_budget[-1][1]}" if in_budget else "no eval yet"),
        "tiny Shakespeare, char tokenizer, attnlab's text recipe (recipes.recipe), one thread",
    ]
    return {
        "suite": "arch", "machine": machine(), "runs": runs,
        "tables": [table(
            "--arch llama vs the GPT-2-style recipe (tiny Shakespeare, same schedule)",
            ["arch", "parameters", "d_ff", "steps", "dtype", "CPU s", "val loss"], rows,
        )],
        "notes": notes,
    }
