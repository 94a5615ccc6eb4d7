"""Many processes with PyTorch's own engine: torchrun + DistributedDataParallel.

`attnlab train` under `torchrun --nproc_per_node N` runs DDP with no code change: torchrun
sets RANK / WORLD_SIZE / LOCAL_RANK, `setup` joins the process group (gloo on CPU, NCCL on
CUDA). The global batch stays what TrainConfig.batch_size says; each rank draws the same
batch indices and reads only its own rows of them, so N processes give the loss curve of
one. Only rank 0 writes. One process (no torchrun) is the world of one: every method here
is then free. How a stop reaches the processes under torchrun, and what torchrun prints then:
docs/train.md#stopping-a-torchrun-run.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from ..model.runtime import resolve_device

_CPU = torch.device("cpu")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    device: torch.device = _CPU

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes checkpoints, logs and prints."""
        return self.rank == 0

    def rows(self, batch_size: int) -> slice:
        """This rank's rows of a global batch of batch_size sequences."""
        if batch_size % self.size:
            raise ValueError(
                f"batch_size={batch_size} does not split over {self.size} processes; use a "
                f"multiple of {self.size} (it is the global batch)"
            )
        n = batch_size // self.size
        return slice(self.rank * n, (self.rank + 1) * n)

    def mean(self, value: float) -> float:
        """The mean of a number over all ranks (every rank gets it)."""
        if self.size == 1:
            return value
        return float(self.mean_all(torch.tensor([value], dtype=torch.float64))[0])

    def mean_all(self, values: Tensor) -> Tensor:
        """The mean of each of `values` over all ranks, float64 on the host."""
        values = values.detach().to(torch.float64)
        if self.size > 1:
            values = values.to(self._comm_device)
            dist.all_reduce(values)
            values = values / self.size
        return values.cpu()

    def any(self, flag: bool) -> bool:
        """True on every rank if it is True on one (a Ctrl-C seen by one rank stops all)."""
        if self.size == 1:
            return flag
        t = torch.tensor([int(flag)], device=self._comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t)

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    @property
    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")


def processes() -> int:
    """How many processes train together: torchrun's WORLD_SIZE, 1 without torchrun."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def under_torchrun() -> bool:
    """Whether torchrun's agent started this process (it sets TORCHELASTIC_RUN_ID): then the
    terminal's Ctrl-C reaches the agent, not this process, which runs in a session of its own;
    the agent passes the first on as SIGINT and answers a second with SIGTERM."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def tell_torchrun(message: str) -> None:
    """Make `message` what torchrun's report of this failed process says (its "traceback"
    field), written to the error file torchrun reads (TORCHELASTIC_ERROR_FILE), in the layout
    torch's own `ErrorHandler.record_exception` writes; nothing without torchrun."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    blob = {"message": {"message": message, "extraInfo": {"timestamp": str(int(time.time()))}}}
    with open(path, "w") as f:
        json.dump(blob, f)


def setup(device: str = "auto") -> tuple[World, bool]:
    """The world this process is in, and whether this call started its process group."""
    size = processes()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if size == 1:
        return World(device=dev), False
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return World(dist.get_rank(), dist.get_world_size(), dev), started


def teardown(started: bool) -> None:
    if started and dist.is_initialized():
        dist.destroy_process_group()
