"""Training-step throughput at nanoGPT's shakespeare_char settings, on one GPU, in several
ways side by side: where does a training step's time go, and which way should the GPU
recipe train? (docs/gpu.md#the-gpu-check). Not a suite: a probe for a lent GPU.

Each way trains the same shape (6 layers, 6 heads, 384 wide, context 256, batch 64, dropout
0.2, no biases) on random tokens held on the GPU, with fused AdamW, gradient clipping and
bfloat16 autocast, for WARMUP steps and then STEPS timed steps (one synchronise at each
end, so the CPU may run ahead of the GPU, as in a loop that reads the loss rarely), and
"sync" ways read the loss every step (`float(loss)`, as attnlab's loop did). attnlab's ways
call the model as its loop does, with check_ids=False; "ids checked on the GPU" lets the
model check them, reading four values back every step (as the loop did before). nanoGPT's model
is benchmarks/nanogpt_baseline.py's. The JSON is rewritten after each way, so a time limit
keeps what finished.

    python -m benchmarks.gpu_step_probe --out FILE [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from attnlab import GPT, GPTConfig
from attnlab.model.runtime import quiet_compile
from attnlab.train.config import TrainConfig
from attnlab.train.graph_step import GraphedStep
from attnlab.train.loop import make_optimizer
from attnlab.train.state import compile_blocks

from .nanogpt_baseline import NanoGPT

WARMUP, STEPS = 15, 60
SHAPE = {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256}
VOCAB, BATCH = 65, 64


def build(kind: str, device: torch.device, shape: dict[str, int]) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "nanogpt":
        return NanoGPT(VOCAB, shape["block_size"], shape["n_layer"], shape["n_head"],
                       shape["n_embd"], bias=False, dropout=0.2).to(device)
    config = GPTConfig(vocab_size=VOCAB, dropout=0.2, bias=False, gelu="exact", **shape)
    return GPT(config).to(device)


def optimizer_for(model: torch.nn.Module) -> torch.optim.Optimizer:
    """Each model's own fused AdamW at nanoGPT's settings (lr 1e-3, betas (0.9, 0.99),
    weight decay 0.1 on matrices)."""
    if isinstance(model, NanoGPT):
        return model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), fused=True)
    assert isinstance(model, GPT)
    return make_optimizer(model, TrainConfig(lr=1e-3, beta2=0.99, weight_decay=0.1))


def _sample(data: torch.Tensor, t: int, device: torch.device) -> torch.Tensor:
    """BATCH random windows of t + 1 tokens of the GPU-held `data`: (B, T + 1)."""
    ix = torch.randint(len(data) - t - 1, (BATCH,), device=device)  # (B,)
    return data[ix[:, None] + torch.arange(t + 1, device=device)]  # (B, T + 1)


def _train_on(kind: str, model: torch.nn.Module, call: Callable[..., Any],
              opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Forward, backward, clipping and AdamW on one batch, as each model's own loop makes them
    (nanoGPT's bfloat16 autocast with its cast cache, attnlab's without); the loss."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, cache_enabled=kind == "nanogpt"):
        # attnlab's loop checks ids on the host (check_ids=False); "checked": in the model,
        # four reads back from the GPU every step, as the loop did until 2026-11-26
        loss = call(x, y)[1] if kind == "nanogpt" else call(
            x, y, fused=True, check_ids=kind == "attnlab checked").loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def step_fn(kind: str, model: torch.nn.Module, call: Callable[..., Any],
            opt: torch.optim.Optimizer, data: torch.Tensor, t: int, device: torch.device,
            sync: bool, graphed: bool = False) -> Callable[[], None]:
    def step() -> None:
        if graphed:  # the last step's graph outputs are done with (as attnlab's loop says)
            torch.compiler.cudagraph_mark_step_begin()
        window = _sample(data, t, device)  # (B, T + 1)
        x, y = window[:, :-1].contiguous(), window[:, 1:].contiguous()  # (B, T) each
        loss = _train_on(kind, model, call, opt, x, y)
        opt.zero_grad(set_to_none=True)
        if sync:
            float(loss.detach())
    return step


def graph_step_fn(model: torch.nn.Module, call: Callable[..., Any], opt: torch.optim.Optimizer,
                  data: torch.Tensor, t: int, device: torch.device) -> Callable[[], None]:
    """attnlab's step as `attnlab train --cuda_graph` runs it (train/graph_step.py): step_fn's
    body, recorded as one CUDA graph after three eager steps."""
    graphed = GraphedStep(
        opt, lambda xs, ys: _train_on("attnlab", model, call, opt, xs[0], ys[0]).detach(), device)

    def step() -> None:
        window = _sample(data, t, device)  # (B, T + 1)
        graphed.step(window[None, :, :-1], window[None, :, 1:], 1e-3)  # (1, B, T) each
    return step


def measure(name: str, kind: str, mode: str | None, sync: bool, device: torch.device,
            shape: dict[str, int], warmup: int, steps: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    model = build(kind, device, shape)
    step_graph = mode is not None and mode.endswith(" step-graph")  # graph_step_fn's way
    mode = mode.removesuffix(" step-graph") if mode is not None else None
    mode = None if mode == "eager" else mode
    options = {} if mode in (None, "default") else {"mode": mode.removeprefix("regional ")}
    call: Callable[..., Any] = model
    if mode is not None and mode.startswith("regional"):
        options["mode"] = options["mode"].removeprefix("+ends ")
        # as attnlab train compiles on one GPU (+ends: the embedding and head too)
        compile_blocks(model, ends=mode.startswith("regional +ends"), **options)
    elif mode is not None:
        call = torch.compile(model, **options)
    opt = optimizer_for(model)
    data = torch.randint(VOCAB, (1_000_000,), device=device)
    step = graph_step_fn(model, call, opt, data, shape["block_size"], device) if step_graph \
        else step_fn(kind, model, call, opt, data, shape["block_size"], device, sync,
                     graphed=mode is not None and "reduce-overhead" in mode)
    with quiet_compile():
        step()
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        step()
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    t1 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    seconds = time.perf_counter() - t1
    tokens = steps * BATCH * shape["block_size"]
    return {"way": name, "first_step_s": round(first, 2), "ms_per_step":
            round(1000 * seconds / steps, 3), "tokens_per_s": round(tokens / seconds),
            "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            if device.type == "cuda" else None}


WAYS = [  # name, model, torch.compile mode (None: eager), read the loss every step
    ("nanoGPT compiled, loss read every step", "nanogpt", "default", True),
    ("nanoGPT compiled", "nanogpt", "default", False),
    ("attnlab eager, loss read every step", "attnlab", None, True),
    ("attnlab eager", "attnlab", None, False),
    ("attnlab compiled", "attnlab", "default", False),
    ("attnlab compiled, reduce-overhead", "attnlab", "reduce-overhead", False),
    ("attnlab blocks compiled, reduce-overhead", "attnlab", "regional reduce-overhead", False),
    ("attnlab blocks compiled, reduce-overhead, ids checked on the GPU", "attnlab checked",
     "regional reduce-overhead", False),
    ("attnlab blocks, embedding and head compiled, reduce-overhead", "attnlab",
     "regional +ends reduce-overhead", False),
    ("attnlab eager, whole step as one CUDA graph", "attnlab", "eager step-graph", False),
    ("attnlab blocks compiled, whole step as one CUDA graph", "attnlab",
     "regional default step-graph", False),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_step_probe")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on any device")
    parser.add_argument("--ways", help="the ways to run, their names joined by ';'")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape, warmup, steps = SHAPE, WARMUP, STEPS
    if args.smoke:
        shape, warmup, steps = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32}, 2, 2
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name() if device.type == "cuda"
                              else None, "torch": torch.__version__, "shape": shape,
                              "batch": BATCH, "ways": []}
    for name, kind, mode, sync in WAYS:
        if args.smoke and mode not in (None, "default", "regional default", "eager step-graph"):
            continue
        if args.ways and name not in args.ways.split(";"):
            continue
        # a cold compilation for each way: nothing cached from the one before
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="probe-inductor-")
        try:
            row = measure(name, kind, mode, sync, device, shape, warmup, steps)
        except Exception as err:  # a probe reports what failed and goes on
            row = {"way": name, "error": f"{type(err).__name__}: {err}"[:500]}
        result["ways"].append(row)
        print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps(result, indent=2))
        torch._dynamo.reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
