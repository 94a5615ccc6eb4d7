"""What every suite shares: timing by alternating rounds, the machine, matmul peak, tables.

A suite is a module with `run(quick: bool, ...) -> dict` returning a *result*:
    {"suite": name, "tables": [{"title", "columns", "rows"}], "notes": [str], ...}
`__main__.py` prints the tables as markdown and writes the whole dict as JSON. Timings on
a shared CPU are noisy, so variants are timed in alternating rounds (A B C A B C ...) and
reported as the median, which a burst of load from another process moves least. While a
suite runs, each case it times says so on stderr (`note`; `alternate` does it), and
`__main__.py` adds a line when none came for `QUIET_S`: a full suite runs for minutes.
"""

from __future__ import annotations

import gc
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.model.runtime import (
    linear_kernel,
    one_thread,
    release_kept_memory,
    reuse_freed_memory,
    trim_heap,
)


def package_version(package: str) -> str | None:
    """The installed version of `package`, or None where it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


#: seconds without a line on stderr after which `__main__.py` says the suite still runs
QUIET_S = 10.0
#: when the last line of a suite's progress went out (`note`)
last_note = time.monotonic()


def note(text: str) -> None:
    """One line of a suite's progress on stderr (stdout holds the tables)."""
    global last_note
    print(f"  {text}", file=sys.stderr, flush=True)
    last_note = time.monotonic()


def median_ms(times_s: Sequence[float]) -> float:
    return statistics.median(times_s) * 1e3


def alternate(
    variants: dict[str, Callable[[], object]], *, rounds: int, warmup: int = 2, inner: int = 1
) -> dict[str, dict[str, list[float]]]:
    """Time each variant `rounds` times, interleaved: {name: {"wall": [s], "cpu": [s]}}.

    Seconds per call (mean of `inner` calls), as wall time and as this process's CPU time.
    Interleaving puts every variant under the same background load. With one torch thread
    CPU time is what wall time would be on an idle core, and other processes on a shared
    machine move it far less than they move wall time.
    """
    began = time.perf_counter()
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    times: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in variants}
    for done in range(1, rounds + 1):
        for name, fn in variants.items():
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(inner):
                fn()
            times[name]["wall"].append((time.perf_counter() - w0) / inner)
            times[name]["cpu"].append((time.process_time() - c0) / inner)
        # slow rounds (whole seconds each) say how far they are; fast ones stay quiet
        if done < rounds and time.monotonic() - last_note >= QUIET_S / 2:
            note(f"round {done} of {rounds} ({time.perf_counter() - began:.0f} s so far)")
    note(f"timed {', '.join(variants)}: {rounds} rounds in {time.perf_counter() - began:.1f} s")
    return times


def clock() -> str:
    """The clock to report: CPU time when torch runs on one thread (see `alternate`)."""
    return "cpu" if torch.get_num_threads() == 1 else "wall"


def matmul_peak_gflops(dtype: torch.dtype, n: int = 1024, rounds: int = 10) -> float:
    """Best-of-`rounds` GFLOP/s of an n x n x n `torch.mm` in `dtype` at the current threads.

    With one thread the clock is CPU time (see `alternate`), so time stolen by other
    processes does not lower the peak; with more it is wall time.
    """
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    torch.mm(a, b)
    now = time.process_time if clock() == "cpu" else time.perf_counter
    best = float("inf")
    for _ in range(rounds):
        t0 = now()
        torch.mm(a, b)
        best = min(best, now() - t0)
    return 2 * n**3 / max(best, 1e-9) / 1e9


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def machine() -> dict[str, Any]:
    flags = cpu_flags()
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "torch": torch.__version__,
        "linear_kernel": linear_kernel(),
        "python": platform.python_version(),
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def describe_machine(m: dict[str, Any]) -> str:
    isa = ", AVX512-BF16" if m.get("avx512_bf16") else ""
    isa += ", AMX" if m.get("amx_bf16") else ""
    load = m.get("load_avg_1m")
    shared = f"; 1-min load {load:.1f} at start (shared machine)" if load is not None else ""
    kernel = f", float32 linears through {m['linear_kernel']}" if "linear_kernel" in m else ""
    if m.get("gpu"):  # a GPU suite (gpu_common.gpu_machine): the GPU first, its host after
        # an early gpu.json recorded neither the memory nor the CUDA version
        known = [f"{m['gpu_memory_gib']} GiB" if m.get("gpu_memory_gib") else "",
                 f"CUDA {m['cuda']}" if m.get("cuda") else ""]
        about = f" ({', '.join(part for part in known if part)})" if any(known) else ""
        return (f"{m['gpu']}{about}, torch {m['torch']}, host {m['cpu']} ({m['cores']} "
                f"cores), Python {m['python']}")
    return (f"{m['cpu']} ({m['cores']} cores{isa}), torch {m['torch']}{kernel}, "
            f"Python {m['python']}{shared}")


