"""Where the time goes on a GPU (issue 33, item 4): a `torch.profiler` look at four calls.

GPT-2 small with random weights: a traced forward (every layer's attention weights,
`Trace.run`, float32, T=1024) beside the fused forward, and one decode step (bfloat16, batch 1,
after a 16-token prompt) eager (`DecodeStep`) beside the compiled one
(`model/compiled_decode.py`, a CUDA graph replay). Each call runs `ITERATIONS` times under
the profiler after a warmup; per call the table gives:

- kernels: GPU kernels launched (CUDA events of the profile);
- GPU ms: the summed time of those kernels (busy time, not wall time);
- launch ms: CPU time in the CUDA runtime's launch calls (cudaLaunchKernel and kin, and
  cudaGraphLaunch);
- wall ms: the call's wall time, synchronised.

A call whose wall time is far above its GPU time and near its launch time is bound by the
CPU issuing kernels (what a CUDA graph removes); one whose GPU time is near its wall time is
bound by the GPU. On a CPU (`--smoke --device cpu`) there are no kernels: the rows count
the aten ops and their CPU time instead.

    python -m benchmarks.gpu_profile [--smoke [--device cpu]] [--out FILE]
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from attnlab.generate import prefill
from attnlab.model.compiled_decode import compiled_decode
from attnlab.model.decode import decode_step
from attnlab.model.trace import Trace

from . import decode
from .common import table
from .gpu_common import gpu_machine, pick_device, skipped, suite_main, sync, write_partial

ITERATIONS = 5
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
            "cudaGraphLaunch", "cudaMemcpyAsync", "cudaMemsetAsync")


def calls(shape: str, T: int, device: torch.device) -> dict[str, Callable[[], Any]]:
    """name -> one call to profile (models built here, warm after their first call)."""
    _, model = decode.build_pair(shape, block_size=1024)
    model = model.to(device)
    ids = torch.randint(0, model.config.vocab_size, (1, T),
                        generator=torch.Generator().manual_seed(1)).to(device)

    @torch.inference_mode()
    def traced() -> Any:
        return Trace(names="attn_weights").run(model, ids)

    @torch.inference_mode()
    def forward() -> Any:
        return model(ids)

    half = copy.deepcopy(model).to(torch.bfloat16)
    prompt = ids[:, :16]
    steps = _decode_steps(half, prompt)
    return {"traced forward: attn_weights (Trace.run), float32": traced,
            "fused forward, float32": forward, **steps}


def _decode_steps(model: Any, prompt: torch.Tensor) -> dict[str, Callable[[], Any]]:
    """One eager and one compiled decode step, each rewinding its cache to the prompt so
    every call decodes the same position."""
    step = decode_step(model)
    P = prompt.shape[1]
    eager_cache = model.new_cache(1, P + 8)
    compiled = compiled_decode(model, 1, P + 8)
    with torch.inference_mode():
        token = prefill(model, prompt, None, eager_cache).argmax(-1, keepdim=True)  # (1, 1)
        prefill(model, prompt, None, compiled.cache)
        compiled.start(None)

    @torch.inference_mode()
    def eager() -> Any:
        eager_cache.seq_len = P
        return step(token, None, eager_cache)

    def graphed() -> Any:
        compiled.cache.seq_len = P
        return compiled(step, token)

    return {"decode step, eager, bfloat16": eager,
            "decode step, compiled (CUDA graph), bfloat16": graphed}


def summarise(fn: Callable[[], Any], device: torch.device) -> dict[str, Any]:
    """Profile ITERATIONS calls after two warmups; per-call kernel count, GPU, launch, wall."""
    for _ in range(2):
        fn()
    sync(device)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(ITERATIONS):
            fn()
        sync(device)
        wall = (time.perf_counter() - start) / ITERATIONS * 1e3
    events = list(prof.events())
    if cuda:
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        gpu_us = sum(e.device_time_total for e in kernels)
    else:  # no kernels: aten ops and their own CPU time stand in
        kernels = [e for e in events if e.name.startswith("aten::")]
        gpu_us = sum(e.self_cpu_time_total for e in kernels)
    launch_us = sum(e.cpu_time_total for e in events if e.name in LAUNCHES)
    return {"kernels": len(kernels) / ITERATIONS, "gpu_ms": gpu_us / 1e3 / ITERATIONS,
            "launch_ms": launch_us / 1e3 / ITERATIONS if cuda else None, "wall_ms": wall}


def run(quick: bool = False, device: str | None = None, out: Path | None = None
        ) -> dict[str, Any]:
    """Profile the four calls; quick: the toy shape at T=32 (a smoke test)."""
    where = pick_device(device)
    if where is None:
        return skipped("gpu_profile")
    shape, T = ("toy", 32) if quick else ("gpt2", 1024)
    fns = calls(shape, T, where)
    rows = {name: summarise(fn, where) for name, fn in fns.items()}
    m = gpu_machine(where)
    cuda = where.type == "cuda"
    result = {
        "suite": "gpu_profile", "machine": m, "shape": shape, "T": T, "rows": rows,
        "tables": [table(
            f"Where the time goes on a GPU ({shape}; per call, {ITERATIONS} profiled calls)",
            ["call", "kernels" if cuda else "aten ops", "GPU ms" if cuda else "op CPU ms",
             "launch ms (CPU)", "wall ms"],
            [[name, r["kernels"], r["gpu_ms"], r["launch_ms"], r["wall_ms"]]
             for name, r in rows.items()])],
        "notes": [
            f"{m.get('gpu') or 'no GPU: ' + str(where)}, torch {m['torch']}: GPU ms is "
            "kernel busy time summed; launch ms is CPU time inside the CUDA runtime's launch "
            "calls; wall ms is synchronised wall time per call (profiler overhead included).",
            *(["smoke run: tiny shapes, no CUDA: aten ops stand in for kernels"]
              if quick or not cuda else []),
        ],
    }
    write_partial(out, result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return suite_main(run, argv, "python -m benchmarks.gpu_profile", __doc__)


if __name__ == "__main__":
    sys.exit(main())
