"""Decode roofline: how fast this machine streams weights, and how close decode comes to it.

A batch-1 decode step multiplies one row by every weight matrix: it reads each weight once
and does 2 flops per weight, so its speed is bounded by memory bandwidth, not arithmetic.
This suite measures that bandwidth the way decode uses it (`x @ W`, x (1, in), W (in, out)
float32 over a few hundred MB, 1 and 2 threads: `torch.mm`, and at 2 threads also attnlab's
product in one block per thread, `decode.Affine`; the faster is the bandwidth), divides it
by the bytes a step streams
(`streamed_bytes`: every weight, the tied head once, not the position table nor an untied
token table, of which a step reads one row), and sets attnlab's measured batch-1 greedy
decode of the same GPT-2-small shape beside it in alternating rounds (same threads, same
clock). The lower-precision kernels PyTorch ships are timed on the same matrix:
bfloat16 `x @ W`, `torch.ops.aten._weight_int8pack_mm` (int8 weights, one scale per
output channel, bfloat16 activations) and fbgemm's `quantized.linear_dynamic_fp16` (float16
weights, float32 arithmetic), to say whether a lower-precision weight path pays; the last one
does, so attnlab's decode with `half_weights` is timed beside the float32 one, with how far
the rounding moved the logits.

Target (issue 16): GPT-2 small float32 batch-1 decode at >= 80% of the roofline.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from attnlab.generate import generate
from attnlab.model.decode import half_weights
from attnlab.model.decode_parts import Affine
from attnlab.model.gpt import GPT, GPTConfig

from .common import alternate, clock, machine, median_ms, table
from .decode import PROMPT, build_pair

TARGET = 0.8
# a (in, out) float32 matrix of 4096 x 24576: 403 MB, far past any cache
MATRIX = (4096, 24576)
QUICK_MATRIX = (1024, 8192)
ROOFLINE_PRESETS = ("gpt2", "gpt2-medium", "qwen2.5-0.5b")


def streamed_bytes(config: GPTConfig, bytes_per_weight: float = 4.0) -> int:
    """Bytes of weights one decode step reads: all parameters except the position table and
    (when the head has its own matrix) the token table, of which a step reads one row."""
    with torch.device("meta"):
        model = GPT(config)
    skip = {"wpe.weight"} | (set() if config.tie_weights else {"wte.weight"})
    n = sum(p.numel() for name, p in model.named_parameters() if name not in skip)
    return int(n * bytes_per_weight)


def _kernels(rows: int, cols: int) -> dict[str, Callable[[], object]]:
    gen = torch.Generator().manual_seed(0)
    w32 = torch.randn(rows, cols, generator=gen)  # (in, out)
    x32 = torch.randn(1, rows, generator=gen)  # (1, in)
    w16, x16 = w32.to(torch.bfloat16), x32.to(torch.bfloat16)
    # int8 per output channel, laid out (out, in) as the kernel wants
    scales = w32.abs().amax(dim=0) / 127  # (out,)
    w8 = (w32 / scales).round().clamp(-127, 127).to(torch.int8).t().contiguous()  # (out, in)
    scales16 = scales.to(torch.bfloat16)
    fns: dict[str, Callable[[], object]] = {
        "float32 x @ W": lambda: torch.mm(x32, w32),  # (1, in) @ (in, out)
        "bfloat16 x @ W": lambda: torch.mm(x16, w16),
    }
    if torch.get_num_threads() > 1:  # at one thread Affine is torch.mm
        blocks = Affine(w32, None)
        fns[BLOCKS] = lambda: blocks(x32)  # (1, out)
    int8mm = getattr(torch.ops.aten, "_weight_int8pack_mm", None)
    if int8mm is not None:
        fns["int8 _weight_int8pack_mm"] = lambda: int8mm(x16, w8, scales16)  # (1, out)
    if FBGEMM:
        packed = torch.ops.quantized.linear_prepack_fp16(w32.t().contiguous(), None)
        fns[FP16] = lambda: torch.ops.quantized.linear_dynamic_fp16(x32, packed)  # (1, out)
    return fns


FBGEMM = "fbgemm" in torch.backends.quantized.supported_engines
FP16 = "float16 linear_dynamic_fp16"
BLOCKS = "float32 x @ W, a block per thread"
BYTES_PER_WEIGHT = {"float32 x @ W": 4, "bfloat16 x @ W": 2, "int8 _weight_int8pack_mm": 1,
                    FP16: 2, BLOCKS: 4}


def _decoders(shape: str, new_tokens: int) -> tuple[dict[str, Callable[[], object]],
                                                     dict[str, float]]:
    """Greedy generation with float32 weights and, where fbgemm runs, with the same weights
    after `half_weights` (packed before timing); and how far the rounding moved things."""
    _, ours = build_pair(shape, block_size=max(1024, PROMPT + new_tokens))
    ids = torch.randint(1, ours.config.vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(1))
    fns: dict[str, Callable[[], object]] = {
        "attnlab decode": lambda: generate(ours, ids, max_new_tokens=new_tokens, temperature=0)}
    if not FBGEMM:
        return fns, {}
    halved = half_weights(copy.deepcopy(ours))
    fns["attnlab decode, float16 weights"] = lambda: generate(
        halved, ids, max_new_tokens=new_tokens, temperature=0)
    with torch.inference_mode():
        moved = (halved(ids).logits - ours(ids).logits).abs().max().item()
        a = generate(ours, ids, max_new_tokens=new_tokens, temperature=0)[0, PROMPT:]
        b = generate(halved, ids, max_new_tokens=new_tokens, temperature=0)[0, PROMPT:]
    differ = (a != b).nonzero()
    first = int(differ[0, 0]) if len(differ) else new_tokens
    return fns, {"max_abs_logit_change": moved, "greedy_ids_before_first_difference": first}


def run(quick: bool = False) -> dict[str, Any]:
    """Bandwidth and decode at 1 and 2 threads; quick: a small matrix and the toy shape."""
    threads_before = torch.get_num_threads()
    rows_in, cols = QUICK_MATRIX if quick else MATRIX
    shape, new_tokens, rounds = ("toy", 8, 2) if quick else ("gpt2", 64, 7)
    config = GPTConfig(block_size=1024, **_shape(shape))
    step_bytes = streamed_bytes(config)
    records: list[dict[str, Any]] = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            records.append(measure(threads, config, (rows_in, cols), shape, new_tokens, rounds))
    finally:
        torch.set_num_threads(threads_before)
    rows = [[r["threads"], r["GB_per_s"]["float32 x @ W"], r["GB_per_s"].get(BLOCKS),
             r["roofline_tok_s"],
             r["decode_tok_s"], r["fraction"],
             *(r["matrix_speedup_vs_float32"].get(n) for n in ("bfloat16 x @ W",
                                                              "int8 _weight_int8pack_mm", FP16))]
            for r in records]
    halves = [[r["threads"], f16["decode_tok_s"], f16["speedup"], f16["roofline_tok_s"],
               f16["fraction"]] for r in records if (f16 := r.get("float16_weights"))]
    rooflines = preset_rooflines(records)
    one = records[0]
    notes = [
        f"x @ W over a {rows_in} x {cols} float32 matrix ({rows_in * cols * 4 / 1e6:.0f} MB); "
        f"decode: attnlab greedy, {shape} shape (random weights), batch 1, {PROMPT}-token "
        f"prompt, {new_tokens} new tokens; a step streams {step_bytes / 1e6:.3g} MB of float32 "
        f"weights. Median of {rounds} alternating rounds (CPU time at 1 thread, wall at 2) on "
        "a shared, loaded machine.",
        f"target: float32 batch-1 decode >= {TARGET:.0%} of the roofline at 1 thread: "
        + (f"not judged on the quick run's {shape} shape ({one['fraction']:.0%})" if quick else
           f"{'met' if one['fraction'] >= TARGET else 'missed'} ({one['fraction']:.0%})"),
        "bf16 / int8 / fp16: time of the float32 product over that kernel's, same matrix "
        "shape (> 1: faster). int8 is _weight_int8pack_mm with bfloat16 activations; fp16 is "
        "fbgemm's linear_dynamic_fp16 (float16 weights, float32 arithmetic).",
    ]
    if halves:
        notes.append(_float16_note(one["float16_weights"], new_tokens))
    return {
        "suite": "roofline",
        "machine": machine(),
        "records": records,
        "targets_met": {"fraction": one["fraction"] >= TARGET} if not quick else {},
        "tables": [
            table("Decode roofline (float32 weights streamed by x @ W)",
                  ["threads", "x @ W GB/s (mm)", "GB/s (a block per thread)", "roofline tok/s",
                   "attnlab decode tok/s", "fraction of roofline", "bf16 matrix speedup",
                   "int8 matrix speedup", "fp16 matrix speedup"],
                  rows),
            *([table("Decode with float16 weights (half_weights: fbgemm, float32 arithmetic)",
                     ["threads", "tok/s", "x float32 decode", "float16 roofline tok/s",
                      "fraction of it"], halves)] if halves else []),
            table("Roofline of other presets (float32, tokens/s at batch 1)",
                  ["preset", "MB per step", *(f"{r['threads']} thread(s)" for r in records)],
                  rooflines),
        ],
        "notes": notes,
    }


def measure(threads: int, config: GPTConfig, matrix: tuple[int, int], shape: str,
            new_tokens: int, rounds: int) -> dict[str, Any]:
    """The record of one thread count (torch's, set by the caller): the kernels' bandwidth,
    the roofline it sets for `config`, attnlab's decode beside it in alternating rounds."""
    rows_in, cols = matrix
    step_bytes = streamed_bytes(config)
    kernels = _kernels(rows_in, cols)
    decoders, rounding = _decoders(shape, new_tokens)
    variants = {**kernels, **decoders}
    times = alternate(variants, rounds=rounds, warmup=1)
    clk = clock()
    ms = {name: median_ms(t[clk]) for name, t in times.items()}
    # the best round is the closest to what the memory system can do
    best = {name: min(t[clk]) * 1e3 for name, t in times.items()}
    gbps = {name: rows_in * cols * BYTES_PER_WEIGHT[name] / (ms[name] / 1e3) / 1e9
            for name in kernels}
    # the fastest float32 product is what the machine's memory can do for decode
    bandwidth = max(gbps["float32 x @ W"], gbps.get(BLOCKS, 0.0))
    roof = bandwidth * 1e9 / step_bytes  # tokens/s if a step only streamed weights
    tok_s = new_tokens / (ms["attnlab decode"] / 1e3)
    record = {
        "threads": threads, "clock": clk, "rounds": rounds, "ms": ms, "best_ms": best,
        "GB_per_s": gbps, "bandwidth_GB_per_s": bandwidth, "step_bytes": step_bytes,
        "roofline_tok_s": roof, "decode_tok_s": tok_s, "fraction": tok_s / roof,
        "matrix_speedup_vs_float32": {n: ms["float32 x @ W"] / ms[n] for n in kernels},
    }
    if rounding:
        # float16 weights: the same bandwidth over half the bytes of each weight
        tok16 = new_tokens / (ms["attnlab decode, float16 weights"] / 1e3)
        roof16 = bandwidth * 1e9 / streamed_bytes(config, 2.0)
        record["float16_weights"] = {
            "decode_tok_s": tok16, "speedup": tok16 / tok_s, "roofline_tok_s": roof16,
            "fraction": tok16 / roof16, **rounding}
    return record


def preset_rooflines(records: list[dict[str, Any]]) -> list[list[Any]]:
    """Rows of the presets' rooflines at each record's measured bandwidth: (name, MB a step
    streams, tokens/s per record); presets this branch lacks are left out."""
    rooflines = []
    for name in ROOFLINE_PRESETS:
        try:
            preset = GPTConfig.from_name(name)
        except ValueError:  # a preset another branch adds
            continue
        b = streamed_bytes(preset)
        rooflines.append([name, b / 1e6, *(r["bandwidth_GB_per_s"] * 1e9 / b
                                          for r in records)])
    return rooflines


def _float16_note(f16: dict[str, Any], new_tokens: int) -> str:
    """The note on the float16-weights decode: how its roofline is set, what rounding moved."""
    return (
        "float16 weights: `half_weights` on a copy of the same model (packed before "
        "timing); their roofline is the same x @ W bandwidth over 2 bytes per weight. "
        f"Rounding moved the prompt's logits by at most {f16['max_abs_logit_change']:.3g}; "
        f"greedy ids agreed for {f16['greedy_ids_before_first_difference']} of "
        f"{new_tokens} new tokens.")


def _shape(shape: str) -> dict[str, Any]:
    from .decode import SHAPES

    return SHAPES[shape]

