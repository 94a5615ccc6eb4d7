"""The weights pass at long context on a GPU: one layer's whole attention weights, traced by
the explicit path or written once from each row's lse (`summary_kernels.WEIGHTS_FROM_LSE`,
off since float32 GPT-2 small at 1,024 tokens measured it slower: docs/performance.md#the-
weights-pass). A probe for a lent GPU, not a suite: it asks whether the pass pays where its
memory saving is large (it never holds the (nh, T, T) scores beside the weights) and its
products run on tensor cores (bfloat16).

A Llama-3.2-1B-shaped model (`gpu_summaries.LLAMA_1B`) with random bfloat16 weights, batch
1, `Trace(names="attn_weights", layers=[LAYER])` at `LENGTHS` tokens: the untraced forward
(the yardstick), the explicit path, and the weights pass with its lse from the rows pass and
from SDPA's kernel (`LSE_FROM_FORWARD`). Per way: the median of the rounds, the peak memory
of one call, and the weights' largest difference from the explicit path's.

    python -m benchmarks.gpu_weights_pass --out FILE [--smoke --device cpu]
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.model.trace import Trace

from .common import table
from .gpu_common import gpu_machine, pick_device, random_gpt, skipped, suite_main, write_partial
from .gpu_summaries import LLAMA_1B, TOY, measure
from .gpu_trace import summary_flags, weights_pass_flags

LENGTHS = (4096, 8192)
LAYER = 8
#: way -> the `summary_kernels` flags it runs under
WAYS: dict[str, dict[str, Any]] = {
    "explicit path": {"WEIGHTS_FROM_LSE": False},
    "weights pass, rows pass's lse": {"WEIGHTS_FROM_LSE": True, "LSE_FROM_FORWARD": False},
    "weights pass, SDPA's lse": {"WEIGHTS_FROM_LSE": True, "LSE_FROM_FORWARD": True},
}
FORWARD = "forward (no trace)"


def lengths_rows(model: Any, T: int, layer: int, device: torch.device, rounds: int
                 ) -> dict[str, Any]:
    """Every way at T tokens: time, peak and the weights' difference from the explicit path."""
    ids = torch.randint(0, model.config.vocab_size, (1, T),
                        generator=torch.Generator().manual_seed(T)).to(device)
    forced = weights_pass_flags(ids) or {}  # `run` checked that it can run

    @torch.inference_mode()
    def forward() -> None:
        model(ids, last_logits_only=True)

    def traced(flags: dict[str, Any]) -> torch.Tensor:
        with torch.inference_mode(), summary_flags(**flags, **forced):
            return Trace(names="attn_weights", layers=[layer]).run(model, ids).get(
                "attn_weights", layer)

    rows = {FORWARD: measure(forward, device, rounds)}
    expected = traced(WAYS["explicit path"])  # (1, nh, T, T)
    for way, flags in WAYS.items():
        rows[way] = measure(lambda flags=flags: traced(flags), device, rounds)
        if "error" not in rows[way]:
            got = traced(flags)
            rows[way]["max_difference"] = (got.float() - expected.float()).abs().max().item()
            del got
        gc.collect()
    return rows


def run(quick: bool = False, device: str | None = None, out: Path | None = None
        ) -> dict[str, Any]:
    where = pick_device(device)
    if where is None:
        return skipped("gpu_weights_pass")
    if weights_pass_flags(torch.empty(0, device=where)) is None:
        return {"suite": "gpu_weights_pass",
                "skipped": "gpu_weights_pass: the weights pass needs triton on a CUDA GPU "
                           "(pip install triton)"}
    config, lengths, layer = (TOY, (64, 96), 1) if quick else (LLAMA_1B, LENGTHS, LAYER)
    # Triton's interpreter (a smoke run on a CPU) computes bfloat16 through numpy, which has
    # none: there the smoke run takes float32
    dtype = torch.float32 if where.type == "cpu" else torch.bfloat16
    model = random_gpt(config, where, dtype)
    result: dict[str, Any] = {"suite": "gpu_weights_pass", "machine": gpu_machine(where),
                              "dtype": str(dtype).removeprefix("torch."), "layer": layer,
                              "lengths": {}}
    for T in lengths:
        result["lengths"][str(T)] = lengths_rows(model, T, layer, where, 1 if quick else 3)
        write_partial(out, result)
    rows = []
    for T, ways in result["lengths"].items():
        base = ways[FORWARD].get("ms")
        for way, r in ways.items():
            ms, peak = r.get("ms"), r.get("peak_bytes")
            rows.append([T, way, ms, ms / base if ms and base else None,
                         peak / 2**30 if peak else None, r.get("max_difference"),
                         r.get("error", "")])
    shape = "toy" if quick else "Llama-3.2-1B"
    result["tables"] = [table(
        f"One layer's whole attention weights at long context ({shape} shape, layer {layer}, "
        f"{result['dtype']}, batch 1)",
        ["tokens", "way", "ms", "x forward", "peak GiB", "max |w - explicit's|", "note"], rows)]
    result["notes"] = ["median of the rounds, each call synchronised; peak: "
                       "torch.cuda.max_memory_allocated during one call",
                       *(["smoke run: tiny shapes, figures mean nothing"] if quick else [])]
    write_partial(out, result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return suite_main(run, argv, "python -m benchmarks.gpu_weights_pass", __doc__)


if __name__ == "__main__":
    sys.exit(main())
