"""`python -m benchmarks.report [--check]`: the benchmark pages, written from the recorded results.

Reads the checked-in `benchmarks/results/<suite>.json` (what `python -m benchmarks SUITE
--record` writes) and rebuilds two generated blocks, each between a pair of markers:

- `docs/benchmarks.md`, `<!-- report:tables:start -->` ... `end`: every suite's tables and
  notes, each under the machine it ran on;
- `README.md`, `<!-- report:summary:start -->` ... `end`: one table of at most a dozen
  headline rows, each naming its machine.

The prose around the blocks (how to run the suites, the lab notes) is written by hand and
left as it is. `--check` writes nothing and exits 1 when a block differs from what the
results give (tests/test_readme.py runs the same check). Only numbers already in the JSON
are shown: a suite with no result file, or a row whose variant it lacks, is left out.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .__main__ import load_results, render_any
from .common import describe_machine
from .gpu_report import gpu_summary
from .patching import DEFAULT, TL
from .trace import HF_BASE, RUN, TL_PATTERN
from .train_step import BEST

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
TABLES, SUMMARY = "tables", "summary"
Result = dict[str, Any]


def markers(name: str) -> tuple[str, str]:
    return f"<!-- report:{name}:start -->", f"<!-- report:{name}:end -->"


def full_tables(results: dict[str, Result]) -> str:
    """Every suite's tables and notes, each under the machine it was measured on."""
    parts = []
    for name, result in results.items():
        parts += [f"### {name}", ""]
        if result.get("machine"):
            parts += [f"Measured on {describe_machine(result['machine'])}.", ""]
        parts += [render_any(result), ""]
    return "\n".join(parts)


def cpu_label(result: Result) -> str:
    m = result.get("machine") or {}
    isa = "AMX" if m.get("amx_bf16") else "AVX512-BF16" if m.get("avx512_bf16") else \
        "no AVX512-BF16"
    return f"{m.get('cpu', '?')}, {isa}"


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _n(value: float) -> str:
    """Three significant digits below 100, whole numbers with commas above."""
    return f"{value:#.3g}" if value < 100 else f"{value:,.0f}"


def _train_rows(r: Result) -> list[list[str]]:
    one = {x["variant"]: x for x in r["records"] if x["threads"] == 1}
    base, best = one.get("nanoGPT baseline"), one.get(BEST)
    if not (base and best):
        return []
    return [["training step, nanoGPT's Shakespeare CPU shape (bf16, explicit attention, "
             "fused AdamW; 1 thread)", f"{_n(best['tokens_per_s'])} tokens/s",
             f"nanoGPT's step {_n(base['tokens_per_s'])}",
             f"{_x(best['tokens_per_s'] / base['tokens_per_s'])} faster"]]


def _quality_rows(r: Result) -> list[list[str]]:
    res = r["results"]
    ours, theirs = res.get("attnlab best", {}), res.get("nanoGPT recipe", {})
    a, b = ours.get("seconds_to_target"), theirs.get("seconds_to_target")
    if a is None or b is None:
        return []
    return [[f"time to val loss {r['target_loss']:.2f}, tiny Shakespeare (attnlab's recipe)",
             f"{_n(a)} s", f"nanoGPT's recipe {_n(b)} s", f"{a / b:.2f}x the time"]]


def _attention_rows(r: Result) -> list[list[str]]:
    at = [x for x in r["records"] if x["T"] == 256 and x["mode"] == "fwd"]
    if not at:
        return []
    ms = at[0]["ms"]
    return [["explicit (traceable) attention, T=256 forward", f"{_n(ms['explicit'])} ms",
             f"fused (SDPA) {_n(ms['fused'])} ms", f"{ms['explicit'] / ms['fused']:.2f}x the time"]]


def _decode_rows(r: Result) -> list[list[str]]:
    rows = []
    for x in r["records"]:
        if x["batch"] == 1 and x["dtype"] == "float32":
            tps = x["tokens_per_s"]
            rows.append([f"greedy decode, {x['shape']} shape, batch 1, float32",
                         f"{_n(tps['attnlab'])} tokens/s",
                         f"Hugging Face generate {_n(tps['huggingface'])}",
                         f"{_x(x['ratio'])} faster" + ("" if x["same_greedy_ids"]
                                                       else " (ids differ)")])
    return rows


