"""The summary kernels' block sizes at long context, side by side on one GPU: which
(rows, keys, warps, stages) per pass makes `Trace(names=SUMMARY_NAMES).run`'s five summaries
cheapest against the fused forward (docs/performance-gpu.md#summaries-on-a-gpu), with the
context from SDPA, from the rows pass (`summary_kernels.ROWS_MAKE_CONTEXT`) and from SDPA
with its lse (`LSE_FROM_FORWARD`, whose given-lse pass walks in the rows pass's blocks). A
probe for a lent GPU, not a suite: the same workload as `gpu_summaries`' longest row
(Llama-3.2-1B shape, bfloat16, batch 1), each candidate timed after its own warmup (its
compilation).

    python -m benchmarks.gpu_summary_blocks --out FILE [--tokens N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from attnlab.model import summary_kernels

from .gpu_common import random_gpt
from .gpu_summaries import FORWARD, FORWARD_LSE, LLAMA_1B, SDPA_CONTEXT, SUMMARY, attnlab_rows

#: (rows pass, received pass) candidates; the first is the default
CANDIDATES: list[tuple[tuple[int, ...], tuple[int, ...]]] = [
    ((128, 64, 8), (64, 128, 8)),
    ((128, 64, 4), (64, 128, 4)),
    ((128, 128, 8), (128, 128, 8)),
    ((128, 64, 8, 4), (64, 128, 8, 4)),
    ((64, 64, 4), (64, 64, 4)),
    ((128, 32, 4), (32, 128, 4)),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_summary_blocks")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=32768)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    model = random_gpt(LLAMA_1B, device, torch.bfloat16)
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "tokens": args.tokens,
                              "candidates": []}
    for rows, received in CANDIDATES:
        summary_kernels.ROWS_BLOCKS[128] = rows
        summary_kernels.RECEIVED_BLOCKS[128] = received
        try:
            measured = attnlab_rows(model, args.tokens, device, rounds=2)
            row = {"rows": rows, "received": received,
                   "forward_ms": measured[FORWARD].get("ms"),
                   "summaries_ms": measured[SUMMARY].get("ms"),
                   "peak_gib": (measured[SUMMARY].get("peak_bytes") or 0) / 2**30}
            row["x_forward"] = row["summaries_ms"] / row["forward_ms"]
            for variant, key in ((SDPA_CONTEXT, "sdpa_context"), (FORWARD_LSE, "forward_lse")):
                if variant in measured:  # the same blocks, the other ways
                    row[f"{key}_ms"] = measured[variant].get("ms")
                    row[f"x_forward_{key}"] = row[f"{key}_ms"] / row["forward_ms"]
        except Exception as err:  # a candidate that fails to compile or run is reported
            row = {"rows": rows, "received": received, "error": f"{type(err).__name__}: {err}"}
        result["candidates"].append(row)
        print(json.dumps(row), flush=True)
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
