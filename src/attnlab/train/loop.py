"""Training: a loop people can trust, and resume exactly.

`train(model_config, train_config, dataset, out_dir)` runs AdamW (weight decay on matrices
only) or SGD with the schedule of `TrainConfig` (config.py: linear warmup + cosine decay),
gradient clipping and accumulation, bf16 autocast on request, optional torch.compile; it
evaluates on the val split, appends metrics to `out_dir/metrics.jsonl`, checkpoints to
`out_dir/ckpt` (checkpoint.py) and draws `out_dir/loss.png`. Everything random is seeded,
and the checkpoint holds the model, optimizer, step and RNG states, so a resumed run
continues exactly where it stopped. Nothing here is specific to a dataset (data.py) or
prints (cli/train.py shows progress through `callback`). Default recipes per dataset:
recipes.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..checkpoint import Checkpoint, CheckpointWriter, load_attnlab_checkpoint
from ..model.gpt import GPT, GPTConfig, check_token_ids
from ..model.packed import refuse_packed
from ..model.runtime import quiet_compile, warn_if_slow_bf16
from .budget import Budget, parse_duration
from .config import FittedSchedule, TrainConfig, TrainResult, fitted_schedule
from .data import Dataset, bits_per_byte, sequence_length
from .distributed import World, setup, teardown, under_torchrun
from .evaluate import autocast_for, evaluate, fused_attention, to_device
from .graph_step import GraphedStep, check_graph_device, plain_state
from .state import (
    StopFlag,
    check_writable,
    compile_blocks,
    origin_of,
    release_blocks,
    restore,
    since_best,
)

# training steps whose losses wait on a GPU before one read (train_step)
READ_EVERY = 20


def make_optimizer(model: GPT, config: TrainConfig) -> torch.optim.Optimizer:
    if config.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=config.lr)
    # decay matrices (embeddings, projections); not biases or gains (a per-head QK-norm's too)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if p.dim() >= 2 and not n.endswith("_norm.weight")]
    no_decay = [p for n, p in named if p.dim() < 2 or n.endswith("_norm.weight")]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # fused: one kernel per step for all parameters, on CPU too
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, config.beta2), fused=True)


def read_interval(device: torch.device, config: TrainConfig) -> int:
    """Training steps between two reads of their losses: 1 on a CPU, where a read costs
    nothing, and under a time budget, which times every step; READ_EVERY elsewhere."""
    return 1 if device.type == "cpu" or config.time_budget else READ_EVERY


def train(
    model_config: GPTConfig,
    config: TrainConfig,
    dataset: Dataset,
    out_dir: str | Path,
    *,
    resume: bool = False,
    callback: Callable[[dict[str, Any]], None] | None = None,
    init: Checkpoint | None = None,
) -> TrainResult:
    """Train a GPT on `dataset`; checkpoints in out_dir/ckpt, metrics in out_dir/metrics.jsonl.

    callback gets every metrics row ({"step", "loss", "lr", "tokens_per_s", ...} and eval rows
    with "val_loss"), and {"step", "signal": "SIGINT" (or SIGTERM, SIGHUP)} at once when a
    stop is asked for. Ctrl-C (SIGINT, SIGTERM, SIGHUP) saves a checkpoint and returns with
    `interrupted=True`. init (fine-tuning): a checkpoint whose weights the run starts from,
    e.g. `load_checkpoint("smollm")`; its model's config must compute what `model_config`
    does (dropout and router_aux_loss_coef may differ), and the run's checkpoints keep its
    path and Hugging Face family. Under torchrun every process calls this; they share the
    work (distributed.py) and only rank 0 writes files and calls callback.
    """
    if model_config.vocab_size < dataset.tokenizer.vocab_size:
        raise ValueError(
            f"model vocab_size={model_config.vocab_size} < tokenizer's "
            f"{dataset.tokenizer.vocab_size}; leave --vocab_size unset to take the tokenizer's"
        )
    refuse_packed(init.model if init else None, "init (fine-tuning)")
    if init is not None and init.model.config.computed() != model_config.computed():
        raise ValueError(f"init: the checkpoint in {init.path} has config "
                         f"{init.model.config}, this run asks for {model_config}; fine-tune "
                         "with the checkpoint's own config (dropout and "
                         "router_aux_loss_coef may differ)")
    if config.cuda_graph and model_config.n_experts is not None:
        raise ValueError("cuda_graph records one fixed training step, and a mixture of experts "
                         "runs each expert on the rows its router picks, a shape each step: "
                         "pass --cuda_graph false")
    seq_len = sequence_length(model_config, dataset, config.seq_len)
    config = dataclasses.replace(config)  # a time budget fits max_iters: not the caller's
    world, started = setup(config.device)
    try:
        world.rows(config.batch_size)  # checks the batch splits over the processes
        check_graph_device(config.cuda_graph, world.device, world.size)
        if world.main:
            check_writable(Path(out_dir), model_config)
            warn_if_slow_bf16(config.dtype, world.device)
        run = _Run(model_config, config, dataset, Path(out_dir), world, seq_len, resume,
                   callback, init)
        try:
            return run.fit()
        finally:
            run.writer.wait()  # the last checkpoint complete, whatever ended the run
            release_blocks(run.model)  # the model returned is the plain one
            if run.graph_step is not None:
                run.graph_step.release()
    finally:
        teardown(started)


class _Run:
    """One call of `train`: the model, optimizer, data stream and log of a run, set up fresh
    or from its checkpoint (`__init__`), and the pieces its loop (`fit`) is made of:
    `train_step`, `evaluate_and_save`, `save`, `log` and `finish`."""

    def __init__(
        self, model_config: GPTConfig, config: TrainConfig, dataset: Dataset, out: Path,
        world: World, seq_len: int, resume: bool,
        callback: Callable[[dict[str, Any]], None] | None, init: Checkpoint | None,
    ) -> None:
        self.config, self.dataset, self.world, self.seq_len = config, dataset, world, seq_len
        self.out, self.ckpt, self.metrics_file = out, out / "ckpt", out / "metrics.jsonl"
        self.callback = callback
        self.writer = CheckpointWriter()  # training goes on while a checkpoint is written
        torch.manual_seed(config.seed)
        self.model = GPT(model_config).to(world.device)
        if init is not None and not resume:  # a resume reads its own weights below
            self.model.load_state_dict(init.model.state_dict())
        self.optimizer = make_optimizer(self.model, config)
        self.data_gen = torch.Generator().manual_seed(config.seed)
        self.start = 0
        self.history: list[dict[str, Any]] = []
        # a fine-tune's source, kept in every checkpoint (export keeps the family: a Mistral
        # stays a Mistral): from `init`, or from the checkpoint a resume continues
        self.origin = {} if init is None else {**origin_of(init.meta), "init_from": str(init.path)}
        saved_meta: dict[str, Any] = {}
        if resume:
            self.start, self.history, saved_meta = restore(
                self.ckpt, self.model, self.optimizer, self.data_gen, model_config, world)
            self.origin = origin_of(saved_meta)
        elif world.size > 1:
            torch.manual_seed(config.seed + world.rank)  # its own dropout noise on every rank
        # one process compiles its blocks (compile_blocks), on a GPU as CUDA graphs unless
        # the whole step is one (cuda_graph)
        self.graphed = (config.compile and world.device.type == "cuda" and world.size == 1
                        and not config.cuda_graph and model_config.n_experts is None)
        self.ddp, self.step_fn = self._wrap()
        # fused AdamW skips its update on the device when this is 1 (train_step); other
        # optimizers are checked on the host before they update
        self.guard: torch.Tensor | None = None
        if isinstance(self.optimizer, torch.optim.AdamW):
            self.guard = torch.zeros((), device=world.device)
            self.optimizer.found_inf = self.guard  # type: ignore[attr-defined]
        self.graph_step = GraphedStep(self.optimizer, self._graph_body, world.device) if (
            config.cuda_graph) else None
        # steps whose losses wait on the device: (step, loss (), lr); read every read_every
        # steps, since a read waits for the device to finish (free on a CPU). A time
        # budget times every step.
        self.pending: list[tuple[int, torch.Tensor, float]] = []
        self.read_every = read_interval(world.device, config)
        self.window_start = 0.0
        self.model.train()
        self.rows = world.rows(config.batch_size)
        self.fused = fused_attention(config, world.device)
        self.tokens_per_step = config.batch_size * config.grad_accum * seq_len
        self.t_start = time.perf_counter()
        # tokens and seconds of this call's first step, and of the steps after it
        self.first: tuple[int, float] = (0, 0.0)
        self.timed: tuple[int, float] = (0, 0.0)
        self.budget = self._budget(resume)
        # the schedule as the budget's last fit left it (a resume's, from its history)
        self.schedule = fitted_schedule(self.history)
        self.result = TrainResult(self.model, dataset.tokenizer, self.history,
                                  self.ckpt if resume else None)
        # the checkpoint's evaluation, until this call evaluates (what --patience keeps)
        self.result.val_loss = saved_meta.get("val_loss")
        self.result.val_step = saved_meta.get("val_step")
        self.result.val_bpb = saved_meta.get("val_bpb")
        # the best val loss so far and the evaluations since it (TrainConfig.patience)
        self.best, self.stale = since_best([r["val_loss"] for r in self.history
                                            if "val_loss" in r])
        if world.main:  # a fresh run starts a fresh log; a resume drops rows after its checkpoint
            self.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in self.history))

    def _wrap(self) -> tuple[Any, Any]:
        """(DistributedDataParallel around the model when there are several processes, else
        None; what a step calls: that or the model, compiled when asked)."""
        ddp = None
        if self.world.size > 1:
            from torch.nn.parallel import DistributedDataParallel

            device = self.world.device
            ids = [device.index] if device.type == "cuda" else None
            # a mixture's experts a rank's rows never chose have no gradient there: DDP then
            # looks for them each step rather than wait for them
            ddp = DistributedDataParallel(self.model, device_ids=ids, find_unused_parameters=(
                self.model.config.n_experts is not None))
        step_fn: Any = ddp or self.model
        if self.config.compile and ddp is None:
            # each block compiled once for all (half the whole model's compile time on a CPU,
            # a sixth on a GPU), on a GPU replayed as CUDA graphs: one launch per graph, not
            # per kernel (docs/gpu.md#the-gpu-recipe, docs/performance.md#compiled-training)
            compile_blocks(self.model, mode="reduce-overhead" if self.graphed else None)
        elif self.config.compile:
            step_fn = torch.compile(step_fn)
        return ddp, step_fn

    def _budget(self, resume: bool) -> Budget | None:
        """The time budget that fits max_iters (budget.py), if the run has one to fit. A resume
        keeps the max_iters its budget fitted; one stopped before the fit (in its first steps)
        fits now, to the whole budget, not to the recipe's max_iters it saved."""
        config = self.config
        fit_saved = any("max_iters" in row for row in self.history)
        if config.time_budget is None or (resume and fit_saved):
            return None
        # an evaluation: eval_iters optimizer batches of each split, forward only (a third
        # of a step's work each)
        return Budget(parse_duration(config.time_budget), step=self.start, now=self.t_start,
                      eval_interval=config.eval_interval, reduce=self.world.mean,
                      eval_share=2 * config.eval_iters / 3)

    def fit(self) -> TrainResult:
        """Train to max_iters, evaluating and saving every eval_interval steps and at the end;
        a stop request (Ctrl-C) saves and returns between two optimizer steps."""
        config, budget = self.config, self.budget
        stop = StopFlag(on_stop=self.said_stop, torchrun=under_torchrun())
        with stop:
            step = self.start
            # a time budget sets max_iters after its calibration steps; until then it runs on
            while step < config.max_iters or (budget is not None and not budget.fitted):
                evaluated = step % config.eval_interval == 0 and step > self.start
                if evaluated:  # before the stop check: a resume from here does not redo it
                    self.read_losses()
                    t0 = time.perf_counter()
                    self.evaluate_and_save(step)
                    if budget is not None:
                        budget.evaluated(time.perf_counter() - t0)
                    if config.patience is not None and self.stale >= config.patience:
                        self.result.stopped_early = True
                        return self.finish()
                if self.world.any(stop.requested):
                    self.read_losses()
                    # between optimizer steps the state is consistent; with patience the
                    # checkpoint stays the best evaluation's, which a resume continues
                    if not evaluated and (config.patience is None or self.result.checkpoint
                                          is None):
                        self.save(step)
                    self.result.interrupted = True
                    return self.finish()
                step = self.train_step(step)
            # still under the flag: a stop asked for now lets this last save finish
            self.read_losses()
            self.evaluate_and_save(config.max_iters)
        return self.finish()

    def train_step(self, step: int) -> int:
        """One optimizer step from `step` (grad_accum micro-batches); returns step + 1. Its
        loss stays on the device until `read_losses` (every `read_every` steps)."""
        config = self.config
        lr = config.lr_at(step, self.schedule)
        if not self.pending:
            self.window_start = time.perf_counter()
        if self.graph_step is not None:  # the whole step, one replay (graph_step.py)
            batches = [self._batch() for _ in range(config.grad_accum)]
            loss = self.graph_step.step(torch.stack([x for x, _ in batches]),
                                        torch.stack([y for _, y in batches]), lr)
        else:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            loss = self._accumulate_grads()  # () on the device
            if self.guard is None:  # an unguarded optimizer: look before it updates
                _check_finite(self.world.mean(float(loss)), step + 1, self.result.checkpoint)
            self._update()
            self.optimizer.zero_grad(set_to_none=True)
        step += 1
        self.pending.append((step, loss, lr))
        if step == self.start + 1 or len(self.pending) >= self.read_every:
            self.read_losses()
        budget = self.budget
        if budget is not None and (fitted := budget.after_step(step, time.perf_counter())):
            self.schedule = _fit(config, self.schedule, fitted, step, 1 / budget.step_s,
                                 self.log)
        return step

    def _update(self) -> None:
        """Clip the gradients and step the optimizer, reading nothing back from the device."""
        # the norm before clipping (max_norm inf: measured, nothing clipped)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                              self.config.grad_clip or math.inf)
        if self.guard is not None:
            # skips the update on the device when the gradients are not finite, with no wait
            # for the device (GradScaler's protocol: torch.optim reads optimizer.found_inf)
            self.guard.copy_(~torch.isfinite(norm))
        self.optimizer.step()

    def read_losses(self) -> None:
        """Read the pending steps' losses (one wait for the device), log them with the
        window's tokens/s, and stop on a non-finite one."""
        if not self.pending:
            return
        steps, losses, lrs = zip(*self.pending, strict=True)
        values = self.world.mean_all(torch.stack(losses)).tolist()
        dt = (time.perf_counter() - self.window_start) / len(steps)
        if steps[0] == self.start + 1:
            self.first = (self.tokens_per_step, dt)
        else:
            self.timed = (self.timed[0] + self.tokens_per_step * len(steps),
                          self.timed[1] + dt * len(steps))
        self.pending.clear()
        for step, loss, lr in zip(steps, values, lrs, strict=True):
            _check_finite(loss, step, self.result.checkpoint, skipped=self.guard is not None)
            self.log({"step": step, "loss": loss, "lr": lr,
                      "tokens_per_s": self.tokens_per_step / max(dt, 1e-9)})

    def _accumulate_grads(self) -> torch.Tensor:
        """Forward and backward over grad_accum micro-batches, their gradients summed into
        .grad; returns their mean loss, () on the device."""
        config, world, ddp = self.config, self.world, self.ddp
        loss_sum = torch.zeros((), device=world.device)
        for micro in range(config.grad_accum):
            x, y = self._batch()
            x, y = to_device(x, world.device), to_device(y, world.device)  # (B / world, T)
            # DDP averages gradients over ranks on the last micro-batch only
            sync = ddp is None or micro == config.grad_accum - 1
            with contextlib.nullcontext() if sync else ddp.no_sync():
                loss_sum += self._forward_backward(x, y)
        return loss_sum / config.grad_accum

    def _graph_body(self, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """The step graph_step.GraphedStep records: micro-batches xs, ys (accum, B, T) on the
        device, forward, backward and update; their mean loss."""
        loss_sum = torch.zeros((), device=self.world.device)
        for x, y in zip(xs, ys, strict=True):
            loss_sum += self._forward_backward(x, y)
        self._update()
        return loss_sum / self.config.grad_accum

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A training micro-batch (B / world, T) on the host, its ids checked there, where
        that costs no wait for the device (GPT.forward's check would)."""
        x, y = self.dataset.batch("train", self.config.batch_size, self.seq_len, self.data_gen,
                                  self.rows)
        check_token_ids(x, y, self.model.config.vocab_size)
        return x, y

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward and backward of micro-batch x, y on the device (its gradients added to
        .grad); its loss, a () copy (a CUDA graph's next replay overwrites the loss)."""
        if self.graphed:  # the last step's graph outputs (its loss) are read already
            torch.compiler.cudagraph_mark_step_begin()
        first = self.config.compile and not self.pending and not self.timed[1]  # compiling
        with quiet_compile() if first else contextlib.nullcontext():
            with autocast_for(self.config, self.world.device):
                loss = self.step_fn(x, y, fused=self.fused, check_ids=False).loss
            assert loss is not None
            (loss / self.config.grad_accum).backward()
        return loss.detach()

    def evaluate_and_save(self, step: int) -> None:
        """Evaluate both splits, log the losses (and bits per byte) and save a checkpoint (with
        TrainConfig.patience: only a better val loss than the best so far); refuses to save
        weights whose losses are not finite."""
        result, dataset = self.result, self.dataset
        losses = evaluate(self.model, dataset, self.config, self.seq_len, self.world)
        if not all(math.isfinite(v) for v in losses.values()):
            raise FloatingPointError(
                f"evaluation at step {step} gave {losses}; not saving these weights. The last "
                f"good checkpoint is kept"
                f"{f' in {result.checkpoint}' if result.checkpoint else ''}. "
                "Lower --lr or keep --grad_clip on"
            )
        for split in ("train", "val"):  # bits per byte: comparable across tokenizers
            bits = bits_per_byte(losses[f"{split}_loss"], dataset.bytes_per_token(split))
            if bits is not None:
                losses[f"{split}_bpb"] = bits
        self.log({"step": step, **losses})
        better = losses["val_loss"] < self.best
        self.best, self.stale = (losses["val_loss"], 0) if better else (self.best, self.stale + 1)
        if self.config.patience is not None and not better:
            return  # the checkpoint keeps the best evaluation's weights
        result.val_loss, result.val_step = losses["val_loss"], step
        result.val_bpb = losses.get("val_bpb")
        self.save(step)

    def save(self, step: int) -> None:
        """Checkpoint the model, optimizer, RNG states and history at `step` (rank 0 writes, on
        `writer`'s thread once the state is copied; every rank waits for the copy)."""
        world, result, dataset = self.world, self.result, self.dataset
        rng = torch.get_rng_state()
        rng_ranks = [rng]
        if world.size > 1:  # every rank's dropout stream, so a resume continues each one
            rng_ranks = [torch.empty(0)] * world.size
            torch.distributed.all_gather_object(rng_ranks, rng)
        if world.main:
            state = {
                "step": step,
                "optimizer": plain_state(self.optimizer.state_dict()),
                "torch_rng": rng,
                "torch_rng_ranks": rng_ranks,
                "data_rng": self.data_gen.get_state(),
                "history": json.dumps(self.history),
            }
            meta = {"step": step, "train_config": dataclasses.asdict(self.config),
                    "dataset": dataset.name, "val_loss": result.val_loss,
                    "val_bpb": result.val_bpb, "val_step": result.val_step,
                    "world_size": world.size}
            meta.update(self.origin)
            for key in ("source", "fingerprint"):  # a text file's: see TextDataset
                if getattr(dataset, key, None) is not None:
                    meta[f"data_{key}"] = getattr(dataset, key)
            self.writer.save(self.ckpt, self.model, dataset.tokenizer, train_state=state,
                             meta=meta)
        result.checkpoint = self.ckpt
        world.barrier()  # no rank runs ahead of a checkpoint it may have to resume from

    def said_stop(self, signal_name: str) -> None:
        """Tell the callback at once that a stop was asked for, with the last step logged
        (the rows a callback reads all have a step)."""
        step = self.history[-1].get("step", self.start) if self.history else self.start
        if self.world.main and self.callback is not None:  # no metric: not in the history
            self.callback({"step": step, "signal": signal_name})

    def log(self, row: dict[str, Any]) -> None:
        """Append a metrics row to the history, metrics.jsonl and the callback (rank 0)."""
        self.history.append(row)
        if not self.world.main:
            return
        with open(self.metrics_file, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.callback is not None:
            self.callback(row)

    def finish(self) -> TrainResult:
        """The result, with its wall clock and throughput, and the loss curve drawn."""
        result = self.result
        self.writer.wait()
        result.seconds = time.perf_counter() - self.t_start
        tokens, seconds = self.timed if self.timed[1] else self.first
        result.tokens_per_second = tokens / max(seconds, 1e-9)
        if self.config.patience is not None and self.stale and result.checkpoint is not None:
            # the weights since the best evaluation are worse: return the checkpoint's
            best = load_attnlab_checkpoint(result.checkpoint)  # copied onto the model's device
            self.model.load_state_dict(best.model.state_dict())
        result.model.eval()
        if self.world.main:
            with contextlib.suppress(ImportError):  # matplotlib is an extra; metrics.jsonl has all
                save_loss_curve(result.history, self.out / "loss.png")
        return result


def _fit(config: TrainConfig, schedule: FittedSchedule | None, max_iters: int, step: int,
         steps_per_s: float, log: Callable[[dict[str, Any]], None]) -> FittedSchedule | None:
    """Apply a time budget's step count (budget.py) from `step` on: the schedule goes on from
    the lr it has there and ends at max_iters (TrainConfig.refit); the fit's row keeps it
    for a resume. config.warmup_iters stays the recipe's, which every fit starts from."""
    if config.max_iters == max_iters:
        return schedule
    schedule = config.refit(step, max_iters, schedule)  # from the schedule until now
    config.max_iters = max_iters
    log({"step": step, "time_budget": config.time_budget, "max_iters": max_iters,
         **dataclasses.asdict(schedule), "steps_per_s": steps_per_s})
    return schedule


def _check_finite(loss: float, step: int, checkpoint: Path | None,
                  skipped: bool = False) -> None:
    """Raise FloatingPointError if a step's loss is not finite."""
    if math.isfinite(loss):
        return
    done = ("no update with non-finite gradients was applied" if skipped else
            "stopped before updating")
    raise FloatingPointError(
        f"loss became {loss} at step {step}; {done}. Last good checkpoint: "
        f"{checkpoint or 'none written by this run'}. Lower --lr or keep --grad_clip on")


def save_loss_curve(history: list[dict[str, Any]], path: str | Path) -> Path:
    """Draw train loss per step and val loss per evaluation to a PNG (needs matplotlib)."""
    from ..viz import plot_loss, save_figure

    return save_figure(plot_loss(history), Path(path).with_suffix(".png"))[0]
