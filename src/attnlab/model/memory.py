"""Will it fit? The memory a model needs at a dtype, the memory a device has free, and one
line that says so before a load starts instead of the out-of-memory killer after.

`check_memory` is what loaders call with the bytes they are about to allocate: the weights,
the largest tensor read on the way, and what the caller will allocate beside the model
(`Use`: a generation's KV cache, the shard an export writes, what `inspect` traces and
writes); `fit_report` is what `attnlab info` prints for every dtype. Free memory on the CPU
is the least of the kernel's MemAvailable, what the container's memory limit leaves (cgroup
v2 or v1) and what the process's address-space limit leaves (RLIMIT_AS: `ulimit -v`,
`prlimit --as`); on a GPU `torch.cuda.mem_get_info`; elsewhere (MPS) it is unknown and
nothing is refused.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .names import MODEL_NAMES, NAMES, WEIGHT_NAMES, absent_names

if TYPE_CHECKING:
    from .config import GPTConfig

#: the dtypes a command can load a model in (the CLI's --dtype choices), as users name them;
#: the API also takes float64 (`materialize.load_dtype`)
LOAD_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
}
#: how `DoesNotFitError`'s own message names the ways out: the API's arguments (a command
#: words them as its flags: `DoesNotFitError.advice`)
API_DTYPE, API_FORCE = "dtype=torch.bfloat16", "force=True"


@dataclass(frozen=True)
class Use:
    """Memory a caller allocates beside the model's weights, counted by the fit check:
    `elements` in the model's dtype (a KV cache, traced activations) plus `nbytes` whatever
    the dtype (float16 packed matrices), at `most` bytes where it is held a piece at a time
    (an export's shards). `fix`: how the caller holds less of it, in its own words (a
    command's flags), for the refusal to say when this use, not the model, is what does not
    fit."""

    what: str  # "the KV cache for 4 rows of 1,024 positions"
    elements: int = 0
    nbytes: int = 0
    most: int | None = None
    fix: str = ""  # "a shorter text, or fewer layers (--layer)"

    def bytes_in(self, dtype: torch.dtype) -> int:
        total = self.elements * dtype.itemsize + self.nbytes
        return total if self.most is None else min(total, self.most)


@dataclass(frozen=True)
class Shortfall:
    """What a refused load needed and had: the numbers behind `DoesNotFitError`'s advice."""

    needs: str  # "the model needs 16.1 GB in float32 (4.01B parameters) but ... 8.0 GB free"
    free: int
    params: int
    dtype: torch.dtype
    extra: int  # the largest tensor, read on the way
    needed: int  # bytes in `dtype`: weights, extra and uses
    half: int | None  # the same in bfloat16, where `dtype` is wider
    fixes: tuple[str, ...] = ()  # the uses' own fixes, where the model alone fits


class DoesNotFitError(ValueError):
    """The model cannot fit in the memory the device has free. The message says what it
    needs, what there is, and the ways out in the API's words (dtype=torch.bfloat16,
    force=True); `advice(dtype=..., force=...)` words them as a command's flags, and leaves
    out a way the command lacks."""

    def __init__(self, shortfall: Shortfall) -> None:
        self.shortfall = shortfall
        super().__init__(self.advice(dtype=API_DTYPE, force=API_FORCE))

    def advice(self, *, dtype: str | None = None, force: str | None = None) -> str:
        """The one line, with `dtype` (how to load in bfloat16, e.g. "--dtype bfloat16") and
        `force` (how to skip the check) where the caller has them, None where not."""
        s = self.shortfall
        parts = [s.needs]
        if s.fixes:  # the model alone fits: what the caller holds beside it is the cause
            parts.append(f"the model alone fits ({gb(s.params * s.dtype.itemsize + s.extra)}); "
                         f"to hold less beside it: {'; or '.join(s.fixes)}")
        halves = s.half is not None and dtype is not None
        if halves and s.half is not None and s.half <= s.free:
            parts.append(f"in bfloat16 it needs {gb(s.half)}, which fits: {dtype}")
        else:
            if halves and s.half is not None:
                parts.append(f"even bfloat16 needs {gb(s.half)}")
            target, name = ((s.half, "bfloat16") if halves and s.half is not None
                            else (s.needed, _name(s.dtype)))
            # the uses (a KV cache, a copy) grow with the model as its weights do
            fits = params_text(max(s.free - s.extra, 0) * s.params // max(target - s.extra, 1))
            parts.append(f"use a device with {gb(target)} free" + ("" if s.fixes else
                         f" or a smaller model (about {fits} parameters fit here in {name})"))
        if force is not None:
            parts.append(f"{force} tries anyway")
        return "; ".join(parts)


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
                 extra: int = 0, uses: Sequence[Use] = (), force: bool = False) -> None:
    """DoesNotFitError unless `params` parameters in `dtype`, plus `extra` bytes (the
    largest tensor read on the way) and `uses` (what the caller allocates beside the model),
    fit in what `device` has free; `force` skips the check."""
    device = torch.device(device)
    free = available_bytes(device)
    other = extra + sum(use.bytes_in(dtype) for use in uses)
    needed = params * dtype.itemsize + other
    if force or free is None or needed <= free:
        return
    where = "this machine has" if device.type == "cpu" else f"{device} has"
    needs = (f"the model needs {gb(params * dtype.itemsize + extra)} in {_name(dtype)} "
             f"({params_text(params)} parameters)")
    if uses:
        needs += "".join(f", {use.what} {gb(use.bytes_in(dtype))} more" for use in uses)
        needs += f": {gb(needed)} in all,"
    half = params * 2 + extra + sum(use.bytes_in(torch.bfloat16) for use in uses)
    alone = params * dtype.itemsize + extra <= free
    fixes = tuple(dict.fromkeys(use.fix for use in uses if use.fix)) if alone else ()
    raise DoesNotFitError(Shortfall(
        needs=f"{needs} but {where} {gb(free)} free", free=free, params=params, dtype=dtype,
        extra=extra, needed=needed, half=half if dtype.itemsize > 2 else None, fixes=fixes))


def trace_use(config: GPTConfig, tokens: int, names: Iterable[str], *, layers: int,
              heads: int, rows: int | None = None, fix: str = "",
              device: str | torch.device | None = None) -> Use:
    """What a `Trace` of `names` keeps over `layers` layers and `heads` query heads for one
    text of `tokens` tokens (`rows` query rows of the scores and weights; None: every one),
    in the model's dtype, and the traced layer's working copies of its raw, masked and
    softmaxed scores while the forward runs, or a capped model's on `device`
    (`capped_scores`): for a load's fit check (`fix` as `Use`'s). Each
    name's size is read from its shape in `names.NAMES`; names the model never computes
    count nothing."""
    absent = absent_names(config)
    kept = [n for n in dict.fromkeys(names) if n not in absent]
    R = tokens if rows is None else min(rows, tokens)
    sizes = {"B": 1, "nh": heads, "nkv": min(heads, config.n_kv_heads), "T": tokens,
             "S": tokens, "hs": config.head_size, "C": config.n_embd,
             "d_ff": config.d_ff or 4 * config.n_embd, "V": config.vocab_size,
             "n_experts": config.n_experts or 0}
    elements = 0
    for name in kept:
        dims = re.match(r"\(([^)]*)\)", NAMES[name])
        assert dims is not None, f"names.NAMES[{name!r}] opens with its shape"
        shape = [R if name in WEIGHT_NAMES and i == 2 else sizes[d]
                 for i, d in enumerate(dims.group(1).split(", "))]
        elements += math.prod(shape) * (1 if name in MODEL_NAMES else layers)
    # summaries alone are made in tiles: no (T, S) at all; the traced layer's working
    # copies and a capped model's explicit path (every layer, every head) come one at a time
    working = 3 * heads * R * tokens if set(kept) & WEIGHT_NAMES else 0
    elements += max(working, capped_scores(config, tokens, device=device))
    shown = ", ".join(kept[:3]) + (f" and {len(kept) - 3} more" if len(kept) > 3 else "")
    return Use(f"the traced {shown} of {layers} layer{'s' * (layers != 1)} x {heads} "
               f"head{'s' * (heads != 1)} over {tokens:,} tokens", elements=elements, fix=fix)


def capped_scores(config: GPTConfig, tokens: int, batch: int = 1,
                  device: str | torch.device | None = None) -> int:
    """Elements a model that caps its attention scores (attn_logit_softcapping, Gemma 2)
    holds at once in each layer's forward over `tokens` tokens on `device` without
    autograd: SDPA has no cap step, so its attention takes the explicit path, whole on a GPU,
    with (B, nh, T, T) scores and weights and a (B, 1, T, T) mask. 0 for an uncapped model,
    whose fused attention holds no (T, T), and on a CPU, where that path runs in tiles of a
    few MB (`explicit.explicit_attend`). device None: counted as on a GPU."""
    on_cpu = device is not None and torch.device(device).type == "cpu"
    if config.attn_logit_softcapping is None or on_cpu:
        return 0
    return (2 * config.n_head + 1) * batch * tokens * tokens


def fit_report(params: int, device: str | torch.device = "cpu", extra: int = 0,
               uses: Sequence[Use] = ()) -> dict[str, dict[str, object]]:
    """{dtype name: {"bytes": needed, "fits": bool | None}} for every dtype in LOAD_DTYPES
    on `device` (None: free memory unknown): what `check_memory` would ask at each."""
    free = available_bytes(device)
    report: dict[str, dict[str, object]] = {}
    for name, dtype in LOAD_DTYPES.items():
        needed = params * dtype.itemsize + extra + sum(use.bytes_in(dtype) for use in uses)
        report[name] = {"bytes": needed, "fits": None if free is None else needed <= free}
    return report


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
