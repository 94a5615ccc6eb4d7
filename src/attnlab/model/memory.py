"""Will it fit? The memory a model needs at a dtype, the memory a device has free, and one
line that says so before a load starts instead of the out-of-memory killer after.

`check_memory` is what loaders call with the bytes they are about to allocate; `fit_report`
is what `attnlab info` prints for every dtype. Free memory on the CPU is the least of the
kernel's MemAvailable, what the container's memory limit leaves (cgroup v2 or v1) and what
the process's address-space limit leaves (RLIMIT_AS: `ulimit -v`, `prlimit --as`); on a GPU
`torch.cuda.mem_get_info`; elsewhere (MPS) it is unknown and nothing is refused.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

#: the dtypes a command can load a model in (the CLI's --dtype choices), as users name them;
#: the API also takes float64 (`materialize.load_dtype`)
LOAD_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
}


class DoesNotFitError(ValueError):
    """The model cannot fit in the memory the device has free (the message says what would)."""


def gb(nbytes: float) -> str:
    """A byte count as people read it: "141.1 GB", "27.4 MB", "912 bytes"."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{int(nbytes)} bytes"


def params_text(n: float) -> str:
    """A parameter count as people say it: "70.55B", "124.4M", "7,024"."""
    for unit, size in (("B", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:.2f}{unit}" if unit == "B" else f"{n / size:.1f}{unit}"
    return f"{int(n):,}"


def available_bytes(device: str | torch.device) -> int | None:
    """Bytes free for a new allocation on `device`; None where that is unknown (a device
    type this machine lacks included)."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    known = [n for n in (_meminfo_available(), _cgroup_free(), _cgroup_v1_free(),
                         _address_space_free()) if n is not None]
    return min(known) if known else None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # not Linux: free pages
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_free() -> int | None:
    """What the container's memory limit leaves (cgroup v2), or None without one."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(int(limit) - int((root / "memory.current").read_text()), 0)
    except (OSError, ValueError):
        return None


#: cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit count (2**63 - 4096
#: on x86-64); anything this large is no limit
_V1_UNLIMITED = 1 << 60


def _cgroup_v1_free() -> int | None:
    """What the container's memory limit leaves (cgroup v1), or None without one."""
    root = Path("/sys/fs/cgroup/memory")
    try:
        limit = int((root / "memory.limit_in_bytes").read_text())
        if limit >= _V1_UNLIMITED:
            return None
        return max(limit - int((root / "memory.usage_in_bytes").read_text()), 0)
    except (OSError, ValueError):
        return None


def _address_space_free() -> int | None:
    """What the process's address-space limit (RLIMIT_AS) leaves of its virtual size, or
    None without one: past it every allocation fails, however much memory is free."""
    try:
        import resource  # POSIX only
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return max(soft - int(line.split()[1]) * 1024, 0)
    except (OSError, ValueError, IndexError):
        pass
    return soft  # the virtual size unknown: the limit itself bounds what is left


def check_memory(params: int, dtype: torch.dtype, device: str | torch.device, *,
               extra: int = 0, force: bool = False) -> None:
    """DoesNotFitError unless `params` parameters in `dtype` (plus `extra` bytes, e.g. the
    largest tensor read on the way) fit in what `device` has free; `force` skips the check."""
    device = torch.device(device)
    free = available_bytes(device)
    needed = params * dtype.itemsize + extra
    if force or free is None or needed <= free:
        return
    where = "this machine has" if device.type == "cpu" else f"{device} has"
    half = params * 2 + extra
    parts = [f"the model needs {gb(needed)} in {str(dtype).removeprefix('torch.')} "
             f"({params_text(params)} parameters) but {where} {gb(free)} free"]
    if dtype.itemsize > 2 and half <= free:
        parts.append(f"in bfloat16 it needs {gb(half)}, which fits: --dtype bfloat16 "
                     "(dtype=torch.bfloat16)")
    else:
        if dtype.itemsize > 2:
            parts.append(f"even bfloat16 needs {gb(half)}")
        fits = params_text(max(free - extra, 0) // 2)
        parts.append(f"use a device with {gb(min(needed, half))} free or a smaller model "
                     f"(about {fits} parameters fit here in bfloat16)")
    parts.append("--force (force=True) tries anyway")
    raise DoesNotFitError("; ".join(parts))


def fit_report(params: int, device: str | torch.device = "cpu", extra: int = 0
               ) -> dict[str, dict[str, object]]:
    """{dtype name: {"bytes": needed, "fits": bool | None}} for every dtype in LOAD_DTYPES
    on `device` (None: free memory unknown)."""
    free = available_bytes(device)
    report: dict[str, dict[str, object]] = {}
    for name, dtype in LOAD_DTYPES.items():
        needed = params * dtype.itemsize + extra
        report[name] = {"bytes": needed, "fits": None if free is None else needed <= free}
    return report
