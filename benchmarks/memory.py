"""Memory: peak RSS of training and of generation, and KV cache bytes against the formula.

Each peak is measured in a fresh subprocess (VmHWM in /proc/self/status: its own high-water
mark), so one workload's allocations never count towards another's; a subprocess that only
imports torch and attnlab gives the floor every workload starts from. The KV cache check is
exact: `KVCache.nbytes()` must equal 2 * n_layer * B * nkv * T_max * hs * bytes per element.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import torch

from attnlab.model.gpt import GPT, GPTConfig

from .common import machine, table

# Each snippet ends by printing one JSON line; {shape} is a GPTConfig keyword dict.
_PRELUDE = """
import json, resource, sys, tempfile
import numpy as np, torch
torch.set_num_threads(1)
from attnlab.model.gpt import GPT, GPTConfig
config = GPTConfig(**{shape})
"""
_IMPORT_ONLY = ""
_TRAIN = """
from attnlab.train.data import TextDataset
from attnlab.tokenizers import get_tokenizer
from attnlab.train.loop import TrainConfig, train
ids = np.random.default_rng(0).integers(0, config.vocab_size, 200_000, dtype=np.uint16)
tok = get_tokenizer("char", "".join(chr(32 + i) for i in range(config.vocab_size)))
data = TextDataset("random", tok, ids[:180_000], ids[180_000:])
tc = TrainConfig(max_iters={iters}, batch_size={batch}, eval_interval={iters}, eval_iters=2,
                 warmup_iters=0, dtype="{dtype}", device="cpu")
with tempfile.TemporaryDirectory() as out:
    train(config, tc, data, out)
"""
_GENERATE = """
from attnlab.generate import generate
torch.manual_seed(0)
model = GPT(config).eval()
prompt = torch.randint(0, config.vocab_size, ({batch}, 8))
with torch.no_grad():
    generate(model, prompt, max_new_tokens=config.block_size - 8, temperature=1.0, seed=0)
"""
# VmHWM is this process's own peak. ru_maxrss is not: Linux carries the peak RSS of the
# process image that exec replaced into it, so a workload spawned by a parent that once held
# 760 MB reported 760 MB whatever it did itself.
_REPORT = """
try:
    with open("/proc/self/status") as status:
        peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
except OSError:
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"max_rss_kb": peak_kb}}))
"""


def peak_rss_mb(body: str, shape: dict[str, Any], **fields: Any) -> float:
    """Peak resident set size (MB) of a fresh Python running `body` after the prelude."""
    code = (_PRELUDE + body + _REPORT).format(shape=repr(shape), **fields)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"memory workload failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return int(json.loads(proc.stdout.strip().splitlines()[-1])["max_rss_kb"]) / 1024


def kv_cache_rows(shape: dict[str, Any], batch: int) -> list[dict[str, Any]]:
    config = GPTConfig(**shape)
    model = GPT(config)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for max_len in (config.block_size // 2, config.block_size):
            cache = model.new_cache(batch, max_len, dtype=dtype)
            size = torch.tensor([], dtype=dtype).element_size()
            formula = 2 * config.n_layer * batch * config.n_kv_heads * max_len \
                * config.head_size * size
            rows.append({"dtype": str(dtype).removeprefix("torch."), "B": batch,
                         "T_max": max_len, "nbytes": cache.nbytes(), "formula": formula,
                         "equal": cache.nbytes() == formula})
    return rows


def run(
    quick: bool = False,
    *,
    shape: dict[str, Any] | None = None,
    batch: int = 12,
    iters: int | None = None,
    workloads: tuple[str, ...] = ("train-fp32", "train-bf16", "generate"),
) -> dict[str, Any]:
    shape = shape or dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
    iters = iters or (3 if quick else 50)
    names = {
        "import": "import torch + attnlab",
        "train-fp32": f"train fp32 ({iters} steps, batch {batch})",
        "train-bf16": f"train bf16 ({iters} steps, batch {batch})",
        "generate": f"generate (batch {batch}, {shape['block_size']} tokens)",
    }
    unknown = sorted(set(workloads) - set(names))
    if unknown:
        raise ValueError(f"unknown workloads {unknown}; known: {sorted(names)}")
    bodies: dict[str, tuple[str, dict[str, Any]]] = {
        "import": (_IMPORT_ONLY, {}),
        "train-fp32": (_TRAIN, {"iters": iters, "batch": batch, "dtype": "float32"}),
        "train-bf16": (_TRAIN, {"iters": iters, "batch": batch, "dtype": "bfloat16"}),
        "generate": (_GENERATE, {"batch": batch}),
    }
    peaks = {names[w]: peak_rss_mb(bodies[w][0], shape, **bodies[w][1])
             for w in ("import", *workloads) if w in names}
    floor = peaks[names["import"]]
    kv = kv_cache_rows(shape, batch)
    params = GPT(GPTConfig(**shape)).num_params(non_embedding=False)
    return {
        "suite": "memory",
        "machine": machine(),
        "config": {"model": shape, "batch": batch, "iters": iters},
        "peak_rss_mb": peaks,
        "kv_cache": kv,
        "kv_cache_matches_formula": all(r["equal"] for r in kv),
        "tables": [
            table("Peak RSS (MB, fresh process each)", ["workload", "peak RSS", "above import"],
                  [[k, v, v - floor] for k, v in peaks.items()]),
            table("KV cache bytes: KVCache.nbytes() vs 2 * n_layer * B * nkv * T_max * hs * "
                  "bytes", ["dtype", "B", "T_max", "nbytes()", "formula", "equal"],
                  [[r["dtype"], r["B"], r["T_max"], r["nbytes"], r["formula"], r["equal"]]
                   for r in kv]),
        ],
        "notes": [f"model: {shape}, {params:,} parameters "
                  f"({params * 4 / 2**20:.2f} MB in fp32); one torch thread."],
    }
