"""`attnlab bench [SUITE ...] [--quick] [--out DIR]`: run the repository's benchmarks.

The suites live in `benchmarks/` at the root of a source checkout, not in the installed
package: they carry a nanoGPT baseline and read tiny Shakespeare from next to the
repository, which an installed library has no use for. This command finds that folder (next
to the package source of an editable install, or in the current directory) and runs
`python -m benchmarks` in this process, so both commands print and write the same things.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from .common import CLIError, add_threads_flag, apply_threads, check_out

# benchmarks/__main__.py's SUITES (not importable from an installed package; a test holds
# the two equal), then its two special names
SUITES = ("attention", "train", "memory", "quality", "decode", "models_decode", "trace",
          "summaries", "patching", "arch", "roofline", "loading", "gpt_oss", "latent",
          "gpu_decode",
          "gpu_bandwidth", "gpu_trace", "gpu_summaries", "gpu_profile", "gpu", "all", "readme")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench",
        help="run the speed and quality benchmarks (needs a source checkout)",
        description="Run benchmark suites, print markdown tables and write each suite's "
        "JSON (SUITE.json; with --quick SUITE.quick.json) to bench-results/ in the current "
        "directory (--out DIR elsewhere), and README_table.md from the full runs' JSON there "
        "(so a --quick run writes none). Same as `python -m benchmarks` in a checkout.",
    )
    # checked by `type`, not `choices`: Python 3.11's argparse checks a list default against
    # `choices` as one value and refused the plain `attnlab bench` ("invalid choice: ['all']")
    parser.add_argument("suites", nargs="*", default=["all"], type=_suite, metavar="SUITE",
                        help=f"{', '.join(SUITES)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--out", help="directory for the JSON results and README_table.md "
                        "(default: bench-results/ in the current directory)")
    parser.add_argument("--record", action="store_true",
                        help="write to the checkout's benchmarks/results/ and rebuild its "
                        "README's benchmark block (maintainers)")
    add_threads_flag(parser, "CPU threads for torch in suites that do not set their own "
                     "(default: torch's choice, one per physical core)")
    return parser


def _suite(text: str) -> str:
    if text not in SUITES:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {text!r} (choose from {', '.join(SUITES)})")
    return text


def find_checkout() -> Path | None:
    """The directory holding `benchmarks/__main__.py`: the source tree's root, or the cwd."""
    source_root = Path(__file__).resolve().parents[3]  # <root>/src/attnlab/cli/bench.py
    for root in (source_root, Path.cwd()):
        if (root / "benchmarks" / "__main__.py").is_file():
            return root
    return None


def run(args: argparse.Namespace) -> int:
    apply_threads(args)  # here: one line, attnlab's own (the suites' own parser also checks)
    root = find_checkout()
    if root is None:
        raise CLIError(
            "the benchmarks live in the benchmarks/ folder of a source checkout, and none was "
            f"found next to the package or in {Path.cwd()}; clone the repository, "
            "`pip install -e .` it and run `attnlab bench` there"
        )
    argv = [*args.suites, *(["--quick"] if args.quick else []),
            *(["--record"] if args.record else [])]
    if args.out:
        argv += ["--out", str(check_out(args.out))]
    if args.threads is not None:
        argv += ["--threads", str(args.threads)]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    main = importlib.import_module("benchmarks.__main__").main
    return int(main(argv))
