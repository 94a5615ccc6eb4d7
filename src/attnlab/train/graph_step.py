"""The whole training step as one CUDA graph (`TrainConfig.cuda_graph`): forward, backward,
gradient clipping and fused AdamW recorded once, then replayed at every step, one launch where
the eager step makes hundreds (docs/gpu.md#the-gpu-recipe).

At the GPU recipe's size a step is mostly launch overhead: its kernels are short and each is one
Python call. `torch.compile(mode="reduce-overhead")` removes the overhead too, with fused
kernels, but its first step compiles for seconds, and it records the forward and backward only.
This records the eager step as it is, with no compilation (or, with `--compile`, the compiled
blocks' kernels inside it), optimizer included.

PyTorch's whole-network capture recipe (the CUDA graphs notes of its documentation):
- the first `WARMUP` steps run eagerly on a side stream, so that what is set up lazily (AdamW's
  moments, cuBLAS workspaces, a compilation) is set up before the recording;
- the gradients are set to None before the recording, so the recorded backward writes them
  into the graph's own memory, the same tensors at every replay, which overwrites them: they
  are never zeroed again;
- each batch is copied into the same input tensors, and the learning rate into a device scalar
  that fused AdamW reads (`capturable` from the recording on): a Python number would be
  recorded as a constant;
- dropout draws stay fresh: a replay advances the CUDA generator's offset (graph-safe RNG).

On a CPU there is no graph: the same step runs eagerly (`DEVICES` lets the tests rehearse it).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor

#: eager steps before the recording (the documentation's example warms up for three)
WARMUP = 3
#: where `TrainConfig.cuda_graph` may be asked for; tests add "cpu" to rehearse the step there
DEVICES = ("cuda",)


class GraphedStep:
    """`step(xs, ys, lr) -> loss`: one optimizer step on micro-batches xs, ys (accum, B, T),
    host or device, at learning rate lr; the loss, () on the device, a copy the next step
    does not overwrite.

    body(xs, ys) -> loss makes the step on device tensors: forward and backward of each
    micro-batch, clipping and `optimizer.step()`, without reading anything back to the host (a
    read would wait in the middle of a recording) and without zeroing the gradients (done here
    before the eager steps and the recording)."""

    def __init__(self, optimizer: torch.optim.Optimizer, body: Callable[[Tensor, Tensor], Tensor],
                 device: torch.device) -> None:
        if not isinstance(optimizer, torch.optim.AdamW) or not optimizer.defaults.get("fused"):
            raise ValueError("a CUDA graph of the training step needs fused AdamW "
                             "(--optimizer adamw); pass --cuda_graph false")
        self.optimizer, self.body, self.device = optimizer, body, device
        self.lr = torch.zeros((), device=device)  # () float32: what fused AdamW reads
        for group in optimizer.param_groups:
            group["lr"] = self.lr
        self.xs: Tensor | None = None  # (accum, B, T) inputs and targets, filled at each step
        self.ys: Tensor | None = None
        self.graph: Any = None  # torch.cuda.CUDAGraph once recorded
        self.loss: Tensor | None = None  # () the recorded step's loss, overwritten per replay
        self.steps = 0

    def step(self, xs: Tensor, ys: Tensor, lr: float) -> Tensor:
        if self.xs is None or self.ys is None:
            self.xs = torch.empty(xs.shape, dtype=xs.dtype, device=self.device)  # (accum, B, T)
            self.ys = torch.empty(ys.shape, dtype=ys.dtype, device=self.device)  # (accum, B, T)
        _copy_in(self.xs, xs)
        _copy_in(self.ys, ys)
        self.lr.fill_(lr)
        # a recording and a replay run on the current device's streams: make it the model's
        # (`--device cuda:1` with cuda:0 current, say)
        with torch.cuda.device(self.device) if self.device.type == "cuda" else nullcontext():
            if self.graph is None and self.steps < WARMUP:
                loss = self._eager()
            else:
                if self.graph is None:
                    self._record()
                loss = self._replay()
        self.steps += 1
        return loss

    def _eager(self) -> Tensor:
        """One eager step, on a side stream on a GPU (the recipe's warm-up)."""
        assert self.xs is not None and self.ys is not None
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type != "cuda":
            return self.body(self.xs, self.ys)
        side, main = torch.cuda.Stream(self.device), torch.cuda.current_stream(self.device)
        side.wait_stream(main)  # the batch's copies first
        with torch.cuda.stream(side):
            loss = self.body(self.xs, self.ys)
        main.wait_stream(side)
        return loss

    def _record(self) -> None:
        assert self.xs is not None and self.ys is not None
        # fresh gradients, allocated inside the recording: every replay writes the same ones
        self.optimizer.zero_grad(set_to_none=True)
        # only now: an eager step of a capturable optimizer warns that it is not recorded
        for group in self.optimizer.param_groups:
            group["capturable"] = True
        if self.device.type != "cuda":
            self.graph = "rehearsal"  # nothing recorded: _replay runs the body
            return
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.loss = self.body(self.xs, self.ys)
        except RuntimeError as err:
            raise RuntimeError(f"recording the training step as a CUDA graph failed ({err}); "
                               "train without it: --cuda_graph false") from err
        self.graph = graph

    def _replay(self) -> Tensor:
        if self.device.type != "cuda":  # the rehearsal: what a replay computes, eagerly
            self.optimizer.zero_grad(set_to_none=True)
            return self.body(self.xs, self.ys)  # type: ignore[arg-type]
        self.graph.replay()
        assert self.loss is not None
        return self.loss.clone()

    def release(self) -> None:
        """Drop the graph and the gradients in its memory (the run is over)."""
        self.graph = self.loss = self.xs = self.ys = None
        self.optimizer.zero_grad(set_to_none=True)


def _copy_in(static: Tensor, batch: Tensor) -> None:
    """Copy a batch into a graph's input; from the host through pinned memory, without waiting."""
    if batch.device.type == "cpu" and static.device.type == "cuda":
        batch = batch.pin_memory()
    static.copy_(batch, non_blocking=True)


def plain_state(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer's state_dict as a step without a graph saves it: each group's learning rate
    a number, not the graph's device scalar, and `capturable` off, so that any run (on a CPU,
    without a graph) resumes from it."""
    groups = [{**group, "lr": float(group["lr"]), "capturable": False}
              for group in state["param_groups"]]
    return {**state, "param_groups": groups}


def check_graph_device(cuda_graph: bool, device: torch.device, processes: int) -> None:
    """Refuse `cuda_graph` where it cannot record: off CUDA, or with several processes."""
    if cuda_graph and (device.type not in DEVICES or processes > 1):
        raise ValueError(f"--cuda_graph records the training step on one CUDA GPU; this run "
                         f"has {processes} process(es) on {device}: pass --cuda_graph false")
