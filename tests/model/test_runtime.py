"""model/runtime.py: after reuse_freed_memory, freed activations' pages serve the next ones."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
import torch

from attnlab.model import runtime

# The attention benchmark's pattern: the explicit path's two (B, nh, T, T) tensors (8 MiB
# each at B=8, nh=4, T=256), then the fused path, over and over. With glibc's defaults a
# process often takes ~4,000 page faults per round; each is a fresh zeroed 4 KiB page.
SCRIPT = """
import resource, sys, torch
from attnlab.model.attention import attend
from attnlab.model.masks import build_mask
from attnlab.model.runtime import reuse_freed_memory

applied = reuse_freed_memory() if sys.argv[1] == "reuse" else None
q, k, v = (torch.randn(8, 4, 256, 32) for _ in range(3))
mask = build_mask(256, 256)
def one_round():
    with torch.no_grad():
        attend(q, k, v, mask, fused=False)
        attend(q, k, v, mask, fused=True)
def page_faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    one_round()
faults = []
for _ in range(10):
    before = page_faults()
    one_round()
    faults.append(page_faults() - before)
print(applied, *faults)
"""


def faults_per_round(mode: str) -> tuple[str, list[int]]:
    """(whether reuse was applied, page faults of each of 10 rounds) in a fresh process with
    one malloc arena. With one arena per thread, a block freed in one thread's arena does
    not serve the next allocation made in another's: with reuse, 9 of 200 rounds took one
    8 MiB block's 2,048 faults that way (2026-11-29; a CI run under load took 2 of 10), and
    0 of 200 with MALLOC_ARENA_MAX=1. Which thread allocates is torch's, not attnlab's."""
    env = {**os.environ, "MALLOC_ARENA_MAX": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                         check=True, env=env).stdout.split()
    return out[0], [int(n) for n in out[1:]]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_blocks_are_reused_without_page_faults() -> None:
    applied, faults = faults_per_round("reuse")
    assert applied == "True"
    # 8 MiB of fresh pages is 2,048 faults; one round may still grow the heap once. With
    # glibc's defaults, 5 of 8 processes here faulted ~4,064 times in 7-10 of the rounds and
    # 3 in none (which thread frees first decides), so that is not asserted. Some heap
    # layouts take 256 faults (1 MiB) in a few rounds: far from 2,048 per 8 MiB block.
    assert sum(n > 512 for n in faults) <= 1, faults


TRIM_SCRIPT = """
from attnlab.model.runtime import reuse_freed_memory, trim_heap
import torch

def rss_mib():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmRSS:")) / 1024

reuse_freed_memory()
blocks = [torch.ones(2 << 20) for _ in range(32)]  # 32 x 8 MiB from the heap, touched
del blocks
kept = rss_mib()
print(trim_heap(), kept - rss_mib())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_trim_heap_gives_the_freed_pages_back() -> None:
    """reuse_freed_memory keeps freed heap pages (up to 1 GiB); trim_heap returns them."""
    out = subprocess.run([sys.executable, "-c", TRIM_SCRIPT], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "True"
    assert float(out[1]) > 200, out  # of the 256 MiB freed


HUGE_SCRIPT = """
import resource, sys, torch
from attnlab.model.runtime import advise_huge_pages

def faults_to_fill(advise):
    t = torch.empty(64 << 18)  # 64 MiB of float32, fresh from mmap
    if advise:
        assert advise_huge_pages(t) is t
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t.fill_(1.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

print(faults_to_fill(False), faults_to_fill(True))
"""


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "unavailable"


@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"),
                    reason="transparent huge pages are off or absent here")
def test_advised_memory_takes_far_fewer_page_faults() -> None:
    out = subprocess.run([sys.executable, "-c", HUGE_SCRIPT], capture_output=True, text=True,
                         check=True).stdout
    plain, advised = map(int, out.split())
    if _thp_mode() == "madvise":
        assert plain > 8_000  # one fault per 4 KiB page: 16,384 for 64 MiB
    assert advised < plain / 4  # one per 2 MiB page, plus the unaligned ends


def test_a_kept_buffer_comes_back_only_when_no_view_of_it_is_left() -> None:
    from attnlab.model import runtime
    runtime.release_kept_memory()
    like = torch.empty(0, dtype=torch.bfloat16)
    shape = (2, 4 << 20)  # 16 MiB of bfloat16
    t = runtime.kept_empty(shape, like)
    ptr = t.data_ptr()
    assert (t.shape, t.dtype, ptr % 64) == (shape, torch.bfloat16, 0)
    row = t[1]
    del t
    other = runtime.kept_empty(shape, like)  # `row` still reads the first buffer
    assert other.data_ptr() != ptr
    del row
    assert runtime.kept_empty(shape, like).data_ptr() == ptr  # now it is reused
    assert runtime.kept_empty((3,), like).untyped_storage().nbytes() == 6  # small: plain


def test_kept_buffers_stay_under_the_limit_and_are_released(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnlab.model import runtime
    runtime.release_kept_memory()
    monkeypatch.setattr(runtime._kept, "limit", 20 << 20)
    like = torch.empty(0)
    tensors = [runtime.kept_empty((2 << 20,), like) for _ in range(3)]  # 8 MiB each
    ptrs = [t.data_ptr() for t in tensors]
    del tensors  # freed in order: the oldest is dropped once 24 MiB would be kept
    assert runtime.release_kept_memory() == 2 * ((8 << 20) + 64)
    assert runtime.release_kept_memory() == 0
    assert runtime.kept_empty((2 << 20,), like).data_ptr() not in ptrs[1:]


def test_a_traced_forward_writes_the_weights_into_the_last_ones_memory() -> None:
    """After a trace is gone, the next one's (B, nh, T, S) weights reuse its buffer (fresh
    pages cost 10-40x the writes on a VM): 9 heads at T=1024 are 36 MiB, which glibc would
    unmap on free (mmap may hand back the same address, but as fresh pages)."""
    from attnlab.model import runtime
    from attnlab.model.gpt import GPT, GPTConfig
    from attnlab.model.trace import Trace

    runtime.release_kept_memory()
    model = GPT(GPTConfig(vocab_size=11, block_size=1024, n_layer=1, n_head=9, n_embd=36))
    ids = torch.zeros(1, 1024, dtype=torch.long)
    ptrs = []
    weights_bytes = 9 * 1024 * 1024 * 4
    for _ in range(2):
        trace = Trace(names=["attn_weights"])
        with torch.no_grad():
            model.eval()(ids, trace=trace)
        # the first trace's buffer taken by the second (the block scratch is back already)
        assert all(b.nbytes < weights_bytes for b in runtime._kept.free)
        ptrs.append(trace.get("attn_weights", 0).data_ptr())
        del trace
        (kept,) = [b for b in runtime._kept.free if b.nbytes >= weights_bytes]  # back now
        assert kept.ctypes.data <= ptrs[-1] < kept.ctypes.data + kept.nbytes
    assert ptrs[0] == ptrs[1]


def test_wide_is_float32_for_narrow_floats_and_keeps_float64() -> None:
    """The one dtype logits and attention summaries are read in (`runtime.wide`)."""
    for narrow in (torch.float16, torch.bfloat16, torch.float32):
        assert runtime.wide(narrow) == torch.float32
    assert runtime.wide(torch.float64) == torch.float64