def _trace_rows(r: Result) -> list[list[str]]:
    ms, rows = r["ms"], []
    forward, weights = ms.get("attnlab forward (no trace)"), ms.get("attnlab trace: attn_weights")
    if forward and weights:
        rows.append(["forward keeping every layer's attention weights, GPT-2 shape, T=1024",
                     f"{_n(weights)} ms", f"the same forward untraced {_n(forward)} ms",
                     f"{weights / forward:.2f}x the time"])
    for other, label in ((HF_BASE, "Hugging Face eager output_attentions (base model)"),
                         (TL_PATTERN, "TransformerLens run_with_cache (patterns)")):
        if RUN in ms and other in ms:
            rows.append(["every layer's attention weights, GPT-2 shape, T=1024 (`Trace.run`)",
                         f"{_n(ms[RUN])} ms", f"{label} {_n(ms[other])} ms",
                         f"{_x(ms[other] / ms[RUN])} faster"])
    return rows


def _patching_rows(r: Result) -> list[list[str]]:
    ms = r["ms"]
    if TL not in ms:
        return []
    return [[f"activation patching grid, GPT-2 shape, {r['runs']} patched runs (`attnlab patch`)",
             f"{_n(ms[DEFAULT] / 1e3)} s", f"TransformerLens get_act_patch {_n(ms[TL] / 1e3)} s",
             f"{_x(ms[TL] / ms[DEFAULT])} faster"]]


def _roofline_rows(r: Result) -> list[list[str]]:
    one = [x for x in r["records"] if x["threads"] == 1]
    if not one:
        return []
    x = one[0]
    rows = [["GPT-2 small float32 decode against the memory roofline (1 thread)",
             f"{_n(x['decode_tok_s'])} tokens/s", f"roofline {_n(x['roofline_tok_s'])}",
             f"{x['fraction']:.0%} of it"]]
    f16 = x.get("float16_weights")
    if f16:
        rows.append(["GPT-2 small decode with float16 weights (`--weights float16`, 1 thread)",
                     f"{_n(f16['decode_tok_s'])} tokens/s",
                     f"float32 {_n(x['decode_tok_s'])}", f"{_x(f16['speedup'])} faster"])
    return rows


# suite -> its headline rows, in the README's order
HEADLINES: dict[str, Callable[[Result], list[list[str]]]] = {
    "train": _train_rows,
    "quality": _quality_rows,
    "attention": _attention_rows,
    "decode": _decode_rows,
    "models_decode": _decode_rows,
    "trace": _trace_rows,
    "patching": _patching_rows,
    "roofline": _roofline_rows,
}
MAX_SUMMARY_ROWS = 13


def summary(results: dict[str, Result]) -> str:
    """The README's table: a dozen headline rows, the machine of each named."""
    rows = []
    for name, headline in HEADLINES.items():
        if name in results:
            rows += [[*row, cpu_label(results[name])] for row in headline(results[name])]
    rows = rows[:MAX_SUMMARY_ROWS]
    versions = sorted({f"torch {r['machine']['torch']}" for r in results.values()
                       if r.get("machine") and not r["machine"].get("gpu")})  # the CPU runs
    lines = ["| measured | attnlab | against | result | CPU |", "|---|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", f"2-core cloud VMs, {', '.join(versions)}, shared with other jobs (ratios "
              "are of alternating rounds, side by side); from `benchmarks/results/`, written "
              "by `python -m benchmarks.report`."]
    return "\n".join(lines) + "\n" + gpu_summary(results)


def splice(text: str, name: str, block: str) -> str:
    """`text` with the block between `name`'s markers replaced by `block`."""
    start, end = markers(name)
    if text.count(start) != 1 or text.count(end) != 1:
        raise ValueError(f"expected one {start} and one {end}; found "
                         f"{text.count(start)} and {text.count(end)}")
    head, rest = text.split(start, 1)
    return head + start + "\n" + block + end + rest.split(end, 1)[1]


def pages(results: dict[str, Result]) -> dict[Path, str]:
    """Each generated page's whole text as the results make it."""
    blocks = {DOCS: (TABLES, full_tables(results)), README: (SUMMARY, summary(results))}
    return {path: splice(path.read_text(encoding="utf-8"), name, block)
            for path, (name, block) in blocks.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a page is not what the results give")
    args = parser.parse_args(argv)
    stale = []
    for path, text in pages(load_results()).items():
        if path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    if args.check and stale:
        names = ", ".join(str(p.relative_to(ROOT)) for p in stale)
        print(f"{names}: not what benchmarks/results/ give; run python -m benchmarks.report",
              file=sys.stderr)
        return 1
    if not stale:
        print("up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
