"""Evaluation: the mean loss of each split on fixed batches (`evaluate`), and what training and
evaluation share to meet their device: batches onto it (`to_device`), which attention runs
(`fused_attention`) and bfloat16 autocast (`autocast_for`)."""

from __future__ import annotations

import contextlib

import torch

from ..model.gpt import GPT, check_token_ids
from .config import TrainConfig
from .data import Dataset
from .distributed import World


@torch.no_grad()
def evaluate(
    model: GPT, dataset: Dataset, config: TrainConfig, seq_len: int, world: World | None = None
) -> dict[str, float]:
    """Mean loss on fixed batches of each split (the same batches at every evaluation)."""
    world = world or World(device=model.wte.weight.device)
    was_training = model.training
    model.eval()
    out = {}
    # eager even where training compiled the blocks (compile_blocks): no second compilation
    # and graph for these few batches
    stance = getattr(torch.compiler, "set_stance", None)  # torch >= 2.6
    try:
        with stance("force_eager") if stance is not None else contextlib.nullcontext():
            for split in ("train", "val"):
                out[f"{split}_loss"] = _split_loss(model, dataset, config, seq_len, world, split)
    finally:  # an interrupted evaluation (Ctrl-C, out of memory) leaves training mode as it was
        model.train(was_training)
    return out


def _split_loss(model: GPT, dataset: Dataset, config: TrainConfig, seq_len: int,
                world: World, split: str) -> float:
    """The mean loss of `split` on its fixed evaluation batches (all processes' mean): eval_iters
    batches of the optimizer's batch_size x grad_accum sequences, each drawn whole, so two runs
    that split the same batch into other micro-batches evaluate on the same sequences; run
    as micro-batches of batch_size (the memory a training step takes)."""
    batch_size = config.batch_size * config.grad_accum  # the optimizer's batch
    rows = world.rows(batch_size)
    micro = config.batch_size // world.size  # rows of a micro-batch on this process
    fused = fused_attention(config, world.device)
    gen = torch.Generator().manual_seed(config.seed + (1 if split == "train" else 2))
    total = torch.zeros((), dtype=torch.float64, device=world.device)
    count = 0
    for _ in range(config.eval_iters):
        # (B * accum / world, T): this process's rows of the whole batch
        batch_x, batch_y = dataset.batch(split, batch_size, seq_len, gen, rows)
        check_token_ids(batch_x, batch_y, model.config.vocab_size)  # on the host: no wait
        # (B / world, T) each
        for x, y in zip(batch_x.split(micro), batch_y.split(micro), strict=True):
            with autocast_for(config, world.device):
                loss = model(to_device(x, world.device), to_device(y, world.device),
                             fused=fused, check_ids=False).loss
            assert loss is not None
            # weighted by its rows: the mean over every sequence, whatever the split (a
            # sentence dataset's batch is all its sentences, whatever batch_size asks)
            total += loss.detach().double() * len(x)  # on the device: one read per split
            count += len(x)
    return world.mean(float(total) / count)


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host batch on `device`; to a GPU from pinned memory without waiting, so the host
    samples the next batch while the copy runs."""
    if device.type != "cuda":
        return batch.to(device)
    return batch.pin_memory().to(device, non_blocking=True)


def fused_attention(config: TrainConfig, device: torch.device) -> bool:
    """Whether training runs SDPA (True) or attend's explicit path (False)."""
    if config.attention != "auto":
        return config.attention == "fused"
    return not (config.dtype == "bfloat16" and device.type == "cpu")


def autocast_for(config: TrainConfig, device: torch.device) -> torch.autocast:
    """bfloat16 autocast where the config asks for it. Without autocast's cache of cast
    weights: a forward casts each weight once anyway, and inside a CUDA graph's recording
    (graph_step.py) the cached casts would be the recording's memory, which PyTorch's CUDA
    graph notes rule out."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.dtype == "bfloat16",
                          cache_enabled=False)
