"""Training throughput: attnlab's training step vs nanoGPT's, tokens/s, on identical shapes.

Both train the same shape (nanoGPT's shakespeare_char CPU recipe: 4 layers, 4 heads, 128
dims, context 64, batch 12, vocab 65) on the same token array, in one process, one step of
each variant per round, rounds alternating. attnlab's step is `train.py`'s loop body (batch,
autocast, forward, backward, `float(loss)`, clip, AdamW step, zero_grad) on `GPT` and
`make_optimizer`; the baseline is `nanogpt_baseline.py`. Levers measured one at a time:
bf16 autocast, torch.compile, fused AdamW, and the torch thread count. Model FLOPs
utilisation is against this machine's fp32 and bf16 `torch.mm` peak, measured in the run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.model.gpt import GPT, GPTConfig
from attnlab.model.runtime import fast_bf16
from attnlab.tokenizers import get_tokenizer
from attnlab.train.data import TextDataset
from attnlab.train.loop import TrainConfig, make_optimizer

from . import nanogpt_baseline as nano
from .common import alternate, machine, matmul_peak_gflops, table

# nanoGPT's shape and its exact GELU (nn.GELU()), so both sides compute the same function
SHAPE = dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, gelu="exact")
BATCH = 12
TARGET = 1.5


@dataclass(frozen=True)
class Lever:
    """One attnlab variant: TrainConfig changes plus changes train.py cannot express yet."""

    config: dict[str, Any] = field(default_factory=dict)
    fused_adamw: bool = False  # AdamW(fused=True) instead of foreach=True
    explicit_attention: bool = False  # model(x, y, fused=False): attend's explicit path


BF16 = {"dtype": "bfloat16"}
LEVERS: dict[str, Lever] = {
    "attnlab fp32": Lever(),
    "attnlab bf16": Lever(BF16),
    "attnlab fp32 fused AdamW": Lever(fused_adamw=True),
    "attnlab bf16 fused AdamW": Lever(BF16, fused_adamw=True),
    "attnlab fp32 explicit attn": Lever(explicit_attention=True),
    "attnlab bf16 explicit attn": Lever(BF16, explicit_attention=True),
    "attnlab bf16 explicit attn fused AdamW": Lever(BF16, True, True),
    "attnlab compile fp32": Lever({"compile": True}),
    "attnlab compile bf16 explicit attn fused AdamW": Lever({**BF16, "compile": True}, True, True),
}
BEST = "attnlab bf16 explicit attn fused AdamW"  # the fastest lever set without compile
QUICK_LEVERS = ("attnlab fp32", BEST)
# at thread counts other than 1
OTHER_THREADS_LEVERS = ("attnlab fp32", "attnlab bf16", BEST,
                        "attnlab compile bf16 explicit attn fused AdamW")


def mfu_peak(variant: str) -> str:
    """The peak a variant's MFU is against: bf16's where the CPU has bf16 units; elsewhere
    fp32's (an emulated bf16 mm measured 1 GFLOP/s on an EPYC without them: MFU 279%)."""
    return "bf16" if "bf16" in variant and fast_bf16() else "fp32"


def token_array(n: int, vocab: int, seed: int = 0) -> np.ndarray:
    """Random ids standing in for a text: step time does not depend on which tokens."""
    return np.random.default_rng(seed).integers(0, vocab, n, dtype=np.uint16)


def flops_per_token(config: GPTConfig, num_params: int) -> float:
    """6N + 12 L C T, the PaLM paper's appendix B estimate (as nanoGPT's estimate_mfu)."""
    return 6 * num_params + 12 * config.n_layer * config.n_embd * config.block_size


