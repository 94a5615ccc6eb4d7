"""The weights pass on a GPU: whole attention weights traced by the explicit path or written
once from each row's lse (`summary_kernels.WEIGHTS_FROM_LSE`: on for 16-bit traces, off for
float32, which GPT-2 small at 1,024 tokens measured slower:
docs/performance-gpu.md#the-weights-pass). A probe for a lent GPU, not a suite.

A Llama-3.2-1B-shaped model (`gpu_summaries.LLAMA_1B`) with random bfloat16 weights, batch
1, `Trace(names="attn_weights", layers=[LAYER])` at `LENGTHS` tokens: the untraced forward
(the yardstick), the explicit path, and the weights pass with its lse from the rows pass and
from SDPA's kernel (`LSE_FROM_FORWARD`); then float16 at `HALF_LENGTHS`, and every layer of
a GPT-2-small-shaped model at 1,024 tokens in bfloat16 (gpu_trace's case). Per way: the
median of `ROUNDS`, the peak memory of one call, and the weights' largest difference from
the explicit path's and from the causal softmax computed in float64 from the same way's
traced q and k.

    python -m benchmarks.gpu_weights_pass --out FILE [--smoke --device cpu]
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.model.config import GPTConfig
from attnlab.model.trace import Trace

from .common import table
from .gpu_common import (
    alternating_ms,
    gpu_machine,
    pick_device,
    probe_notes,
    random_gpt,
    skipped,
    suite_main,
    summary_flags,
    timing_cells,
    write_partial,
)
from .gpu_summaries import LLAMA_1B, TOY, measure
from .gpu_trace import EVERY_DTYPE, weights_pass_flags

GPT2 = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
LENGTHS = (1024, 2048, 4096, 8192)
HALF_LENGTHS = (4096,)
LAYER = 8
#: rounds per way (median): at 1k-2k tokens a call is a few milliseconds of launches, and 3
#: rounds on one H100 lease disagreed between two runs
ROUNDS = 7
#: way -> the `summary_kernels` flags it runs under
WAYS: dict[str, dict[str, Any]] = {
    "explicit path": {"WEIGHTS_FROM_LSE": frozenset()},
    "weights pass, rows pass's lse": {"WEIGHTS_FROM_LSE": EVERY_DTYPE,
                                      "LSE_FROM_FORWARD": False},
    "weights pass, SDPA's lse": {"WEIGHTS_FROM_LSE": EVERY_DTYPE,
                                 "LSE_FROM_FORWARD": True},
}
FORWARD = "forward (no trace)"


def lengths_rows(model: Any, T: int, layers: list[int], device: torch.device, rounds: int
                 ) -> dict[str, Any]:
    """Every way at T tokens: time (median of alternating rounds), peak, and the weights'
    difference from the explicit path's and from float64's."""
    ids = torch.randint(0, model.config.vocab_size, (1, T),
                        generator=torch.Generator().manual_seed(T)).to(device)
    forced = weights_pass_flags(ids) or {}  # `run` checked that it can run

    @torch.inference_mode()
    def forward() -> None:
        model(ids, last_logits_only=True)

    def traced(flags: dict[str, Any], names: tuple[str, ...] = ("attn_weights",)) -> Any:
        with torch.inference_mode(), summary_flags(**flags, **forced):
            return Trace(names=list(names), layers=layers).run(model, ids)

    calls = {FORWARD: forward, **{way: lambda flags=flags: traced(flags)
                                  for way, flags in WAYS.items()}}
    rows = {name: measure(call, device, 1) for name, call in calls.items()}  # warm, peak
    trace = traced(WAYS["explicit path"], ("attn_weights", "q", "k"))  # the reference
    for way, flags in WAYS.items():
        if "error" not in rows[way]:
            got = trace if way == "explicit path" else traced(flags, ("attn_weights", "q", "k"))
            rows[way]["max_difference"] = max(
                (got.get("attn_weights", i).float() - trace.get("attn_weights", i).float()
                 ).abs().max().item() for i in layers)
            # against its own q (1, nh, T, hs) and k (1, nkv, T, hs): past the first traced
            # layer, each way's residual stream (so its q and k) differs by 16-bit rounding
            rows[way]["max_error_vs_float64"] = max(
                float64_error(got.get("attn_weights", i), got.get("q", i), got.get("k", i),
                              model.config) for i in layers)
            del got
        gc.collect()
    del trace
    timed = {name: call for name, call in calls.items() if "error" not in rows[name]}
    for name, ms in alternating_ms(timed, device, rounds).items():
        rows[name]["ms"] = ms
    return rows


def float64_error(weights: torch.Tensor, q: torch.Tensor, k: torch.Tensor, config: Any
                  ) -> float:
    """weights' (1, nh, T, T) largest difference from the causal softmax computed in float64
    from q (1, nh, T, hs) and k (1, nkv, T, hs), head by head (all at once would take
    nh T^2 8 bytes)."""
    nh, nkv, T, hs = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
    scale = config.attn_scale or hs**-0.5
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # (T, T)
    worst = 0.0
    for h in range(nh):
        scores = (q[0, h].double() @ k[0, h // (nh // nkv)].double().T) * scale  # (T, T)
        exact = torch.softmax(scores.masked_fill(future, float("-inf")), -1)  # (T, T)
        worst = max(worst, (weights[0, h].double() - exact).abs().max().item())
    return worst


def run(quick: bool = False, device: str | None = None, out: Path | None = None
        ) -> dict[str, Any]:
    where = pick_device(device)
    if where is None:
        return skipped("gpu_weights_pass")
    if weights_pass_flags(torch.empty(0, device=where)) is None:
        return {"suite": "gpu_weights_pass",
                "skipped": "gpu_weights_pass: the weights pass needs triton on a CUDA GPU "
                           "(pip install triton)"}
    # Triton's interpreter (a smoke run on a CPU) computes 16-bit floats through numpy, which
    # has no bfloat16: there the smoke run takes float32
    runs = ([("toy", TOY, [1], torch.float32, (64, 96))] if where.type == "cpu" else
            [("Llama-3.2-1B", LLAMA_1B, [LAYER], torch.bfloat16, LENGTHS),
             ("Llama-3.2-1B", LLAMA_1B, [LAYER], torch.float16, HALF_LENGTHS),
             ("GPT-2 small", GPT2, list(range(GPT2.n_layer)), torch.bfloat16, (1024,))])
    result: dict[str, Any] = {"suite": "gpu_weights_pass", "machine": gpu_machine(where),
                              "runs": []}
    for shape, config, layers, dtype, lengths in runs:
        model = random_gpt(config, where, dtype)
        found: dict[str, Any] = {"shape": shape, "layers": layers,
                                 "dtype": str(dtype).removeprefix("torch."), "lengths": {}}
        result["runs"].append(found)
        for T in lengths:
            found["lengths"][str(T)] = lengths_rows(model, T, layers, where,
                                                     1 if quick else ROUNDS)
            write_partial(out, result)
        del model
        gc.collect()
    rows = []
    for found in result["runs"]:
        what = (f"{found['shape']}, "
                + (f"layer {found['layers'][0]}" if len(found["layers"]) == 1 else "all layers")
                + f", {found['dtype']}")
        for T, ways in found["lengths"].items():
            base = ways[FORWARD].get("ms")
            for way, r in ways.items():
                rows.append([what, T, way, *timing_cells(r, base), r.get("max_difference"),
                             r.get("max_error_vs_float64"), r.get("error", "")])
    result["tables"] = [table(
        "Whole attention weights, explicit path or weights pass (batch 1)",
        ["model, layers, dtype", "tokens", "way", "ms", "x forward", "peak GiB",
         "max |w - explicit's|", "max |w - float64's|", "note"], rows)]
    result["notes"] = probe_notes(quick)
    write_partial(out, result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return suite_main(run, argv, "python -m benchmarks.gpu_weights_pass", __doc__)


if __name__ == "__main__":
    sys.exit(main())
