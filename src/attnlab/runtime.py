"""Process-wide CPU settings that attnlab's commands apply: how freed memory is reused.

PyTorch's CPU allocator calls malloc and free directly; it caches nothing (its CUDA
allocator does). glibc serves a block of 128 KiB or more with mmap and hands it back to
the kernel with munmap on free. Its threshold then rises to the size of the freed block,
but a block of exactly that size is still mmapped, so a loop that allocates the same
activation shapes every step gets fresh pages every step and pays a page fault per 4 KiB
on first touch. On the 2-core machine of the benchmarks this made the explicit attention
path (two (B, nh, T, T) tensors per call, 8 MB each at B=8, nh=4, T=256) 2.2x slower
than with the memory reused (`python -m benchmarks attention`, 8.7 ms vs 3.9 ms forward).
`reuse_freed_memory` tells glibc to serve blocks up to 32 MiB from its heap and to keep
freed memory for the next allocation. Peak RSS stays the same: the process holds what it
held at its peak anyway. jemalloc or tcmalloc through LD_PRELOAD does the same job and
also covers blocks above 32 MiB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

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
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )
