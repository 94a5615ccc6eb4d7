"""What a training run keeps beside its loop (loop.py): the stop flag Ctrl-C sets, the
checks before a run writes anything, and restoring a run from its checkpoint."""

from __future__ import annotations

import json
import math
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import load_attnlab_checkpoint, load_train_state
from ..model.gpt import GPT, GPTConfig, count_params
from .distributed import World


class StopFlag:
    """Turns SIGINT/SIGTERM/SIGHUP into a request to stop after the current optimizer step
    (SIGHUP: the terminal or ssh session of a run logging to a file was closed). A second
    Ctrl-C quits at once (KeyboardInterrupt), leaving the last saved checkpoint.

    on_stop gets the signal's name at the first request, at once: the step (or an evaluation
    of many batches) may take a while yet, and whoever shows the run says so meanwhile.
    torchrun: the process runs under torchrun's agent, which passes a Ctrl-C on as SIGINT and
    answers a second with SIGTERM (distributed.under_torchrun): then any signal after a SIGINT
    quits at once too."""

    def __init__(self, on_stop: Callable[[str], None] | None = None,
                 torchrun: bool = False) -> None:
        self.requested = False
        self.on_stop = on_stop
        self.torchrun = torchrun
        self._first: int | None = None  # the signal of the first request
        self._old: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        again = signum == signal.SIGINT or (self.torchrun and self._first == signal.SIGINT)
        if self.requested and again:
            raise KeyboardInterrupt  # saves are atomic: the last checkpoint stays whole
        first, self.requested = not self.requested, True
        if first:
            self._first = signum
        if first and self.on_stop is not None:
            self.on_stop(signal.Signals(signum).name)

    def __enter__(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            hangup = getattr(signal, "SIGHUP", None)  # not on Windows
            for sig in (signal.SIGINT, signal.SIGTERM, *([hangup] if hangup else [])):
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def since_best(val_losses: list[float]) -> tuple[float, int]:
    """(the best val loss, how many evaluations came after its first occurrence): what
    TrainConfig.patience counts; (inf, 0) before any evaluation."""
    if not val_losses:
        return math.inf, 0
    best = min(val_losses)
    return best, len(val_losses) - 1 - val_losses.index(best)


def restore(
    ckpt: Path, model: GPT, optimizer: torch.optim.Optimizer, data_gen: torch.Generator,
    model_config: GPTConfig, world: World,
) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
    """Load the run's checkpoint into the model, optimizer and generators: (step, history,
    the checkpoint's meta)."""
    saved = load_attnlab_checkpoint(ckpt)
    if saved.model.config != model_config:
        raise ValueError(
            f"--resume: the checkpoint in {ckpt} has config {saved.model.config}, this run "
            f"asks for {model_config}; resume with the same model flags"
        )
    model.load_state_dict(saved.model.state_dict())
    state = load_train_state(ckpt)
    _check_moments(state, optimizer, ckpt)
    optimizer.load_state_dict(state["optimizer"])
    lay_out_like_params(optimizer)
    ranks = state.get("torch_rng_ranks") or [state["torch_rng"]]
    torch.set_rng_state(ranks[world.rank] if len(ranks) == world.size else state["torch_rng"])
    data_gen.set_state(state["data_rng"])
    return int(state["step"]), list(json.loads(state["history"])), saved.meta


def _check_moments(state: dict[str, Any], optimizer: torch.optim.Optimizer, ckpt: Path) -> None:
    """Refuse a saved AdamW state without moments for every parameter after step 0: loaded,
    it would restart them from zero, and the run would not continue exactly. (SGD without
    momentum keeps none.)"""
    params = sum(len(group["params"]) for group in optimizer.param_groups)
    kept = len(state["optimizer"].get("state", {}))
    if isinstance(optimizer, torch.optim.AdamW) and int(state["step"]) > 0 and kept < params:
        raise ValueError(f"--resume: the optimizer state in {ckpt} holds moments for {kept} "
                         f"of {params} parameters, so the run cannot continue exactly; the "
                         "file is damaged: start over with --overwrite")


def origin_of(meta: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint's meta says of the model a fine-tune started from."""
    return {k: meta[k] for k in ("init_from", "family") if k in meta}


def lay_out_like_params(optimizer: torch.optim.Optimizer) -> None:
    """Give each loaded moment its parameter's memory layout. Fused AdamW walks a parameter
    and its moments as flat memory, so a moment in another layout (row-major, as in train
    states saved before GPT.lay_out_weights) would silently update the wrong elements."""
    for param, state in optimizer.state.items():
        for name, value in state.items():
            if isinstance(value, torch.Tensor) and value.shape == param.shape \
                    and value.stride() != param.stride():
                state[name] = torch.empty_like(param, dtype=value.dtype).copy_(value)


def check_writable(out: Path, model_config: GPTConfig) -> None:
    """Fail before training, not at the first checkpoint: the directory must take files
    and have room for two checkpoints (weights + AdamW moments, the old one kept until the
    new one is complete)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"output directory {out} is not writable ({err.strerror}); choose "
                         "another (--out)") from err
    needed = 2 * 3 * 4 * count_params(model_config)
    free = shutil.disk_usage(out).free
    if free < needed:
        raise ValueError(
            f"{out} has {free / 1e6:.1f} MB free but checkpoints of this model need about "
            f"{needed / 1e6:.1f} MB; free some space or pass --out on another disk"
        )


#: the model's own steps around its blocks, which `compile_blocks(ends=True)` compiles too
ENDS = ("_embed", "_head")


def compile_blocks(model: GPT, ends: bool = False, **options: Any) -> None:
    """Compile each transformer block's forward in place (regional compilation; `options`
    go to torch.compile): the blocks share one compilation, a fraction of the whole model's,
    and the embedding, head and loss around them stay eager, or, with `ends`, are two more
    compiled regions (fewer launches, two more compilations: `benchmarks/gpu_step_probe.py`
    weighs them). `release_blocks` undoes it."""
    for block in model.blocks:
        block.forward = torch.compile(block.forward, **options)
    for name in ENDS if ends else ():
        setattr(model, name, torch.compile(getattr(model, name), **options))


def release_blocks(model: GPT) -> None:
    """The model's own forwards again, after `compile_blocks`."""
    for name in ENDS:
        if name in vars(model):
            delattr(model, name)
    for block in model.blocks:
        if "forward" in vars(block):
            del block.forward
