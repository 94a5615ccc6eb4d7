"""Per-head summaries at long context: all five, every layer and head, against the forward.

One Qwen2.5-0.5B-shaped model (the `qwen2.5-0.5b` preset: 24 layers, 14 query heads, 2
key/value heads, 896 wide, head_dim 64, d_ff 4864, vocabulary 151936) with random weights,
batch 1, T=4096 ids, on the CPU, inference mode, one torch thread (CPU time is the clock,
common.py), in alternating rounds:

- the fused forward (SDPA attention, no trace), with every position's logits and with the
  last position's only (`last_logits_only`);
- `Trace(names=SUMMARY_NAMES).run`: attn_entropy, attn_sink, attn_received, attn_distance
  and attn_max of every layer and head, streamed in tiles (model/summaries.py); the run ends
  after the last layer's summaries, so it skips the head as `Trace.run` does.

Target (issue 33): the summaries in at most 2x the fused forward's time. Also reported: each
variant's first call in a process of its own, its time and how far that process's peak RSS
rose during it (one process's later calls find the heap as earlier calls left it), the bytes
the trace holds (O(layers x heads x T)), and, as a check at full size, layer 0's summaries
against the same quantities computed in float64 from a trace of its (1, 14, T, T) weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attnlab.model.gpt import GPT, GPTConfig
from attnlab.model.runtime import one_thread
from attnlab.model.summaries import SUMMARY_NAMES
from attnlab.model.trace import Trace

from .common import alone_first_call, alternate, clock, in_own_process, median_ms, table

TARGET = 2.0  # summaries / fused forward, at most
FORWARD, LAST, SUMMARIES = ("attnlab forward (no trace)", "attnlab forward, last logits only",
                            "Trace.run: the five summaries, every layer and head")
TOY = dict(vocab_size=512, n_layer=2, n_head=4, n_kv_head=2, n_embd=64, head_dim=16, d_ff=96)


def reference(weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """The summaries of unpadded causal weights (B, nh, T, S), from their definitions, in
    float64 (tests/model/test_summaries.py has the padded version)."""
    w = weights.double()
    T, S = w.shape[-2:]
    distance = (torch.arange(S - T, S)[:, None] - torch.arange(S)[None, :]).double()  # (T, S)
    return {"attn_entropy": -torch.special.xlogy(w, w).sum(-1), "attn_sink": w[..., 0],
            "attn_received": w.sum(-2), "attn_distance": (w * distance).sum(-1),
            "attn_max": w.amax(-1)}


def _errors(model: GPT, ids: torch.Tensor, held: Trace) -> dict[str, float]:
    """Largest relative error (against max(|reference|, 1)) of layer 0's summaries."""
    weights = Trace(layers=0, names="attn_weights").run(model, ids).get("attn_weights", 0)
    errors = dict.fromkeys(SUMMARY_NAMES, 0.0)
    for h in range(weights.shape[1]):  # one head at a time: float64 copies of (T, S) each
        for name, value in reference(weights[:, h:h + 1]).items():
            error = (held.get(name, 0)[:, h:h + 1].double() - value).abs() / value.abs().clamp(
                min=1.0)
            errors[name] = max(errors[name], error.max().item())
    return errors


def run(quick: bool = False) -> dict[str, Any]:
    """Time the variants on one torch thread; quick: a toy shape at T=64, one round."""
    with one_thread(), torch.inference_mode():
        return _run(quick)


def _setup(quick: bool) -> tuple[GPT, torch.Tensor, dict[str, Callable[[], Any]],
                                  dict[str, Trace]]:
    """The model, the ids, each variant's call and where the summaries' call keeps its trace
    (the same seeds in every process)."""
    T = 64 if quick else 4096
    torch.manual_seed(0)
    config = (GPTConfig.from_name("llama-tiny", **TOY, block_size=T) if quick
              else GPTConfig.from_name("qwen2.5-0.5b"))
    model = GPT(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, T), generator=torch.Generator().manual_seed(1))
    held: dict[str, Trace] = {}

    def summaries() -> None:
        held["trace"] = Trace(names=list(SUMMARY_NAMES)).run(model, ids)

    fns: dict[str, Callable[[], Any]] = {
        FORWARD: lambda: model(ids),
        LAST: lambda: model(ids, last_logits_only=True),
        SUMMARIES: summaries,
    }
    return model, ids, fns, held


def first_call(variant: str, quick: bool) -> tuple[float, int | None]:
    """`common.alone_first_call` of `variant`, set up as `_run` sets it up: what
    `common.in_own_process` runs alone."""
    return alone_first_call(lambda: _setup(quick)[2][variant])


def _run(quick: bool) -> dict[str, Any]:
    rounds = 1 if quick else 3
    model, ids, fns, held = _setup(quick)
    T, c = ids.shape[1], model.config
    first = {name: in_own_process("summaries", "first_call", name, quick) for name in fns}
    times = alternate(fns, rounds=rounds, warmup=1)
    errors = _errors(model, ids, held["trace"])
    stored = held["trace"].nbytes()
    ms = {name: median_ms(t[clock()]) for name, t in times.items()}
    ratios = {"vs_forward": ms[SUMMARIES] / ms[FORWARD],
              "vs_forward_last_logits": ms[SUMMARIES] / ms[LAST]}
    rows = [[name, ms[name], ms[name] / ms[FORWARD], first[name][0] * 1e3,
             None if first[name][1] is None else first[name][1] / 2**20] for name in fns]
    notes = [
        f"{'toy' if quick else 'qwen2.5-0.5b'} shape ({c.n_layer} layers, {c.n_head} query "
        f"heads, {c.n_kv_heads} key/value heads, {c.n_embd} wide, head_dim {c.head_size}, "
        f"d_ff {c.d_ff}, vocabulary {c.vocab_size}), random weights, batch 1, T={T}, "
        f"{torch.get_num_threads()} torch thread(s), inference mode; median {clock()} time of "
        f"{rounds} alternating round(s) on a shared machine.",
        f"the summaries trace holds {stored / 2**20:.1f} MiB (5 x layers x heads x T floats); "
        "first call and peak rise: each variant's first call in a process of its own, and "
        "how far that process's peak RSS rose during it.",
        "layer 0's summaries against the same quantities computed in float64 from its traced "
        "weights, largest error relative to max(|value|, 1): "
        + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()) + ".",
        "ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()),
        f"target summaries <= {TARGET}x the fused forward: "
        + ("not judged on the quick run's toy shape" if quick else
           'met' if ratios['vs_forward'] <= TARGET else 'missed'),
    ]
    return {
        "suite": "summaries",
        "tables": [table(f"Per-head summaries vs the forward, T={T}",
                         ["variant", "ms", "x forward", "first call ms", "peak rise MiB"],
                         rows)],
        "notes": notes,
        "ms": ms,
        "ratios": ratios,
        "errors": errors,
        "target_met": ratios["vs_forward"] <= TARGET if not quick else None,
    }
