"""A soft-capped forward on a GPU: the explicit path whole (what a capped model runs there)
or in tiles (`traced_attention.tiled_attend`, what it runs on a CPU:
docs/models.md#soft-capping), beside the uncapped forward (SDPA). A probe for a lent GPU, not
a suite: whether `explicit.TILE_DEVICES` should take "cuda".

GPT-2 small's shape with random weights, batch 1, float32 and bfloat16, at `LENGTHS`
tokens. Per way: the median of `ROUNDS` alternating rounds, the peak memory of one call, and
the logits' largest difference from the whole path's.

    python -m benchmarks.gpu_capped --out FILE [--smoke --device cpu]
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from attnlab.model import explicit
from attnlab.model.config import GPTConfig

from .common import table
from .gpu_common import (
    alternating_ms,
    gpu_machine,
    pick_device,
    probe_notes,
    random_gpt,
    skipped,
    suite_main,
    timing_cells,
    write_partial,
)
from .gpu_summaries import measure

GPT2 = GPTConfig(vocab_size=50257, block_size=4096, n_layer=12, n_head=12, n_embd=768,
                 attn_logit_softcapping=50.0)
# a smoke run's: long enough that its scores outgrow one CPU tile, so the tiles run
TOY = dataclasses.replace(GPT2, vocab_size=97, block_size=1024, n_layer=2, n_head=4, n_embd=32)
LENGTHS = (1024, 4096)
ROUNDS = 7
WAYS = ("uncapped (SDPA)", "capped, whole", "capped, tiles")


@contextmanager
def tiles_on(device: torch.device, on: bool) -> Iterator[None]:
    """`explicit.TILE_DEVICES` with or without `device`'s type, meanwhile."""
    saved = set(explicit.TILE_DEVICES)
    explicit.TILE_DEVICES.discard(device.type)
    if on:
        explicit.TILE_DEVICES.add(device.type)
    try:
        yield
    finally:
        explicit.TILE_DEVICES.clear()
        explicit.TILE_DEVICES.update(saved)


def length_rows(capped: Any, plain: Any, T: int, device: torch.device, rounds: int
                ) -> dict[str, Any]:
    """Each way at T tokens: time, peak, the logits' difference from the whole path's."""
    ids = torch.randint(0, capped.config.vocab_size, (1, T),
                        generator=torch.Generator().manual_seed(T)).to(device)

    def call(model: Any, tiles: bool) -> Any:
        with torch.inference_mode(), tiles_on(device, tiles):
            return model(ids).logits

    calls = {WAYS[0]: lambda: call(plain, False), WAYS[1]: lambda: call(capped, False),
             WAYS[2]: lambda: call(capped, True)}
    rows = {way: measure(fn, device, 1) for way, fn in calls.items()}
    if "error" not in rows[WAYS[1]] and "error" not in rows[WAYS[2]]:
        whole, tiled = calls[WAYS[1]]().float(), calls[WAYS[2]]().float()
        rows[WAYS[2]]["max_difference"] = (tiled - whole).abs().max().item()
    timed = {way: fn for way, fn in calls.items() if "error" not in rows[way]}
    for way, ms in alternating_ms(timed, device, rounds).items():
        rows[way]["ms"] = ms
    return rows


def run(quick: bool = False, device: str | None = None, out: Path | None = None
        ) -> dict[str, Any]:
    where = pick_device(device)
    if where is None:
        return skipped("gpu_capped")
    config, lengths = (TOY, (600, 768)) if quick else (GPT2, LENGTHS)
    result: dict[str, Any] = {"suite": "gpu_capped", "machine": gpu_machine(where), "runs": []}
    dtypes = (torch.float32,) if where.type == "cpu" else (torch.float32, torch.bfloat16)
    for dtype in dtypes:
        capped = random_gpt(config, where, dtype)
        plain = random_gpt(dataclasses.replace(config, attn_logit_softcapping=None), where,
                           dtype)
        found: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch."), "lengths": {}}
        result["runs"].append(found)
        for T in lengths:
            found["lengths"][str(T)] = length_rows(capped, plain, T, where,
                                                    1 if quick else ROUNDS)
            write_partial(out, result)
        del capped, plain
    rows = []
    for found in result["runs"]:
        for T, ways in found["lengths"].items():
            base = ways[WAYS[0]].get("ms")
            for way, r in ways.items():
                rows.append([found["dtype"], T, way, *timing_cells(r, base),
                             r.get("max_difference"), r.get("error", "")])
    result["tables"] = [table(
        "A capped forward, whole or in tiles (GPT-2 small's shape, batch 1)",
        ["dtype", "tokens", "way", "ms", "x uncapped", "peak GiB", "max |logits - whole's|",
         "note"], rows)]
    result["notes"] = probe_notes(quick)
    write_partial(out, result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return suite_main(run, argv, "python -m benchmarks.gpu_capped", __doc__)


if __name__ == "__main__":
    sys.exit(main())
