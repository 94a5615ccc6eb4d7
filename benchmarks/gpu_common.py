"""What the GPU suites share (gpu_decode, gpu_trace, gpu_summaries, gpu_profile).

Each GPU suite is a module with `run(quick=False, device=None) -> result`, the result format
of common.py plus the GPU's name in `machine["gpu"]`. Without a CUDA device (and no device
given) `run` returns `skipped(...)`: one line, no JSON written. `--smoke` (each module's own
`python -m benchmarks.gpu_X --smoke [--device cpu]`) runs the suite's every code path on tiny
shapes on any device, so a typo fails here and not on a lent GPU; its figures mean nothing.

Timing on a GPU: `cuda_ms` synchronises before and after each call and takes the median
of `rounds` calls after `warmup` (kernels run asynchronously: a clock without a
synchronise measures the launches). Models are random (no downloads): attnlab's built
directly on the device in the dtype (`random_gpt`), Hugging Face's from a config
(`hf_from_config`), and where both must hold the same weights, attnlab's is
`attnlab.hf.gpt_from_hf` of the Hugging Face one (as decode.py and trace.py do).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from attnlab import GPT, GPTConfig
from attnlab.model import summary_kernels
from attnlab.model.runtime import reuse_freed_memory

from .common import machine, render


def pick_device(device: str | None) -> torch.device | None:
    """The device a suite runs on: `device` as given, else cuda when there is one, else None
    (the suite skips)."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda") if torch.cuda.is_available() else None


def skipped(suite: str) -> dict[str, Any]:
    """A GPU suite's result on a machine without CUDA: one line, no numbers."""
    return {"suite": suite, "skipped": f"{suite}: no CUDA GPU here (torch.cuda.is_available() "
            f"is False); skipped (python -m benchmarks.{suite} --smoke --device cpu runs its "
            "code paths on tiny shapes)"}


def gpu_machine(device: torch.device) -> dict[str, Any]:
    """common.machine() plus the GPU: its name, memory, CUDA and driver-visible capability."""
    m = machine()
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        m |= {"gpu": torch.cuda.get_device_name(device),
              "gpu_memory_gib": round(props.total_memory / 2**30, 1),
              "cuda": torch.version.cuda, "capability": f"{props.major}.{props.minor}"}
    else:
        m |= {"gpu": None, "smoke_device": str(device)}
    return m


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def summary_flags(**flags: Any) -> Iterator[None]:
    """`summary_kernels`' module flags (and `WEIGHTS_BLOCKS`' float32 entry, as `tiles`) set
    meanwhile."""
    saved = {name: getattr(summary_kernels, name) for name in flags if name != "tiles"}
    blocks = dict(summary_kernels.WEIGHTS_BLOCKS)
    try:
        for name, value in flags.items():
            if name == "tiles":
                summary_kernels.WEIGHTS_BLOCKS[4] = value
            else:
                setattr(summary_kernels, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(summary_kernels, name, value)
        summary_kernels.WEIGHTS_BLOCKS.update(blocks)


def alternating_ms(fns: dict[str, Callable[[], object]], device: torch.device, rounds: int
                   ) -> dict[str, float]:
    """name -> median ms of its synchronised calls, in `rounds` rounds of one call of each
    (A B C A B C ...): a drift of the machine reaches every variant alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name] += cuda_ms(fn, device, rounds=1, warmup=0)
    return {name: median(t) for name, t in times.items()}


def cuda_ms(fn: Callable[[], object], device: torch.device, *, rounds: int,
            warmup: int = 1) -> list[float]:
    """Milliseconds of each of `rounds` calls of fn, synchronised on `device` before and
    after each (after `warmup` untimed calls)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device: torch.device) -> int | None:
    """torch.cuda.max_memory_allocated since `reset_peak`; None off CUDA (not measured)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def is_oom(err: BaseException) -> bool:
    """An out-of-memory error from CUDA (or, in a CPU smoke run, from the allocator)."""
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def random_gpt(config: GPTConfig, device: torch.device, dtype: torch.dtype,
               seed: int = 0) -> GPT:
    """GPT(config) with random weights drawn on `device` in `dtype` (an 8B model is never
    held in float32 or on the CPU); eval mode. Rotary frequencies stay float32."""
    torch.manual_seed(seed)
    with default_dtype(dtype), torch.device(device):
        return GPT(config).eval()


def hf_from_config(family: str, fields: dict[str, Any], device: torch.device,
                   dtype: torch.dtype, attn: str = "sdpa", seed: int = 0,
                   initializer: float = 0.1) -> Any:
    """A transformers `{family}ForCausalLM` with random weights (normal, std `initializer`:
    0.1, as decode.py, gives peaked logits), built on `device` in `dtype`; eval mode."""
    import transformers

    torch.manual_seed(seed)
    config = getattr(transformers, f"{family}Config")(
        **fields, initializer_range=initializer, bos_token_id=None, eos_token_id=None,
        pad_token_id=0)
    config._attn_implementation = attn
    cls = getattr(transformers, f"{family}ForCausalLM" if family != "GPT2" else
                  "GPT2LMHeadModel")
    with default_dtype(dtype), torch.device(device):
        return cls(config).eval()


def transformers_version() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    return str(transformers.__version__)


def suite_main(run: Callable[..., dict[str, Any]], argv: Sequence[str] | None,
               prog: str, doc: str | None) -> int:
    """`python -m benchmarks.gpu_X [--smoke] [--device D] [--out FILE]`: run, print the
    tables, write the JSON."""
    parser = argparse.ArgumentParser(prog=prog, description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes, one round: proves the code paths, measures nothing")
    parser.add_argument("--device", help="cuda (default when there is one), cuda:1, or cpu "
                        "(with --smoke: the code paths without a GPU)")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    reuse_freed_memory()  # as the attnlab CLI does
    if args.device is not None and torch.device(args.device).type != "cuda" and not args.smoke:
        parser.error(f"--device {args.device} measures nothing a GPU suite is for; add --smoke")
    if args.device is not None and torch.device(args.device).type == "cpu":
        torch.set_num_threads(1)  # a smoke run on a shared CPU: no spinning OpenMP threads
    result = run(quick=args.smoke, device=args.device, out=args.out)
    print(f"_{result['skipped']}_" if "skipped" in result else render(result))
    if args.out is not None and "skipped" not in result:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.out}")
    return 0


def largest_difference(got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> float:
    """The largest |difference| between paired tensors (every layer's weights, say), in
    float32."""
    return max((a.float() - b.float()).abs().max().item()
               for a, b in zip(got, expected, strict=True))


def timing_cells(r: dict[str, Any], base: float | None) -> list[float | None]:
    """A probe's row cells for one way's result `r` (gpu_weights_pass, gpu_capped): its ms,
    that over the `base` way's ms, its peak in GiB; None where it did not run."""
    ms, peak = r.get("ms"), r.get("peak_bytes")
    return [ms, ms / base if ms and base else None, peak / 2**30 if peak else None]


def probe_notes(quick: bool) -> list[str]:
    """The notes under a probe's table (gpu_weights_pass, gpu_capped): how it timed and
    measured, and that a smoke run's figures mean nothing."""
    return ["median of alternating rounds, each call synchronised; peak: "
            "torch.cuda.max_memory_allocated during one call",
            *(["smoke run: tiny shapes, figures mean nothing"] if quick else [])]


def write_partial(path: Path | None, result: dict[str, Any]) -> None:
    """Write what a suite has so far (a long suite stopped by a time limit keeps it)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2, default=str))
