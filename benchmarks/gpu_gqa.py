"""Grouped-query key/value heads on a GPU: copied out to every query head (what attnlab does
there) or handed to SDPA as they are (`enable_gqa`, what it does on a CPU:
docs/performance.md#grouped-query-decode). A probe for a lent GPU, not a suite: it decides
whether `sdpa.GQA_DEVICES` may take "cuda".

Each case runs `attend`'s fused path both ways on Qwen2.5-0.5B's attention shape (14 query
heads, 2 key/value heads, head size 64, bfloat16 on a GPU): decode steps (one query over
4,096 cached keys) without a mask, with left padding and with a static cache's slot mask,
and prefills of 4,096 tokens, causal and in a 1,024-token sliding window. Per case and way:
the median of `ROUNDS` synchronised calls, the peak memory, and the largest difference
between the two ways' outputs.

    python -m benchmarks.gpu_gqa --out FILE [--smoke --device cpu]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch

from attnlab.model import sdpa
from attnlab.model.attention import attend
from attnlab.model.masks import Mask, build_mask

from .gpu_common import (
    cuda_ms,
    gpu_machine,
    median,
    peak_bytes,
    pick_device,
    reset_peak,
    skipped,
    suite_main,
)

HEADS, KV_HEADS, HEAD_SIZE = 14, 2, 64  # Qwen2.5-0.5B
ROUNDS = 20
WAYS = ("copied", "enable_gqa")


def _cases(S: int, window: int, device: torch.device) -> dict[str, tuple[int, int, Mask]]:
    """name -> (batch, queries, mask) of each workload at context S."""
    pads = torch.ones(4, S, dtype=torch.long, device=device)  # (4, S)
    for row, n in enumerate((0, 7, S // 3, S // 2)):
        pads[row, :n] = 0
    slots = torch.arange(S, device=device) < S - S // 4  # (S,): a static cache's filled slots
    return {
        "decode, no mask": (1, 1, build_mask(1, S, None, device=device)),
        "decode, left-padded batch of 4": (4, 1, build_mask(1, S, pads, device=device)),
        "decode, static cache slots": (1, 1, Mask(slots[None, None, None, :])),
        "prefill, causal": (1, S, build_mask(S, S, None, device=device)),
        f"prefill, window {window}": (1, S, build_mask(S, S, None, device=device,
                                                       window=window)),
    }


def _take(way: str, device: torch.device) -> None:
    """Set GQA_DEVICES so that `attend` takes `way` on `device`'s type."""
    devices = {"cpu"} - {device.type} if way == "copied" else {"cpu", device.type}
    sdpa.GQA_DEVICES.clear()
    sdpa.GQA_DEVICES.update(devices)


def _case(batch: int, T: int, mask: Mask, S: int, dtype: torch.dtype, device: torch.device,
          rounds: int) -> dict[str, Any]:
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, HEADS, T, HEAD_SIZE, generator=g, device=device, dtype=dtype)
    k, v = (torch.randn(batch, KV_HEADS, S, HEAD_SIZE, generator=g, device=device,
                        dtype=dtype) for _ in range(2))  # (B, nkv, S, hs) each
    row: dict[str, Any] = {}
    outputs = []
    for name in WAYS:
        _take(name, device)
        reset_peak(device)
        outputs.append(attend(q, k, v, mask, fused=True))  # (B, nh, T, hs)
        times = cuda_ms(lambda: attend(q, k, v, mask, fused=True), device, rounds=rounds)
        peak = peak_bytes(device)
        row[f"{name}_ms"] = median(times)
        row[f"{name}_peak_mib"] = None if peak is None else peak / 2**20
    row["copied_vs_gqa"] = row["copied_ms"] / row["enable_gqa_ms"]
    row["max_difference"] = (outputs[0].float() - outputs[1].float()).abs().max().item()
    return row


def run(quick: bool = False, device: str | None = None, out: Any = None) -> dict[str, Any]:
    where = pick_device(device)
    if where is None:
        return skipped("gpu_gqa")
    if not sdpa.SDPA_GQA:
        return {"suite": "gpu_gqa", "skipped": "gpu_gqa: torch < 2.5 has no enable_gqa"}
    S, window = (64, 16) if quick else (4096, 1024)
    dtype = torch.float32 if where.type == "cpu" else torch.bfloat16
    before = set(sdpa.GQA_DEVICES)
    rows = []
    try:
        for name, (batch, T, mask) in _cases(S, window, where).items():
            measured = _case(batch, T, mask, S, dtype, where, 1 if quick else ROUNDS)
            rows.append([name, *(f"{measured[k]:.3f}" for k in ("copied_ms", "enable_gqa_ms")),
                         f"{measured['copied_vs_gqa']:.2f}", f"{measured['max_difference']:.1e}",
                         *(_mib(measured[f"{w}_peak_mib"]) for w in WAYS)])
    finally:
        sdpa.GQA_DEVICES.clear()
        sdpa.GQA_DEVICES.update(before)
    title = (f"Grouped-query heads copied or handed to SDPA ({HEADS} query, {KV_HEADS} key/value "
             f"heads, head size {HEAD_SIZE}, {S} keys, {str(dtype).removeprefix('torch.')})")
    return {"suite": "gpu_gqa", "machine": gpu_machine(where), "tables": [{
        "title": title,
        "columns": ["case", "copied ms", "enable_gqa ms", "copied / enable_gqa",
                    "max |difference|", "copied peak MiB", "enable_gqa peak MiB"],
        "rows": rows}]}


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    return suite_main(run, argv, "python -m benchmarks.gpu_gqa", __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
