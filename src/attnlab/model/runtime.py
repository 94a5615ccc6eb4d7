"""Process-wide CPU settings that attnlab's commands apply (how freed memory is reused),
what the hardware does fast (`fast_bf16`, `linear_kernel`), which device a name means
(`resolve_device`), which dtype numbers read from a model are computed in (`wide`), and how
many threads a CPU that other work keeps busy has room for (`shared_threads`).

PyTorch's CPU allocator calls malloc and free directly; it caches nothing (its CUDA
allocator does). glibc serves blocks of 128 KiB and more with mmap and unmaps them on free;
it raises that threshold as large blocks are freed, but it also gives the top of its heap
back to the kernel whenever more than twice the threshold lies free there. Code that
allocates and frees large activations in turn therefore keeps getting fresh zeroed pages,
one page fault per 4 KiB on first touch: the explicit attention path's (B, nh, T, T) scores
and weights followed by the fused path took thousands of page faults per round
(tests/model/test_runtime.py counts them), and the explicit forward ran markedly slower than
with the memory reused (docs/performance.md#freed-memory). `reuse_freed_memory` has
glibc serve blocks up to 32 MiB from its heap and keep up to 1 GiB of freed memory for the
next allocation. jemalloc or tcmalloc through LD_PRELOAD do the same job, beyond 32 MiB too.
Larger tensors that a traced forward keeps (scores, weights, logits) come from `kept_empty`,
whose freed buffers serve the next trace (the CUDA allocator's caching, for those alone).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.util
import math
import os
import platform
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor

# mallopt parameters, from glibc's malloc.h
_M_TRIM_THRESHOLD = -1  # free memory at the top of the heap kept before giving it back
_M_MMAP_THRESHOLD = -3  # smallest block served by mmap (fixed once set: no dynamic rise)
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for it on 64-bit systems
_TRIM_THRESHOLD = 1 << 30


def reuse_freed_memory() -> bool:
    """Make glibc reuse freed blocks of up to 32 MiB; True if applied (Linux with glibc).

    Process-wide and meant for programs (the attnlab CLI and benchmarks call it at start),
    not for a library import. Does nothing, and returns False, on other C libraries.
    """
    if not _glibc():
        return False
    libc = _libc()
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )


def trim_heap() -> bool:
    """Give the heap's free pages back to the kernel (glibc's malloc_trim), which keeps up to
    `_TRIM_THRESHOLD` of them once `reuse_freed_memory` ran; True if applied (Linux with
    glibc). The benchmarks call it before measuring a call's peak memory."""
    if not _glibc():
        return False
    _libc().malloc_trim(0)  # returns whether it freed any: 0 is no failure
    return True


_HUGE_PAGE = 2 << 20  # x86-64 transparent huge page
_MADV_HUGEPAGE = 14


def advise_huge_pages(tensor: Tensor) -> Tensor:
    """Ask the kernel to back `tensor`'s untouched memory with 2 MiB pages; returns it.

    A fresh tensor of many MiB that is kept (a trace's (B, nh, T, S) weights) takes one page
    fault per 4 KiB when first written, which can take as long as the softmax that fills it
    (docs/performance.md#kept-buffers). With transparent huge pages in "madvise" mode (the
    Debian default) the same memory takes one fault per 2 MiB. Only whole 2 MiB pages inside
    the tensor are advised; elsewhere (other systems, small tensors) this does nothing.
    """
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes < 4 * _HUGE_PAGE or tensor.device.type != "cpu" or platform.system() != "Linux":
        return tensor
    start = -(-tensor.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
    end = (tensor.data_ptr() + nbytes) // _HUGE_PAGE * _HUGE_PAGE
    _libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_HUGEPAGE)
    return tensor


def kept_out(shape: tuple[int, ...], *inputs: Tensor) -> Tensor | None:
    """Uninitialised memory of `shape` (inputs[0]'s dtype) for an op's `out=`: a kept buffer
    (`kept_empty`), advised for huge pages when fresh; None where the op should allocate its
    result itself: autograd records one of `inputs` (`out=` is not differentiable), autocast
    picks the result's dtype, or they are not on the CPU."""
    like = inputs[0]
    if like.device.type != "cpu" or torch.is_autocast_enabled("cpu") or (
            torch.is_grad_enabled() and any(t.requires_grad for t in inputs)):
        return None
    return kept_empty(shape, like)


_ALIGN = 64  # bytes: torch's own CPU alignment (whole cache lines for the BLAS)