def attnlab_step(
    model_config: GPTConfig, config: TrainConfig, ids: np.ndarray, lever: Lever = Lever()
) -> tuple[Callable[[], float], GPT]:
    """One step of `attnlab.train.loop.train`'s loop, as a closure (grad_accum=1, one process).

    Left out: the per-step append of a JSON line to metrics.jsonl (tens of microseconds).
    """
    torch.manual_seed(config.seed)
    model = GPT(model_config)
    optimizer = make_optimizer(model, config)
    if lever.fused_adamw:  # make_optimizer's groups, with fused=True instead of foreach=True
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]}
                  for g in optimizer.param_groups]
        optimizer = torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, config.beta2),
                                      fused=True)
    forward: Callable[..., Any] = model
    if lever.explicit_attention:
        forward = functools.partial(model, fused=False)
    step_fn = torch.compile(forward) if config.compile else forward
    model.train()
    tok = get_tokenizer("char", "".join(chr(32 + i) for i in range(model_config.vocab_size)))
    half = len(ids) // 2
    dataset = TextDataset("bench", tok, ids[:half], ids[half:])
    gen = torch.Generator().manual_seed(config.seed)
    seq_len = model_config.block_size

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.dtype == "bfloat16")
    steps = 0

    def step() -> float:
        nonlocal steps
        for group in optimizer.param_groups:
            group["lr"] = config.lr_at(steps)
        steps += 1
        x, y = dataset.batch("train", config.batch_size, seq_len, gen)
        with autocast:
            loss = step_fn(x, y).loss
        assert loss is not None
        loss.backward()
        loss_value = float(loss.detach())
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss_value

    return step, model


def baseline_step(model_config: GPTConfig, ids: np.ndarray, batch: int) -> Callable[[], float]:
    torch.manual_seed(1337)
    c = model_config
    model = nano.NanoGPT(c.vocab_size, c.block_size, c.n_layer, c.n_head, c.n_embd)
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99))
    model.train()
    return lambda: nano.train_step(model, optimizer, ids, batch, c.block_size)


def run(
    quick: bool = False,
    *,
    shape: dict[str, Any] | None = None,
    batch: int = BATCH,
    levers: tuple[str, ...] | None = None,
    threads: tuple[int, ...] | None = None,
    rounds: int | None = None,
    passive_wait: bool | None = None,
) -> dict[str, Any]:
    """passive_wait (default: not quick) adds a 2-thread run in a fresh process with
    OMP_WAIT_POLICY=PASSIVE (it only takes effect at process start)."""
    model_config = GPTConfig(**(shape or SHAPE))
    levers = levers or (QUICK_LEVERS if quick else tuple(LEVERS))
    threads = threads or ((1,) if quick else (1, 2))
    unknown = sorted(set(levers) - set(LEVERS))
    if unknown:
        raise ValueError(f"unknown levers {unknown}; known: {sorted(LEVERS)}")
    rounds = rounds or (3 if quick else 12)
    inner = 1 if quick else 3
    ids = token_array(100_000 if quick else 1_000_000, model_config.vocab_size)
    tokens_per_step = batch * model_config.block_size
    records, peaks, num_params = measure(model_config, ids, batch, levers, threads,
                                         rounds=rounds, inner=inner, quick=quick)
    fpt = flops_per_token(model_config, num_params)
    against_baseline(records, peaks, tokens_per_step, fpt)
    if passive_wait if passive_wait is not None else not quick:
        records += passive_wait_records(levers=[BEST], threads=[2], rounds=rounds, batch=batch,
                                        shape=model_config.to_dict(), passive_wait=False)
    against_best_baseline(records)
    rows = table_rows(records)
    best, best_at = best_variants(records, threads)
    met = best["x_best_baseline"] >= TARGET
    notes = [
        shape_note(model_config, batch, num_params, fpt, rounds, inner),
        peak_note(peaks, _peak_size(quick)),
        f"best overall: {best['variant']} at {best['threads']} thread(s), "
        f"{best['x_best_baseline']:.2f}x the baseline's best tokens/s at any thread count "
        f"(target {TARGET}x: {'met' if met else 'missed'}). Best at each thread count: "
        + "; ".join(f"{n}: {r['variant']}, {r['x_baseline']:.2f}x" for n, r in best_at.items())
        + ".",
    ]
    return {
        "suite": "train",
        "machine": machine(),
        "config": {"model": model_config.to_dict(), "batch": batch, "threads": threads},
        "peaks_gflops": peaks,
        "flops_per_token": fpt,
        "records": records,
        "target_met": met,
        "best_per_threads": {n: {"variant": r["variant"], "x_baseline": r["x_baseline"]}
                             for n, r in best_at.items()},
        "tables": [table(
            "Training step (median)",
            ["variant", "threads", "ms/step", "tokens/s", "x baseline", "CPU ms/step",
             "x baseline (CPU time)", "MFU"],
            rows,
        )],
        "notes": notes,
    }


