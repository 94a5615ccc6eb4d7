"""`python -m benchmarks [SUITE ...] [--quick] [--out DIR] [--record]` (also `attnlab bench`).

Runs the suites, prints each as markdown tables, writes `DIR/<suite>.json` (quick runs:
`<suite>.quick.json`, so they never overwrite a full run) and regenerates
`DIR/README_table.md` from the full-run JSON files found in DIR, with the machine they ran
on. DIR is `bench-results/` under the current directory unless `--out` says otherwise: a
user's run never writes into the package. `--record` is the maintainers' switch: results go
to the checked-in `benchmarks/results/`, and docs/benchmarks.md's tables and the README's
summary are rebuilt from them (`benchmarks/report.py`). `python -m benchmarks readme --record`
only rebuilds those (or, with `--out DIR`, DIR's README_table.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from attnlab.model.runtime import reuse_freed_memory

from . import common
from .common import describe_machine, machine, render

# suite name -> module in this package, in the order `all` runs them
SUITES = {
    "attention": "attention_op",
    "train": "train_step",
    "memory": "memory",
    "quality": "train_quality",
    "decode": "decode",
    "models_decode": "decode_models",
    "trace": "trace",
    "summaries": "summaries",
    "patching": "patching",
    "arch": "arch_compare",
    "roofline": "roofline",
    "loading": "loading",
    "gpt_oss": "gpt_oss",
    "latent": "latent",
    # CUDA only: each skips in one line without a GPU (benchmarks/gpu_common.py)
    "gpu_decode": "gpu_decode",
    "gpu_bandwidth": "gpu_bandwidth",
    "gpu_trace": "gpu_trace",
    "gpu_summaries": "gpu_summaries",
    "gpu_profile": "gpu_profile",
    "gpu": "gpu_train",  # skipped without CUDA
}
RECORDED = Path(__file__).resolve().parent / "results"  # checked in; the README shows these
DEFAULT_OUT = Path("bench-results")  # relative: under the directory the user runs from
README_TABLE = "README_table.md"


def run_suite(name: str, quick: bool) -> dict[str, Any]:
    """Import the suite lazily (decode.py may not exist yet) and run it."""
    module_name = f"{__package__ or 'benchmarks'}.{SUITES[name]}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            raise
        return {"suite": name, "skipped": f"{module_name} is not there yet; skipped"}
    t0 = time.perf_counter()
    with _still_running(name):
        result = dict(module.run(quick=quick))
    result.setdefault("suite", name)
    result.setdefault("machine", machine())
    result["quick"] = quick
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


@contextmanager
def _still_running(name: str) -> Iterator[None]:
    """Inside: a line on stderr whenever the suite has said nothing for `common.QUIET_S`
    (its cases say what they timed, `common.note`; a case may take minutes), from a thread
    that ends on the way out."""
    stop = threading.Event()
    began = common.last_note = time.monotonic()

    def watch() -> None:
        while not stop.wait(min(1.0, common.QUIET_S)):
            if time.monotonic() - common.last_note >= common.QUIET_S:
                common.note(f"{name}: still running ({time.monotonic() - began:.0f} s so far)")

    thread = threading.Thread(target=watch, name=f"bench-{name}-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def render_any(result: dict[str, Any]) -> str:
    """Markdown for a result; results without `tables` (another author's suite) as JSON."""
    if "skipped" in result:
        return f"_{result['skipped']}_"
    if "tables" in result:
        return render(result)
    body = {k: v for k, v in result.items() if k != "machine"}
    return "```json\n" + json.dumps(body, indent=2, default=str) + "\n```"


def load_results(directory: Path = RECORDED) -> dict[str, dict[str, Any]]:
    """suite name -> its full run in `directory`, in the order `all` runs the suites."""
    results = {}
    for name in SUITES:
        path = directory / f"{name}.json"
        if path.exists():
            results[name] = json.loads(path.read_text(encoding="utf-8"))
    return results


def write_readme_table(out: Path, *, splice: bool = False) -> Path | None:
    """README_table.md from the full-run results in `out`; None when there are none.

    With `splice` (and `out` the recorded results) docs/benchmarks.md's tables and the
    README's summary are rebuilt (`benchmarks/report.py`).
    """
    results = list(load_results(out).values())
    if not results:
        return None
    m = results[0].get("machine") or machine()
    parts = [
        "## Benchmarks",
        "",
        f"Measured on {describe_machine(m)}. Regenerate with `python -m benchmarks all "
        "--record` (or `attnlab bench --record`); each suite alone with `python -m "
        "benchmarks SUITE --record`.",
    ]
    for r in results:
        parts += ["", f"### {r['suite']}", ""]
        other = r.get("machine")
        if other and _hardware(other) != _hardware(m):  # suites recorded in other sessions
            parts += [f"Measured on {describe_machine(other)}.", ""]
        parts.append(render_any(r))
    path = out / README_TABLE
    path.write_text("\n".join(parts) + "\n")
    if splice and out.resolve() == RECORDED:  # the pages show the checked-in results only
        _rebuild_pages()
    return path


def _hardware(m: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two machines' timings incomparable (not the load at the start)."""
    return (m.get("cpu"), m.get("cores"), m.get("avx512_bf16"), m.get("amx_bf16"), m.get("torch"),
            m.get("linear_kernel"), m.get("gpu"))


def _rebuild_pages() -> None:
    """docs/benchmarks.md's tables and the README's summary, from the recorded results."""
    from .report import main as report  # report reads this module's SUITES and renderers

    report([])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("suites", nargs="*", default=["all"], metavar="SUITE",
                        help=f"{', '.join(SUITES)}, all (default) or readme")
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--out", type=Path,
                        help=f"where JSON goes (default: {DEFAULT_OUT}/ in the current "
                        "directory; with --record: benchmarks/results/)")
    parser.add_argument("--record", action="store_true",
                        help="write to the checked-in benchmarks/results/ and rebuild "
                        "docs/benchmarks.md and the README's summary (maintainers)")
    parser.add_argument("--threads", type=int,
                        help="torch threads for suites that do not set their own")
    args = parser.parse_args(argv)
    reuse_freed_memory()  # as the attnlab CLI does
    known = {*SUITES, "all", "readme"}
    unknown = [s for s in args.suites if s not in known]
    if unknown:
        parser.error(f"unknown suite(s) {unknown}; choose from {sorted(known)}")
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads {args.threads} must be >= 1")
        torch.set_num_threads(args.threads)
    names = list(SUITES) if "all" in args.suites else [s for s in SUITES if s in args.suites]
    # `readme` alone asks for the README block: it reads the recorded results
    record = args.record or (args.suites == ["readme"] and args.out is None)
    if args.out is None:
        args.out = RECORDED if record else DEFAULT_OUT
    elif record and args.out.resolve() != RECORDED:
        parser.error(f"--record writes to {RECORDED}; drop --out {args.out} or --record")
    args.out.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names, 1):
        print(f"## {name}{' (quick)' if args.quick else ''}\n", flush=True)
        print(f"running suite {i} of {len(names)}: {name} ...", file=sys.stderr, flush=True)
        result = run_suite(name, args.quick)
        print(render_any(result) + "\n", flush=True)
        if "seconds" in result:
            print(f"({name}: {result['seconds']:.0f} s)", file=sys.stderr, flush=True)
        if "skipped" not in result:
            suffix = ".quick.json" if args.quick else ".json"
            (args.out / f"{name}{suffix}").write_text(json.dumps(result, indent=2, default=str))
            print(f"(wrote {args.out / (name + suffix)})", file=sys.stderr, flush=True)
    readme = write_readme_table(args.out, splice=record)
    if readme is not None:
        print(f"wrote {readme}" + ("" if record else " (the README is untouched; --record writes "
                                   "benchmarks/results/, docs/benchmarks.md and the README)"))
    elif "readme" in args.suites:
        print(f"no full-run results in {args.out}; run a suite without --quick first",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