class _KeptBuffers:
    """CPU buffers of many MiB that were freed, kept (up to `limit` bytes, the oldest
    dropped first) for the next request of the same size.

    Why: torch's CPU allocator caches nothing and glibc unmaps blocks over 32 MiB on free, so
    without them every traced forward would write its (B, nh, T, S) scores and weights and its
    logits into fresh pages, and filling fresh pages costs many times what writing into
    reused ones does, more on a VM whose host reclaims freed memory
    (docs/performance.md#kept-buffers). A buffer is a numpy array, the owner of the
    tensor's memory: it comes back when the last tensor or view on that memory is gone
    (`weakref.finalize` on the array the storage holds), never while anything can read it.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit  # None: `_keep_limit()`, read at the first free
        self.free: list[np.ndarray] = []  # oldest first
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> tuple[np.ndarray, bool]:
        """(a buffer of nbytes + _ALIGN bytes, whether it is fresh)."""
        with self.lock:
            for i in range(len(self.free) - 1, -1, -1):
                if self.free[i].nbytes == nbytes + _ALIGN:
                    return self.free.pop(i), False
        return np.empty(nbytes + _ALIGN, dtype=np.uint8), True

    def give(self, buffer: np.ndarray) -> None:
        with self.lock:
            if self.limit is None:
                self.limit = _keep_limit()
            self.free.append(buffer)
            while self.free and sum(b.nbytes for b in self.free) > self.limit:
                self.free.pop(0)

    def release(self) -> int:
        with self.lock:
            freed = sum(b.nbytes for b in self.free)
            self.free.clear()
        return freed


def _keep_limit() -> int:
    """2 GiB, about what a full trace of GPT-2 small at T=1024 keeps
    (docs/performance.md#kept-buffers), at most an 8th of RAM."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not POSIX
        ram = 16 << 30
    return min(2 << 30, ram // 8)


_kept = _KeptBuffers()


_KEEP_MIN = 4 << 20  # bytes; glibc reuses smaller blocks itself (after reuse_freed_memory)


def kept_empty(shape: tuple[int, ...], like: Tensor) -> Tensor:
    """Uninitialised memory of `shape` with `like`'s dtype and device. On the CPU, from 4 MiB:
    a buffer freed by an earlier call when one of the same size is kept (no page faults),
    else fresh memory advised for huge pages. Freed buffers up to 2 GiB (at most an 8th of
    the RAM) stay with the process; `release_kept_memory` hands them back."""
    nbytes = math.prod(shape) * like.element_size()
    if like.device.type != "cpu" or nbytes < _KEEP_MIN:
        return like.new_empty(shape)
    buffer, fresh = _kept.take(nbytes)
    skip = -buffer.ctypes.data % _ALIGN
    owner = buffer[skip:skip + nbytes]  # the array the tensor's storage keeps alive
    weakref.finalize(owner, _kept.give, buffer).atexit = False
    tensor = torch.from_numpy(owner).view(like.dtype).view(shape)
    return advise_huge_pages(tensor) if fresh else tensor


def release_kept_memory() -> int:
    """Free the buffers `kept_empty` keeps for reuse (a trace's scores and weights, a long
    forward's logits, after they are gone); returns the bytes freed. Like
    `torch.cuda.empty_cache()`: memory in use is not touched."""
    return _kept.release()


def _glibc() -> bool:
    """Whether this process runs on Linux with glibc (mallopt, malloc_trim)."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def fast_bf16() -> bool:
    """bf16 matmuls in hardware: a CUDA GPU that has them, or a CPU with AVX512-BF16/AMX."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    # private but stable helpers (torch 2.1+); without these units bf16 is emulated and slow
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


class SlowBF16Warning(UserWarning):
    """bfloat16 asked for on a CPU that emulates it (benchmarks that measure it filter this)."""


def warn_if_slow_bf16(dtype: str | torch.dtype, device: str | torch.device) -> None:
    """A UserWarning when bfloat16 would run emulated on this CPU, where it trains several
    times slower than float32 (docs/performance.md#emulated-bfloat16)."""
    if str(dtype).removeprefix("torch.") != "bfloat16" or torch.device(device).type != "cpu":
        return
    if not fast_bf16():
        warnings.warn("this CPU has no bfloat16 units (AVX512-BF16 or AMX), so bfloat16 is "
                      "emulated and runs several times slower than float32; use float32",
                      SlowBF16Warning, stacklevel=3)


#: float32 products under this many multiply-adds (rows x in x out) stay with BLAS: a oneDNN
#: call has a fixed cost that small products do not win back
#: (docs/performance.md#linear-kernel).
ONEDNN_MIN_MACS = 1 << 24
LINEAR_KERNELS = ("onednn", "blas")
_linear: list[str] = []  # the chosen kernel, once chosen


def linear_kernel() -> str:
    """Which kernel runs attnlab's float32 CPU linear layers without autograd
    (`layers.Linear`): "onednn" (`torch.ops.mkldnn._linear_pointwise`) or "blas" (F.linear,
    MKL in PyTorch's x86 builds).

    The environment variable ATTNLAB_LINEAR picks one; unset or "auto", oneDNN runs on AMD
    x86-64 CPUs with AVX-512 (Zen 4 on), where MKL keeps to kernels that leave speed unused:
    GPT-2 small's block products run faster through oneDNN there, and so do the forward and
    a trace. On AMD CPUs without AVX-512 (Zen 3) oneDNN ran them slower than MKL, and Intel
    CPUs keep MKL, Intel's own library (oneDNN was the slower on a Xeon with AMX too): see
    docs/performance.md#linear-kernel. The head's 512-column blocks (`gpt.unembed`) stay
    with BLAS: they are not dense matrices, which oneDNN multiplies with a slow reference
    kernel. The two kernels sum in different orders, so results differ by float32 rounding
    (the figures are in the same section).
    """
    if not _linear:
        set_linear_kernel(os.environ.get("ATTNLAB_LINEAR", "auto"))
    return _linear[0]


def set_linear_kernel(kernel: str) -> str:
    """Choose `linear_kernel` for this process: "onednn", "blas" or "auto"; returns the
    kernel chosen ("auto": oneDNN on AMD x86-64 CPUs with AVX-512 where PyTorch has it, else
    BLAS)."""
    if kernel not in (*LINEAR_KERNELS, "auto"):
        raise ValueError(f"linear kernel {kernel!r} (ATTNLAB_LINEAR?) must be one of "
                         f"{[*LINEAR_KERNELS, 'auto']}")
    if kernel == "onednn" and not torch.backends.mkldnn.is_available():
        raise ValueError("linear kernel 'onednn': this PyTorch build has no oneDNN "
                         "(torch.backends.mkldnn.is_available() is False); use 'blas'")
    if kernel == "auto":
        fast = torch.backends.cpu.get_cpu_capability() == "AVX512"  # "AVX2" on Zen 3
        kernel = ("onednn" if torch.backends.mkldnn.is_available() and _amd_x86() and fast
                  else "blas")
    _linear[:] = [kernel]
    return kernel


def _amd_x86() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        with open("/proc/cpuinfo") as info:
            return any(line.startswith("vendor_id") and "AuthenticAMD" in line
                       for line in info)
    except OSError:  # not Linux
        return False


def triton_importable() -> bool:
    """Whether triton is installed (found without importing it): attnlab's GPU kernels
    (`summary_kernels`, `tf32x3`) need it, attnlab does not depend on it."""
    return importlib.util.find_spec("triton") is not None


def wide(dtype: torch.dtype) -> torch.dtype:
    """What logits, attention summaries and the numbers read from them are computed in:
    float32 for bfloat16 and float16, a float64 model's own dtype (float32 would round its
    values to ~7 digits)."""
    return torch.promote_types(dtype, torch.float32)


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """auto -> cuda:LOCAL_RANK when CUDA is there, else cpu; anything else as torch reads it."""
    if name == "auto":
        name = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"device={name!r} is not a device ({err}); use auto, cpu, cuda, "
                         "cuda:N or mps") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but CUDA is not available here; use 'cpu' "
                         "(--device cpu)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={name!r} but MPS is not available here; use 'cpu' "
                         "(--device cpu)")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device


