"""GPU per-head summaries at long context (issue 33, item 2): all five, every layer and head.

A Llama-3.2-1B-shaped model (16 layers, 32 query heads, 8 KV heads, 2048 wide, head_dim 64,
vocab 128256, tied) with random bfloat16 weights drawn on the GPU, batch 1, at 8,192 and
32,768 tokens. Side by side, each call synchronised, median of the rounds, and the peak of
`torch.cuda.max_memory_allocated` during one call after a reset:

- attnlab's fused forward (no trace; the last position's logits only): the yardstick;
- the same forward with a `Trace` of the five summary names (`attn_entropy`, `attn_sink`,
  `attn_received`, `attn_distance`, `attn_max`), which are computed in tiles, never the
  T x S weights;
  with each layer's context from the summaries' rows pass (`summary_kernels.ROWS_MAKE_CONTEXT`,
  on: one flash forward that also keeps the row sums);
- the same trace with `ROWS_MAKE_CONTEXT` off: each layer's context from SDPA's forward;
- the same trace with `summary_kernels.LSE_FROM_FORWARD` on: each layer's context and each
  row's lse from SDPA's kernel called by name, the row summaries from the given-lse pass;
- at 8,192 only: Hugging Face eager `output_attentions=True` (its base model, no head) on a
  model of the same shape (its own random weights): its time, or that it ran out of memory.

Targets: the summaries in at most 2x the fused forward's time, peak memory within 1.2x of its
peak. Where this checkout's `Trace` lacks the summary names, the rows say "names not
available" and the fused forward and Hugging Face rows still run.

    python -m benchmarks.gpu_summaries [--smoke [--device cpu]] [--out FILE]
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend

from attnlab import GPTConfig
from attnlab.hf import config_to_hf
from attnlab.model import summary_kernels
from attnlab.model.trace import NAMES, Trace

from .common import table
from .gpu_common import (
    cuda_ms,
    gpu_machine,
    hf_from_config,
    is_oom,
    median,
    peak_bytes,
    pick_device,
    random_gpt,
    reset_peak,
    skipped,
    suite_main,
    summary_flags,
    transformers_version,
    write_partial,
)

SUMMARIES = ("attn_entropy", "attn_sink", "attn_received", "attn_distance", "attn_max")
LLAMA_1B = GPTConfig(
    vocab_size=128256, block_size=131072, n_layer=16, n_head=32, n_kv_head=8, n_embd=2048,
    head_dim=64, d_ff=8192, pos="rope", rope_theta=500000.0, norm="rmsnorm", norm_eps=1e-5,
    mlp="swiglu", bias=False, tie_weights=True,
    rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
)
TOY = GPTConfig(vocab_size=97, block_size=512, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                head_dim=8, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False)
FORWARD, SUMMARY, HF_EAGER = ("attnlab fused forward (no trace)",
                              "attnlab forward + 5 summaries", "HF eager output_attentions")
#: the way the default took before `ROWS_MAKE_CONTEXT` was on (results recorded before
#: 2026-11-27 hold it, with the default row then SDPA's context)
ROWS_CONTEXT = "attnlab forward + 5 summaries, context from the rows pass"
SDPA_CONTEXT = "attnlab forward + 5 summaries, context from SDPA"
FORWARD_LSE = "attnlab forward + 5 summaries, lse from the forward"
#: the target keys' suffixes
WAYS = {SUMMARY: "", ROWS_CONTEXT: ", rows-pass context", SDPA_CONTEXT: ", SDPA's context",
        FORWARD_LSE: ", forward's lse"}
#: variant -> the `summary_kernels` flag it sets and its value (where this checkout has it)
FLAGS = {SDPA_CONTEXT: ("ROWS_MAKE_CONTEXT", False), FORWARD_LSE: ("LSE_FROM_FORWARD", True)}
TARGETS = {"time": 2.0, "memory": 1.2}


def hf_fields(c: GPTConfig) -> dict[str, Any]:
    """LlamaConfig fields of the same shape as `c` (attnlab's own export of the config)."""
    fields = config_to_hf(c)
    for key in ("architectures", "model_type"):
        fields.pop(key)
    return fields


def missing_names() -> list[str]:
    """The summary names this checkout's Trace does not know."""
    return [name for name in SUMMARIES if name not in NAMES]


def measure(fn: Any, device: torch.device, rounds: int) -> dict[str, Any]:
    """{"ms": median, "peak_bytes": peak of one call} or {"error": "out of memory"}."""
    try:
        fn()  # warmup
        reset_peak(device)
        fn()
        peak = peak_bytes(device)
        ms = median(cuda_ms(fn, device, rounds=rounds, warmup=0))
    except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
        if not is_oom(err):
            raise
        gc.collect()
        reset_peak(device)
        return {"error": "out of memory"}
    return {"ms": ms, "peak_bytes": peak}


def attnlab_rows(model: Any, T: int, device: torch.device, rounds: int) -> dict[str, Any]:
    """The fused forward and the summaries at T tokens."""
    ids = torch.randint(0, model.config.vocab_size, (1, T),
                        generator=torch.Generator().manual_seed(T)).to(device)

    @torch.inference_mode()
    def forward() -> None:
        model(ids, last_logits_only=True)

    @torch.inference_mode()
    def summaries() -> None:
        model(ids, trace=Trace(names=list(SUMMARIES)), last_logits_only=True)

    def flagged(flags: dict[str, Any]) -> Callable[[], None]:
        """summaries with `summary_kernels`' flags set meanwhile."""
        def call() -> None:
            with summary_flags(**flags):
                summaries()
        return call

    rows = {FORWARD: measure(forward, device, rounds)}
    missing = missing_names()
    rows[SUMMARY] = ({"error": f"names not available: {', '.join(missing)}"} if missing
                     else measure(summaries, device, rounds))
    for variant, (flag, value) in FLAGS.items():
        if not missing and hasattr(summary_kernels, flag):
            rows[variant] = measure(flagged({flag: value}), device, rounds)
    return rows


def sdpa_backend(config: GPTConfig, device: torch.device) -> str:
    """The kernel `F.scaled_dot_product_attention` picks for this shape's causal bfloat16
    attention on device (the fused forward's; `attend_with_lse` calls the same one)."""
    q = torch.zeros(1, config.n_head, 256, config.head_size, device=device,
                    dtype=torch.bfloat16)  # (1, nh, 256, hs)
    return SDPBackend(torch._fused_sdp_choice(q, q, q, is_causal=True)).name


def hf_row(config: GPTConfig, T: int, device: torch.device) -> dict[str, Any]:
    """Hugging Face eager output_attentions at T (base model), built and freed here."""
    try:
        hf = hf_from_config("Llama", hf_fields(config), device, torch.bfloat16, attn="eager")
    except ImportError:
        return {"error": "transformers not installed"}
    ids = torch.randint(0, config.vocab_size, (1, T), device=device)

    @torch.inference_mode()
    def eager() -> None:
        hf.model(ids, output_attentions=True)

    return measure(eager, device, rounds=1)  # the caller frees the model on return


def run(quick: bool = False, device: str | None = None, out: Path | None = None
        ) -> dict[str, Any]:
    """Both lengths; quick: the toy shape at 64 and 128 tokens (a smoke test)."""
    where = pick_device(device)
    if where is None:
        return skipped("gpu_summaries")
    config, lengths, rounds = (TOY, (64, 128), 1) if quick else (LLAMA_1B, (8192, 32768), 3)
    model = random_gpt(config, where, torch.bfloat16)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    result: dict[str, Any] = {"suite": "gpu_summaries", "machine": gpu_machine(where),
                              "transformers": transformers_version(),
                              "sdpa_backend": sdpa_backend(config, where),
                              "weight_bytes": weight_bytes, "lengths": {}}
    for T in lengths:
        result["lengths"][str(T)] = attnlab_rows(model, T, where, rounds if T < 16384 else 2)
        write_partial(out, result)
    del model
    gc.collect()
    reset_peak(where)
    result["lengths"][str(lengths[0])][HF_EAGER] = hf_row(config, lengths[0], where)
    gc.collect()
    result |= report(result, quick)
    write_partial(out, result)
    return result


def report(result: dict[str, Any], quick: bool) -> dict[str, Any]:
    rows, met = [], {}
    for T, variants in result["lengths"].items():
        base = variants[FORWARD]
        for name, r in variants.items():
            time_x = r["ms"] / base["ms"] if "ms" in r and "ms" in base else None
            peak = r.get("peak_bytes")
            mem_x = peak / base["peak_bytes"] if peak and base.get("peak_bytes") else None
            rows.append([T, name, r.get("ms"), time_x, None if peak is None else peak / 2**30,
                         mem_x, r.get("error", "")])
            way = WAYS.get(name)
            if way is not None and time_x is not None:
                met[f"{T} time{way}"] = time_x <= TARGETS["time"]
                if mem_x is not None:
                    met[f"{T} memory{way}"] = mem_x <= TARGETS["memory"]
    m = result["machine"]
    notes = [
        f"{m.get('gpu') or 'no GPU: ' + str(m.get('smoke_device'))}; SDPA's kernel "
        f"{result['sdpa_backend']}; random bfloat16 weights "
        f"({result['weight_bytes'] / 2**30:.2f} GiB, in every peak), batch 1; median of the "
        "rounds, each call synchronised; peak: torch.cuda.max_memory_allocated during one "
        "call (not measured off CUDA). Hugging Face: its own random weights of the same "
        "shape, base model (no head), one timed call.",
        *(f"target {k} ({TARGETS[k.split()[1].strip(',')]}x the fused forward): "
          f"{'met' if ok else 'missed'}" for k, ok in met.items() if not quick),
        *(["smoke run: tiny shapes, figures mean nothing"] if quick else []),
    ]
    return {
        "targets_met": {} if quick else met,
        "tables": [table(
            "Per-head summaries at long context on a GPU (Llama-3.2-1B shape, bfloat16)",
            ["tokens", "variant", "ms", "x fused forward", "peak GiB", "peak x fused forward",
             "note"], rows)],
        "notes": notes,
    }


def main(argv: Sequence[str] | None = None) -> int:
    return suite_main(run, argv, "python -m benchmarks.gpu_summaries", __doc__)


if __name__ == "__main__":
    sys.exit(main())
