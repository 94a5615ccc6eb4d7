"""The README summary's GPU table: headline rows of the recorded GPU suites.

`report.summary` appends `gpu_summary(results)` below the CPU table; it is empty until a GPU
suite's result is recorded (`python -m benchmarks gpu_decode --record` on a GPU), so no GPU
figure appears before one is measured. Each row names its GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .gpu_decode import COMPILED, HF_EAGER, HF_STATIC
from .gpu_summaries import FORWARD, ROWS_CONTEXT, SUMMARY
from .gpu_trace import FORWARD as TRACE_FORWARD
from .gpu_trace import HF_BASE, HF_LM, RUN

Result = dict[str, Any]
#: The GPU table's rows at most (the CPU table has report.MAX_SUMMARY_ROWS)
MAX_GPU_ROWS = 7


def _n(value: float) -> str:
    return f"{value:#.3g}" if value < 100 else f"{value:,.0f}"


def _decode_rows(r: Result) -> list[list[str]]:
    rows = []
    for x in r.get("records", []):
        tps = x["tokens_per_s"]
        if COMPILED in tps and HF_STATIC in tps and HF_EAGER in tps:
            rows.append([f"greedy decode, {x['shape']} shape, bfloat16, batch 1 "
                         "(`generate(..., compile=True)`)", f"{_n(tps[COMPILED])} tokens/s",
                         f"HF static + compile {_n(tps[HF_STATIC])}, HF eager "
                         f"{_n(tps[HF_EAGER])}",
                         f"{tps[COMPILED] / tps[HF_STATIC]:.2f}x / "
                         f"{tps[COMPILED] / tps[HF_EAGER]:.2f}x faster"])
    return rows


def _bandwidth_rows(r: Result) -> list[list[str]]:
    bw = r.get("record", {})
    share = bw.get("fraction_of_bandwidth", {}).get(COMPILED)
    if share is None:
        return []
    return [[f"decode of a {bw['shape']}-shaped model against memory bandwidth (compiled, "
             "bfloat16, batch 1)", f"{_n(bw['tokens_per_s'][COMPILED])} tokens/s",
             f"copy rate {_n(bw['copy_bytes_per_s'] / 1e9)} GB/s", f"{share:.0%} of it"]]


def _trace_rows(r: Result) -> list[list[str]]:
    ms = r.get("ms", {})
    if not all(k in ms for k in (RUN, TRACE_FORWARD, HF_LM, HF_BASE)):
        return []
    hf = min(ms[HF_LM], ms[HF_BASE])
    return [[f"every layer's attention weights, GPT-2 shape, T={r['T']}, float32 "
             "(`Trace.run`)", f"{_n(ms[RUN])} ms",
             f"HF eager output_attentions {_n(hf)} ms; attnlab fused forward "
             f"{_n(ms[TRACE_FORWARD])} ms",
             f"{hf / ms[RUN]:.2f}x faster; {ms[RUN] / ms[TRACE_FORWARD]:.2f}x the forward"]]


def _summaries_rows(r: Result) -> list[list[str]]:
    lengths, times, forwards, ratios = [], [], [], []
    for T, variants in r.get("lengths", {}).items():
        # a record from before ROWS_MAKE_CONTEXT was on: its rows-pass row is today's default
        s, f = variants.get(ROWS_CONTEXT, variants.get(SUMMARY, {})), variants.get(FORWARD, {})
        if "ms" in s and "ms" in f:
            peak = (f", peak {s['peak_bytes'] / f['peak_bytes']:.2f}x"
                    if s.get("peak_bytes") and f.get("peak_bytes") else "")
            lengths.append(T)
            times.append(_n(s["ms"]))
            forwards.append(_n(f["ms"]))
            ratios.append(f"{s['ms'] / f['ms']:.2f}x the time{peak}")
    if not lengths:
        return []
    return [[f"five per-head summaries, every layer, Llama-3.2-1B shape, T={' / '.join(lengths)}",
             f"{' / '.join(times)} ms", f"fused forward {' / '.join(forwards)} ms",
             "; ".join(ratios)]]


def _time_ratio(ours: Result, nano: Result) -> str:
    """attnlab's time over nanoGPT's, to the target, or (nanoGPT never reaching it) to the
    best val nanoGPT reached."""
    if ours.get("reached") and nano.get("reached"):
        return f"{ours['reached']['seconds'] / nano['reached']['seconds']:.2f}x nanoGPT's time"
    if not nano.get("evals"):
        return ""
    best = min(nano["evals"], key=lambda e: e["val"])
    at = next((e for e in ours.get("evals", []) if e["val"] <= best["val"]), None)
    if at is None:
        return ""
    return (f"to nanoGPT's best ({best['val']:.4f}): {_n(at['seconds'])} s against "
            f"{_n(best['seconds'])} s, {at['seconds'] / best['seconds']:.2f}x its time")


def _train_rows(r: Result) -> list[list[str]]:
    """Beside nanoGPT's run: the attnlab run that reached the target soonest, and the one with
    the most tokens/s (the plain GPU recipe, or a way of it `gpu_train` also ran, named)."""
    runs = r.get("runs", [])
    nano = next((x for x in runs if x["name"].startswith("nanoGPT")), None)
    ours = [x for x in runs if x["name"].startswith("attnlab") and x.get("tokens_per_s")]
    if nano is None or not nano.get("tokens_per_s") or not ours:
        return []

    def reached(x: Result) -> str:
        hit = x.get("reached")
        if hit:
            return f"{_n(hit['seconds'])} s (step {hit['step']})"
        best = min(x["evals"], key=lambda e: e["val"]) if x.get("evals") else None
        return ("not reached" if best is None else f"not reached in {_n(x['seconds'])} s "
                f"(best {best['val']:.4f} at {_n(best['seconds'])} s)")

    def way(x: Result) -> str:  # "" for the plain recipe
        how = x["name"].removeprefix("attnlab train, GPU recipe").strip(", ")
        return f", {how}" if how else ""

    soonest = min(ours, key=lambda x: (x.get("reached") or {}).get("seconds", math.inf))
    fastest = max(ours, key=lambda x: x["tokens_per_s"])
    return [[f"tiny Shakespeare to val <= {r['target']} from process start (`attnlab train "
             f"--data`, GPU recipe{way(soonest)})", reached(soonest),
             f"nanoGPT train.py compiled: {reached(nano)}", _time_ratio(soonest, nano)],
            ["training tokens/s at nanoGPT's shakespeare_char shape and batch"
             + (f" (GPU recipe{way(fastest)})" if way(fastest) else ""),
             f"{_n(fastest['tokens_per_s'])}, MFU {fastest['mfu']:.1%}",
             f"nanoGPT compiled {_n(nano['tokens_per_s'])}, MFU {nano['mfu']:.1%}",
             f"{fastest['tokens_per_s'] / nano['tokens_per_s']:.2f}x"]]


GPU_HEADLINES: dict[str, Callable[[Result], list[list[str]]]] = {
    "gpu": _train_rows,
    "gpu_decode": _decode_rows,
    "gpu_bandwidth": _bandwidth_rows,
    "gpu_trace": _trace_rows,
    "gpu_summaries": _summaries_rows,
}


def gpu_summary(results: dict[str, Result]) -> str:
    """The GPU rows as a markdown table (with a blank line before it), or "" when no GPU
    suite has a result measured on a GPU."""
    rows = []
    for name, headline in GPU_HEADLINES.items():
        gpu = results.get(name, {}).get("machine", {}).get("gpu")
        if gpu:  # a smoke run off CUDA names no GPU: its figures are no GPU's
            rows += [[*row, gpu] for row in headline(results[name])]
    if not rows:
        return ""
    rows = rows[:MAX_GPU_ROWS]
    lines = ["", "| measured on a GPU | attnlab | against | result | GPU |",
             "|---|---|---|---|---|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"