def _peak_size(quick: bool) -> int:
    """The side of the square torch.mm that measures the peak: small in a quick run."""
    return 256 if quick else 1024


def measure(
    model_config: GPTConfig, ids: np.ndarray, batch: int, levers: tuple[str, ...],
    threads: tuple[int, ...], *, rounds: int, inner: int, quick: bool,
) -> tuple[list[dict[str, Any]], dict[str, dict[int, float]], int]:
    """(one record per variant and thread count, the matmul peaks per dtype and thread count,
    the model's parameter count); torch's thread count is restored after."""
    tokens_per_step = batch * model_config.block_size
    base_config = TrainConfig(batch_size=batch)
    restore_threads = torch.get_num_threads()
    records: list[dict[str, Any]] = []
    peaks: dict[str, dict[int, float]] = {"fp32": {}, "bf16": {}}
    num_params = 0
    try:
        for n in threads:  # one block per thread count: switching per call is not free
            torch.set_num_threads(n)
            # peak before and after the steps, best of both: a burst of load from another
            # process during one of them must not pass for this machine's peak
            before = matmul_peaks(_peak_size(quick))
            variants: dict[str, Callable[[], object]] = {
                "nanoGPT baseline": baseline_step(model_config, ids, batch)
            }
            for name in levers if n == 1 else [x for x in levers if x in OTHER_THREADS_LEVERS]:
                lever = LEVERS[name]
                config = dataclasses.replace(base_config, **lever.config)
                variants[name], model = attnlab_step(model_config, config, ids, lever)
                num_params = model.num_params()
            times = alternate(variants, rounds=rounds, warmup=1 if quick else 3, inner=inner)
            records += [step_record(name, n, t, tokens_per_step) for name, t in times.items()]
            after = matmul_peaks(_peak_size(quick))
            for key in peaks:
                peaks[key][n] = max(before[key], after[key])
    finally:
        torch.set_num_threads(restore_threads)
    return records, peaks, num_params


def matmul_peaks(size: int) -> dict[str, float]:
    """This machine's fp32 and bf16 torch.mm GFLOP/s at the current thread count, the peaks
    MFU is measured against."""
    return {"fp32": matmul_peak_gflops(torch.float32, size),
            "bf16": matmul_peak_gflops(torch.bfloat16, size)}


def step_record(name: str, n: int, t: dict[str, list[float]],
                tokens_per_step: int) -> dict[str, Any]:
    """A variant's record at n threads from its per-round times: medians, in ms and tokens/s."""
    wall, cpu = statistics.median(t["wall"]), statistics.median(t["cpu"])
    return {"variant": name, "threads": n, "ms_per_step": wall * 1e3,
            "cpu_ms_per_step": cpu * 1e3, "tokens_per_s": tokens_per_step / wall}


def against_baseline(records: list[dict[str, Any]], peaks: dict[str, dict[int, float]],
                     tokens_per_step: int, fpt: float) -> None:
    """Add to each record its speed over the baseline at the same thread count (wall and CPU
    time) and its model FLOPs utilisation against the peak `mfu_peak` picks."""
    base = {r["threads"]: r for r in records if r["variant"] == "nanoGPT baseline"}
    for r in records:
        same = base[r["threads"]]
        r["x_baseline"] = r["tokens_per_s"] / same["tokens_per_s"]
        r["x_baseline_cpu"] = same["cpu_ms_per_step"] / r["cpu_ms_per_step"]
        # one thread: per CPU-second, like its peak (common.matmul_peak_gflops); else wall
        seconds = r["cpu_ms_per_step"] / 1e3 if r["threads"] == 1 else r["ms_per_step"] / 1e3
        gflops = tokens_per_step / seconds * fpt / 1e9
        r["mfu"] = gflops / peaks[mfu_peak(r["variant"])][r["threads"]]


