"""A Llama-3.1-8B-shaped bfloat16 directory (16 GB in 4 shards) loaded straight onto a GPU
(issue 32, item 3): `load_hf(dir, torch.bfloat16, map_location="cuda")` in a fresh process,
its time, its host memory (peak RSS over the process's RSS before the load, against the
largest shard) and its GPU memory.

The weights are random bytes of one 64 MiB block repeated (a load reads every byte the same
whatever they are, and writing 16 GB of fresh random numbers would take minutes), written
before the clock starts; the OS keeps them in its page cache, so the load reads memory,
not disk.

    python -m benchmarks.gpu_load --out FILE [--smoke]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .loading import LLAMA_70B, measure, sparse_hf_dir

LLAMA_8B = {**LLAMA_70B, "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "vocab_size": 128256, "tie_word_embeddings": False}
CHUNK = 64 << 20

LOAD_GPU_RUN = """
import json, time, torch
from attnlab import load_hf
def rss_mb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
torch.zeros(1, device={device!r})  # the CUDA context, before the clock (it is no load)
before = rss_mb()
t0 = time.perf_counter()
model = load_hf({path!r}, torch.bfloat16, map_location={device!r})
torch.cuda.synchronize() if {device!r} != "cpu" else None
seconds = time.perf_counter() - t0
model_mb = sum(p.nbytes for p in model.parameters()) / 2**20
gpu_peak_mb = torch.cuda.max_memory_allocated() / 2**20 if {device!r} != "cpu" else None
result = {{"seconds": seconds, "before_mb": before, "model_mb": model_mb,
          "gpu_peak_mb": gpu_peak_mb, "device": str(next(model.parameters()).device)}}
"""


def write_dir(directory: Path, hf_config: Mapping[str, Any], shards: int) -> int:
    """The model directory, its weights one random 64 MiB block repeated; returns its
    largest shard's bytes."""
    block = torch.randn(CHUNK // 2, generator=torch.Generator().manual_seed(0)).mul_(0.02)
    raw = block.to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
    sparse_hf_dir(directory, hf_config, shards=shards, fill=raw)
    return max(path.stat().st_size for path in directory.glob("*.safetensors"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_load")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="two layers, on any device")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = {**LLAMA_8B, "num_hidden_layers": 2, "vocab_size": 4096} if args.smoke \
        else LLAMA_8B
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        t0 = time.perf_counter()
        largest = write_dir(Path(tmp) / "llama-8b", config, shards=4)
        written = time.perf_counter() - t0
        load = measure(LOAD_GPU_RUN, path=str(Path(tmp) / "llama-8b"), device=device)
    host = load["peak_mb"] - load["before_mb"]
    result = {"suite": "gpu_load", "gpu": torch.cuda.get_device_name() if device == "cuda"
              else None, "smoke": args.smoke, "written_s": round(written, 1),
              "largest_shard_mb": largest / 2**20, **load,
              "host_peak_over_before_mb": host,
              "host_peak_vs_largest_shard": host / (largest / 2**20),
              "gpu_peak_vs_model": None if load["gpu_peak_mb"] is None
              else load["gpu_peak_mb"] / load["model_mb"]}
    print(json.dumps(result, indent=2))
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
