"""GPU decode against the memory bandwidth (issue 33, item 3): a Llama-3.1-8B-shaped model.

A random bfloat16 model of Llama-3.1-8B's shape (32 layers, 4096 wide, 32 query heads, 8 KV
heads, d_ff 14336, vocab 128256, untied: 16 GB of weights), drawn on the GPU; batch 1, a
16-token prompt, 256 new greedy tokens, attnlab eager and compiled (`generate(...,
compile=True)`: CUDA graphs). Each decode step streams every weight once, so tokens/s x
weight bytes is the bandwidth decode reaches; it is set against the GPU's measured
device-to-device copy rate (bytes read + written per second by `copy_` of 1 GiB, best of
10). The KV cache's bytes are left out (small at this length). Target: >= 70% (compiled).

    python -m benchmarks.gpu_bandwidth [--smoke [--device cpu]] [--out FILE]
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab import GPTConfig
from attnlab.generate import generate
from attnlab.model.compiled_decode import compiled_decodes, release_compiled

from .common import table
from .gpu_common import (
    cuda_ms,
    gpu_machine,
    median,
    pick_device,
    random_gpt,
    skipped,
    suite_main,
    write_partial,
)
from .gpu_decode import COMPILED, EAGER, NEW_TOKENS, PROMPT, first_calls

LLAMA_8B = GPTConfig(
    vocab_size=128256, block_size=131072, n_layer=32, n_head=32, n_kv_head=8, n_embd=4096,
    d_ff=14336, pos="rope", rope_theta=500000.0, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu",
    bias=False, tie_weights=False,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
)
LLAMA_TOY = GPTConfig(vocab_size=97, block_size=512, n_layer=2, n_head=4, n_kv_head=2,
                      n_embd=32, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False,
                      tie_weights=False)
TARGET = 0.70


def copy_rate(device: torch.device, nbytes: int, rounds: int = 10) -> float:
    """Bytes read + written per second by a device-to-device `copy_` of nbytes (best of
    rounds): the memory bandwidth a decode step can stream weights at, measured."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    best = min(cuda_ms(lambda: dst.copy_(src), device, rounds=rounds, warmup=2))
    return 2 * nbytes / (best / 1e3)


def measure(config: GPTConfig, device: torch.device, n: int, rounds: int,
            rate: float) -> dict[str, Any]:
    """attnlab eager and compiled decode of a random model: tokens/s, and tokens/s x weight
    bytes over the copy rate."""
    model = random_gpt(config, device, torch.bfloat16)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ids = torch.randint(1, config.vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(1)).to(device)
    fns = {EAGER: lambda: generate(model, ids, max_new_tokens=n, temperature=0),
           COMPILED: lambda: generate(model, ids, max_new_tokens=n, temperature=0,
                                      compile=True)}
    first, _, errors = first_calls(fns, device)
    tok_s = {name: n / (median(cuda_ms(fns[name], device, rounds=rounds, warmup=0)) / 1e3)
             for name in first}
    steps = compiled_decodes(model)
    record = {
        "weight_bytes": weight_bytes, "copy_bytes_per_s": rate, "tokens_per_s": tok_s,
        "new_tokens": n, "rounds": rounds, "first_call_s": first, "errors": errors,
        "compile_s": steps[0].compile_seconds if steps else None,
        "cuda_graph": steps[0].cuda_graph if steps else None,
        "fraction_of_bandwidth": {k: v * weight_bytes / rate for k, v in tok_s.items()},
    }
    release_compiled(model)
    return record


def run(quick: bool = False, device: str | None = None, out: Path | None = None
        ) -> dict[str, Any]:
    """Measure the copy rate, then decode; quick: a toy model, 8 tokens (a smoke test)."""
    where = pick_device(device)
    if where is None:
        return skipped("gpu_bandwidth")
    (shape, config), n, rounds, nbytes = ((("llama-toy", LLAMA_TOY), 8, 1, 1 << 24) if quick
                                          else (("llama3.1-8b", LLAMA_8B), NEW_TOKENS, 2,
                                                1 << 30))
    rate = copy_rate(where, nbytes)
    gc.collect()
    record = {"shape": shape, **measure(config, where, n, rounds, rate)}
    gc.collect()
    m = gpu_machine(where)
    share = record["fraction_of_bandwidth"]
    met = {"bandwidth": share[COMPILED] >= TARGET} if COMPILED in share and not quick else {}
    result = {
        "suite": "gpu_bandwidth", "machine": m, "record": record, "targets_met": met,
        "tables": [table(
            "Decode against the memory bandwidth (attnlab, random bfloat16 weights, batch 1)",
            ["shape", "variant", "tokens/s", "weight GB", "copy GB/s", "share of bandwidth"],
            [[shape, name, record["tokens_per_s"][name], record["weight_bytes"] / 1e9,
              rate / 1e9, share[name]] for name in record["tokens_per_s"]])],
        "notes": [
            f"{m.get('gpu') or 'no GPU: ' + str(where)}, torch {m['torch']}; {PROMPT}-token "
            f"prompt, {n} new tokens, median of {rounds} calls after a first (compiling) one "
            f"({record['compile_s'] or 0:.1f} s compiled, "
            f"{'a' if record['cuda_graph'] else 'no'} CUDA graph); copy rate: bytes read + "
            "written per second by a device-to-device copy_.",
            *(f"{k} failed: {e}" for k, e in record["errors"].items()),
            *(f"target {k} (>= {TARGET:.0%}): {'met' if ok else 'missed'}"
              for k, ok in met.items()),
            *(["smoke run: tiny shapes, figures mean nothing"] if quick else []),
        ],
    }
    write_partial(out, result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return suite_main(run, argv, "python -m benchmarks.gpu_bandwidth", __doc__)


if __name__ == "__main__":
    sys.exit(main())