def against_best_baseline(records: list[dict[str, Any]]) -> None:
    """Add to each record x_best_baseline: its tokens/s over the baseline's best at any
    thread count (the PASSIVE run's baseline included)."""
    best_base = max(r["tokens_per_s"] for r in records
                    if r["variant"].startswith("nanoGPT baseline"))
    for r in records:
        r["x_best_baseline"] = r["tokens_per_s"] / best_base


def table_rows(records: list[dict[str, Any]]) -> list[list[Any]]:
    """The table's rows, one per record."""
    return [[r["variant"], r["threads"], r["ms_per_step"], r["tokens_per_s"], r["x_baseline"],
             r["cpu_ms_per_step"], r["x_baseline_cpu"], f"{100 * r['mfu']:.1f}%"]
            for r in records]


def best_variants(records: list[dict[str, Any]], threads: tuple[int, ...]
                  ) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """attnlab's best record against the baseline's best anywhere, and its best at each
    thread count against the baseline beside it."""
    ours = [r for r in records if not r["variant"].startswith("nanoGPT baseline")]
    best = max(ours, key=lambda r: r["x_best_baseline"])
    # per thread count, in this process: the best variant against the baseline beside it
    best_at = {n: max((r for r in ours if r["threads"] == n and "PASSIVE" not in r["variant"]),
                      key=lambda r: r["x_baseline"]) for n in threads}
    return best, best_at


def shape_note(model_config: GPTConfig, batch: int, num_params: int, fpt: float, rounds: int,
               inner: int) -> str:
    """The note that says what was trained and how the medians were taken."""
    return (
        f"{model_config.n_layer} layers, {model_config.n_head} heads, {model_config.n_embd} "
        f"dims, context {model_config.block_size}, batch {batch}, vocab "
        f"{model_config.vocab_size}: {num_params:,} parameters, {fpt / 1e6:.2f} MFLOP/token. "
        f"Medians of {rounds} alternating rounds of {inner} step(s); CPU ms is this "
        "process's CPU time per step (with 2 threads it counts both).")


def peak_note(peaks: dict[str, dict[int, float]], size: int) -> str:
    """The note that gives the matmul peaks and which one each variant's MFU is against."""
    return (
        f"matmul peak (GFLOP/s, best torch.mm {size}^3): " + ", ".join(
            f"{k} {n} thread(s) {v:.0f}" for k, d in peaks.items() for n, v in d.items()
        ) + (". MFU of bf16 variants is against the bf16 peak" if fast_bf16() else
             ". This CPU emulates bfloat16 (no AVX512-BF16 or AMX), so the MFU of every variant "
             "is against the fp32 peak") + "; with one thread both the peak and the step are "
        "timed in CPU time, so load from other processes cancels out.")


def passive_wait_records(**run_kwargs: Any) -> list[dict[str, Any]]:
    """`run(**run_kwargs)` records from a fresh process with OMP_WAIT_POLICY=PASSIVE.

    By default OpenMP threads spin while they wait for work; when other processes hold the
    cores, a spinning thread burns the time slice its partner needs. PASSIVE makes them sleep.
    """
    code = ("import json, sys\nfrom benchmarks.train_step import run\n"
            "print(json.dumps(run(**json.loads(sys.argv[1]))['records']))")
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(run_kwargs)], capture_output=True, text=True,
        cwd=Path(__file__).resolve().parents[1], timeout=1800,
        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"OMP_WAIT_POLICY=PASSIVE run failed:\n{proc.stderr[-2000:]}")
    records: list[dict[str, Any]] = json.loads(proc.stdout.strip().splitlines()[-1])
    for r in records:
        r["variant"] += " (OMP_WAIT_POLICY=PASSIVE)"
    return records