def table(title: str, columns: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    return {"title": title, "columns": columns, "rows": rows}


def _cell(value: Any) -> str:
    if value is None:  # a measurement this row does not have (e.g. blocks at 1 thread)
        return "–"
    if isinstance(value, float):
        if value == 0 or 0.01 <= abs(value) < 1e5:
            return f"{value:#.3g}" if abs(value) < 10 else f"{value:,.1f}"
        return f"{value:.3g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def markdown(t: dict[str, Any]) -> str:
    lines = [f"**{t['title']}**", "", "| " + " | ".join(t["columns"]) + " |",
             "|" + "|".join("---" for _ in t["columns"]) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in t["rows"]]
    return "\n".join(lines)


def render(result: dict[str, Any]) -> str:
    """A suite's result as markdown: its tables, then its notes as a list."""
    parts = [markdown(t) for t in result.get("tables", [])]
    notes = result.get("notes", [])
    if notes:
        parts.append("\n".join(f"- {n}" for n in notes))
    return "\n\n".join(parts)


def cold_call(fn: Callable[[], Any]) -> tuple[float, int | None, Any]:
    """(seconds, rise of this process's peak RSS during the call, fn's result) of a cold call:
    attnlab keeps no freed buffer (`release_kept_memory`) and the heap no free page
    (`trim_heap`), so its scores and weights go into fresh pages, as every other tool's do on
    every call. The rise is None where Linux's peak reset (/proc/self/clear_refs) is not
    available."""
    gc.collect()
    release_kept_memory()
    trim_heap()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        rss0: int | None = status_kb("VmRSS")
    except OSError:
        rss0 = None
    now = time.process_time if clock() == "cpu" else time.perf_counter  # as the ms columns
    start = now()
    with torch.inference_mode():
        out = fn()
    seconds = now() - start
    return seconds, None if rss0 is None else (status_kb("VmHWM") - rss0) * 1024, out


def alone_first_call(make: Callable[[], Callable[[], Any]]) -> tuple[float, int | None]:
    """`cold_call`'s (seconds, peak RSS rise) of the function `make` sets up, with freed
    memory reused and one torch thread as the CLI and the suites set them: the body of a
    suite's `first_call`, which `in_own_process` runs alone."""
    reuse_freed_memory()
    with one_thread():
        return cold_call(make())[:2]


def in_own_process(module: str, function: str, *args: Any) -> Any:
    """`benchmarks.<module>.<function>(*args)` run in a fresh Python process, and its result
    (JSON) here. A first call measured there starts from an empty heap; in the benchmark's
    own process its peak RSS rise would depend on what the calls before it left in the heap
    (docs/performance.md#summaries-at-long-context)."""
    code = (f"import json; from benchmarks import {module}; "
            f"print(json.dumps({module}.{function}(*{args!r})))")
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1], check=False)
    if done.returncode != 0:
        raise RuntimeError(f"benchmarks.{module}.{function}{args!r} failed in its own "
                           f"process:\n{done.stderr[-2000:]}")
    note(f"{function}{args!r} in its own process: {time.perf_counter() - began:.1f} s")
    return json.loads(done.stdout.splitlines()[-1])


def status_kb(field: str) -> int:
    """A field of /proc/self/status in kB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))
