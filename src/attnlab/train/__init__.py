"""Training: `train(model_config, train_config, dataset, out_dir)` and what it needs.

`config.py` holds `TrainConfig` (how to train, the learning-rate schedule) and
`TrainResult`, `loop.py` runs the loop, `state.py` holds what it keeps beside it (the stop
flag, the checks before a run writes, the exact resume), `evaluate.py` measures the loss on
held-out batches, `graph_step.py` records a step as a CUDA graph, `data.py` turns text or a
built-in task into batches, `recipes.py` picks what `attnlab train` trains when no flag says
otherwise and scores a task run, `budget.py` trains for a time budget, `distributed.py` runs
under torchrun with DistributedDataParallel.
"""

from .config import TrainConfig, TrainResult
from .data import load_dataset
from .loop import train

__all__ = ["TrainConfig", "TrainResult", "load_dataset", "train"]