def busy_cores(interval: float = 0.1) -> float | None:
    """How many of the machine's cores other work kept busy over `interval` seconds, which
    this process sleeps through, from /proc/stat's counters; None where there is no such
    file (not Linux) or it says nothing."""

    def counters() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as stat:  # "cpu user nice system idle ..."
            ticks = [int(v) for v in stat.readline().split()[1:9]]
        return sum(ticks), ticks[3] + ticks[4]  # all, idle + waiting on I/O

    try:
        total, idle = counters()
        time.sleep(interval)
        total_after, idle_after = counters()
    except (OSError, ValueError, IndexError):
        return None
    if total_after <= total:
        return None
    return (os.cpu_count() or 1) * (1 - (idle_after - idle) / (total_after - total))


def shared_threads(threads: int, busy: float, cores: int) -> int:
    """torch's `threads` scaled to the share of the `cores` that other work leaves idle
    (`busy` of them taken), at least 1: threads beyond the cores left wait on each other at
    every parallel step (a training run beside another took 180 times as long on two cores:
    docs/performance.md#threads-on-a-shared-cpu)."""
    idle = max(0.0, min(1.0, 1 - busy / cores))
    return max(1, min(threads, round(threads * idle)))


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread for the block, the caller's thread count after it: tiny models
    run faster without hand-offs between threads, and benchmarks time CPU time on one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def quiet_compile() -> Iterator[None]:
    """Hide two warnings torch gives on a compiled function's first call, where nothing
    is wrong: Inductor's CUDA-graph trees open their memory pool with an empty capture, and
    Dynamo reads `.grad` of a non-leaf input (a compiled block's input is the activation
    before it) while it builds the graph."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty", category=UserWarning)
        warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not "
                                "a leaf Tensor is being accessed", category=UserWarning)
        yield


def check_float16_weights(model: Any) -> None:
    """Raise unless the GPT `model` can stream float16 weights (`decode.half_weights`):
    float32 on the CPU, fbgemm built in."""
    weight = model.lm_head.weight
    if weight.device.type != "cpu":
        raise ValueError(
            f"float16 weights are a CPU path (fbgemm) and the model is on {weight.device}; "
            "on a GPU cast the model instead (--dtype bfloat16, model.to(torch.bfloat16))"
        )
    if weight.dtype != torch.float32:
        raise ValueError(
            f"float16 weights need a float32 model (the arithmetic stays float32), not "
            f"{weight.dtype}; drop the cast (--dtype float32)"
        )
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        raise ValueError(
            "this PyTorch build has no fbgemm, the kernel behind float16 weights (x86 CPUs "
            "only); keep float32 weights"
        )
