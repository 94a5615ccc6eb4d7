"""Tracing: all layers' attention weights (and everything) against TransformerLens, nnsight, HF.

One GPT-2-small-shaped model with random weights, built by transformers (initializer 0.1,
as in decode.py) and copied into attnlab with `gpt_from_hf`; TransformerLens boots the
same weights from a `save_pretrained` directory (`TransformerBridge.boot_transformers`,
nothing downloaded) and nnsight wraps the same eager Hugging Face model. Every variant
runs the same (1, T) ids under `torch.inference_mode`, in alternating rounds
(common.alternate); each returns logits (or None where it skips the head) and what it
captured. Rows for TransformerLens and nnsight appear only where they import
(`pip install -e ".[bench]"`); the table names the versions that ran. Two more rows time the
matrix products alone (floors) of a weights trace and of `Trace.run`, which stops after the
last layer's weights: each other tool's time over the second is the most any capture of
every layer's weights on these kernels could be ahead of that tool.

Targets (issue 16): attention weights of every layer at T=1024 in <= 1.3x attnlab's own
untraced forward; each tool's fastest way to them (Hugging Face: the LM or its base model;
nnsight: with or without `stop()`) >= 1.5x slower than attnlab's (`Trace.run`) for
TransformerLens `run_with_cache` with a pattern filter and Hugging Face eager
`output_attentions=True`, also reported like for like with every tool computing the logits;
a full trace >= 1.3x faster than TransformerLens's full cache (like for like: every name
but the per-head summaries, which TransformerLens has no hook for; `Trace()`, which
computes them too, has a row of its own). Memory: bytes the stored capture holds, and the
rise of the peak RSS during each variant's first call, in a process of its own (VmHWM after
a reset through /proc/self/clear_refs). A quick run measures its first calls one after
another in the suite's process: a process per variant would import transformers anew each
time, which costs a smoke test more than all its calls.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import torch

from attnlab.hf import gpt_from_hf
from attnlab.model.gpt import GPT, unembed
from attnlab.model.runtime import one_thread
from attnlab.model.summaries import SUMMARY_NAMES
from attnlab.model.trace import NAMES, Trace
from attnlab.model.traced_attention import BLOCK_ROWS

from .common import (
    alone_first_call,
    alternate,
    clock,
    cold_call,
    in_own_process,
    machine,
    median_ms,
    note,
    package_version,
    table,
)

SHAPES: dict[str, dict[str, Any]] = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257),
    "toy": dict(n_layer=2, n_head=2, n_embd=32, vocab_size=65),  # --quick
}
FLOOR = "a weights trace's matrix products alone"
FLOOR_RUN = "Trace.run's matrix products alone (no head)"
FLOORS = (FLOOR, FLOOR_RUN)
RUN = "attnlab Trace.run: attn_weights (no logits)"
# TransformerLens's full cache holds activations, not attnlab's per-head summaries
EVERY_ACTIVATION = "attnlab trace: every name but the summaries"
HF_BASE = "HF eager base model output_attentions (no head)"
NNSIGHT_STOP = "nnsight: attention weights, stop() (no logits)"
KEEP = ("attnlab trace: attn_weights", "attnlab trace: attn_weights, float16", RUN,
        "HF eager output_attentions")
TARGETS = {"weights_vs_forward": 1.3, "vs_tl_pattern": 1.5, "vs_hf_eager": 1.5, "full_vs_tl": 1.3}
TL_PATTERN, TL_FULL = ("TransformerLens run_with_cache: hook_pattern",
                       "TransformerLens run_with_cache: everything")


def _nbytes(tensors: Any) -> int:
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    if isinstance(tensors, dict):
        return sum(_nbytes(t) for t in tensors.values())
    return sum(_nbytes(t) for t in tensors)


def _hf_model(shape: str, block_size: int) -> Any:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        **SHAPES[shape], n_positions=block_size, initializer_range=0.1,
        bos_token_id=None, eos_token_id=None, attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(config).eval()


def products_only(model: GPT, T: int, stop: bool = False) -> Callable[[], tuple[Any, Any]]:
    """The matrix products of `model`'s forward with a trace of the weights at (1, T), with
    nothing between them: every Linear of every block on an input of its width, the causal
    attention products in the traced path's blocks of queries (keys up to the block's last
    query), and the head as the forward runs it. A forward that returns the weights cannot
    take less on this CPU's kernels (the untraced one skips the weights: fused attention).
    stop: those of `Trace.run` instead, which ends at the last layer's weights (its q, k, v
    and scores) and has no head: the least any capture of every layer's weights runs."""
    c = model.config
    hs = c.n_embd // c.n_head
    q = torch.randn(1, c.n_head, T, hs)  # (1, nh, T, hs)
    key_t = torch.randn(1, c.n_head, hs, T)  # (1, nh, hs, T)
    weights = torch.rand(1, c.n_head, T, T)  # (1, nh, T, T)
    inputs = {w: torch.randn(1, T, w) for w in {lin.in_features for lin in _linears(model)}}

    def run() -> tuple[Any, Any]:
        for i, block in enumerate(model.blocks):
            last = stop and i == c.n_layer - 1
            attn = block.attn
            for lin in [attn.query, attn.key, attn.value] if last else _linears(block):
                lin(inputs[lin.in_features])  # (1, T, out)
            for i0 in range(0, T, BLOCK_ROWS):
                i1 = min(i0 + BLOCK_ROWS, T)
                q[:, :, i0:i1] @ key_t[..., :i1]  # (1, nh, rows, i1)
                if not last:
                    weights[:, :, i0:i1, :i1] @ q[:, :, :i1]  # (1, nh, rows, hs)
        return (None if stop else unembed(model.lm_head, inputs[c.n_embd])), {}
    return run


def _linears(module: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)
            and m is not getattr(module, "lm_head", None)]


Variants = dict[str, Callable[[], tuple[Any, Any]]]


def families(hf: Any, ids: torch.Tensor, tmp: str) -> dict[str, Callable[[], Variants]]:
    """tool -> what builds its variants (name -> function returning (logits or None, what
    it captured)), all on the same weights; TransformerLens and nnsight where they import.
    Each tool's way to the weights without the head is there where it has one: `Trace.run`,
    Hugging Face's base model (`AutoModel`, as bertviz loads it), nnsight's `tracer.stop()`;
    TransformerLens's `stop_at_layer` cannot keep the last layer's pattern and skip the head
    (stop_at_layer=n_layers still runs it here)."""
    built: dict[str, Callable[[], Variants]] = {
        "attnlab": lambda: attnlab_variants(
            gpt_from_hf(hf.config.to_dict(), hf.state_dict()).eval(), ids),
        "HF": lambda: hf_variants(hf, ids),
    }
    if package_version("transformer-lens"):
        built["TransformerLens"] = lambda: transformer_lens_variants(hf, ids, tmp)
    if package_version("nnsight"):
        built["nnsight"] = lambda: nnsight_variants(hf, ids)
    return built


def hf_variants(hf: Any, ids: torch.Tensor) -> Variants:
    """Hugging Face eager's rows: the LM with the logits, and its base model without."""

    def hf_eager() -> tuple[Any, Any]:
        out = hf(ids, output_attentions=True)
        return out.logits, out.attentions

    return {"HF eager output_attentions": hf_eager,
            HF_BASE: lambda: (None, hf.transformer(ids, output_attentions=True).attentions)}


def attnlab_variants(ours: GPT, ids: torch.Tensor) -> Variants:
    """attnlab's rows: the untraced forward (the yardstick, timed first), traced forwards,
    `Trace.run`, and the two floors of matrix products alone."""

    def traced(**kwargs: Any) -> Callable[[], tuple[Any, Any]]:
        def run() -> tuple[Any, Any]:
            trace = Trace(**kwargs)
            return ours(ids, trace=trace).logits, trace.values
        return run

    return {
        "attnlab forward (no trace)": lambda: (ours(ids).logits, {}),
        "attnlab trace: attn_weights": traced(names=["attn_weights"]),
        "attnlab trace: attn_weights, float16": traced(names=["attn_weights"],
                                                       dtype=torch.float16),
        "attnlab trace: every name": traced(),
        EVERY_ACTIVATION: traced(names=sorted(NAMES.keys() - set(SUMMARY_NAMES))),
        RUN: lambda: (None, Trace(names=["attn_weights"]).run(ours, ids).values),
        FLOOR: products_only(ours, ids.shape[1]),
        FLOOR_RUN: products_only(ours, ids.shape[1], stop=True),
    }


def transformer_lens_variants(hf: Any, ids: torch.Tensor, tmp: str) -> Variants:
    """TransformerLens's rows, booted from the same weights saved to `tmp` (nothing
    downloaded): the pattern-filtered cache and the full one."""
    from transformer_lens.model_bridge import TransformerBridge

    hf.save_pretrained(tmp)
    bridge = TransformerBridge.boot_transformers(tmp, device="cpu")
    bridge.eval()

    def tl_pattern() -> tuple[Any, Any]:
        logits, cache = bridge.run_with_cache(
            ids, names_filter=lambda name: name.endswith("hook_pattern"))
        return logits, dict(cache.items())

    def tl_full() -> tuple[Any, Any]:
        logits, cache = bridge.run_with_cache(ids)
        return logits, dict(cache.items())

    return {TL_PATTERN: tl_pattern, TL_FULL: tl_full}


def nnsight_variants(hf: Any, ids: torch.Tensor) -> Variants:
    """nnsight's rows on the same eager Hugging Face model: every layer's weights saved with
    the logits, and with `tracer.stop()` after the last layer's (no head)."""
    from nnsight import NNsight

    wrapped = NNsight(hf)
    n_layer = hf.config.n_layer

    def nnsight_weights() -> tuple[Any, Any]:
        saved: list[Any] = []
        with wrapped.trace(ids):
            for i in range(n_layer):
                saved.append(wrapped.transformer.h[i].attn.output[1].save())
            logits = wrapped.lm_head.output.save()
        return logits, saved

    def nnsight_stop() -> tuple[Any, Any]:
        saved: list[Any] = []
        with wrapped.trace(ids) as tracer:
            for i in range(n_layer):
                saved.append(wrapped.transformer.h[i].attn.output[1].save())
            tracer.stop()
        return None, saved

    return {"nnsight: attention weights": nnsight_weights, NNSIGHT_STOP: nnsight_stop}


def _first_call(fn: Callable[[], tuple[Any, Any]]) -> tuple[tuple[float, int | None, int], Any]:
    """((seconds, rise of this process's peak RSS during the call, bytes captured), fn's
    result) of a cold call (`common.cold_call`)."""
    seconds, rise, out = cold_call(fn)
    return (seconds, rise, _nbytes(out[1])), out


def run(quick: bool = False) -> dict[str, Any]:
    """Time every variant on one torch thread; quick: the toy shape at T=32, one round."""
    with one_thread():  # the setting
        return _run(quick)


def _inputs(quick: bool) -> tuple[str, int, Any, torch.Tensor]:
    """(shape, T, the Hugging Face model, the (1, T) ids): the same seeds in every process."""
    shape, T = ("toy", 32) if quick else ("gpt2", 1024)
    hf = _hf_model(shape, block_size=max(64, T))
    ids = torch.randint(0, hf.config.vocab_size, (1, T), generator=torch.Generator().manual_seed(1))
    return shape, T, hf, ids


def first_call(family: str, name: str, quick: bool) -> tuple[float, int | None]:
    """`common.alone_first_call` of variant `name`, built as `_run` builds it, with only
    its tool's variants (`families`) set up: what `common.in_own_process` runs alone."""
    with tempfile.TemporaryDirectory() as tmp:
        _, _, hf, ids = _inputs(quick)
        return alone_first_call(lambda: families(hf, ids, tmp)[family]()[name])


def _run(quick: bool) -> dict[str, Any]:
    shape, T, hf, ids = _inputs(quick)
    rounds = 1 if quick else 5
    with tempfile.TemporaryDirectory() as tmp:
        built = {tool: build() for tool, build in families(hf, ids, tmp).items()}
        fns = {name: fn for variants in built.values() for name, fn in variants.items()}
        first, logit_diff, checks = first_calls(fns)
        if not quick:  # each variant's first call alone (the module docstring: why not quick)
            first = {name: (*in_own_process("trace", "first_call", tool, name, quick),
                            first[name][2])
                     for tool, variants in built.items() for name in variants}
        times = alternate({n: _in_inference_mode(f) for n, f in fns.items()}, rounds=rounds,
                          warmup=0)
    ms = {name: median_ms(t[clock()]) for name, t in times.items()}
    base = ms["attnlab forward (no trace)"]

    rows = [[name, ms[name], ms[name] / base, first[name][0] * 1e3, first[name][2] / 2**20,
             None if first[name][1] is None else first[name][1] / 2**20, logit_diff[name]]
            for name in fns]
    ratios = _ratios(ms)
    # the most any capture of every layer's weights on these kernels could be ahead of each
    # tool: its time over the products Trace.run cannot skip
    ceiling = {name: ms[name] / ms[FLOOR_RUN] for name in ms
               if not name.startswith("attnlab") and name not in FLOORS}
    met = {k: (v <= TARGETS[k] if k == "weights_vs_forward" else v >= TARGETS[k])
           for k, v in ratios.items() if k in TARGETS}
    versions = {p: package_version(p)
                for p in ("torch", "transformers", "transformer-lens", "nnsight")}
    err16, err_hf, run_equal = checks
    notes = [
        _setup_note(shape, T, rounds, versions),
        "first call and peak rise: each variant's first call, one-time setup included, and how "
        "far the peak RSS rose during it, "
        + ("in this process after the variants above it (a quick run)" if quick else
           "in a process of its own") + "; attnlab's traced path then wrote into fresh pages, "
        "the ms column's calls into the buffers earlier traces freed (runtime.kept_empty).",
        "stored: bytes of what the call returns as captured (attnlab: the trace, HF: "
        "attentions, TransformerLens: the cache).",
        f"attnlab's weights equal Hugging Face eager's to {err_hf:.1e}; Trace.run's are "
        f"{'bit-equal to' if run_equal else 'NOT equal to'} the whole traced forward's; "
        f"float16 storage changes them by at most {err16:.1e} (bound 2**-12 = 2.4e-4) and "
        "halves the bytes.",
        "ratios (each tool's fastest way to every layer's weights over Trace.run; "
        "_with_logits: every tool computing the logits too, attnlab's traced forward): "
        + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()),
        _floor_note(ms, ceiling),
        *(f"target {k} ({'<=' if k == 'weights_vs_forward' else '>='} {TARGETS[k]}x): "
          + (f"not judged on the quick run's {shape} shape" if quick else
             'met' if ok else 'missed') for k, ok in met.items()),
    ]
    return {
        "suite": "trace",
        "machine": machine(),
        "versions": versions,
        "ms": ms,
        "ratios": ratios,
        "ceiling": ceiling,
        "targets_met": met if not quick else {},
        "float16_max_error": err16,
        "hf_weights_max_error": err_hf,
        "run_equals_trace": run_equal,
        "tables": [table(
            f"Tracing a forward pass ({shape}, T={T}; ms, median)",
            ["variant", "ms", "x attnlab forward", "first call ms", "stored MiB", "peak rise MiB",
             "max abs logit diff vs attnlab"],
            rows,
        )],
        "notes": notes,
    }


def first_calls(
    fns: Variants,
) -> tuple[dict[str, tuple[float, int | None, int]], dict[str, float | None],
           tuple[float, float, bool]]:
    """Each variant's first call, which is also its warmup: (name -> (seconds, peak RSS rise,
    bytes captured), name -> max abs logit difference from attnlab's forward or None,
    `weight_checks` of the captures)."""
    # the first call of each is the warmup; its time, peak RSS rise and captured bytes
    # are the first-call columns (allocator growth included: what a first capture costs)
    first: dict[str, tuple[float, int | None, int]] = {}
    logit_diff: dict[str, float | None] = {}
    outs: dict[str, Any] = {}  # only the captures the error checks below read
    reference = None
    for name, fn in fns.items():
        first[name], out = _first_call(fn)
        note(f"first call of {name}: {first[name][0]:.1f} s")
        reference = out[0] if reference is None else reference  # attnlab's forward: first
        # the floors multiply random inputs: their "logits" are not the model's
        logit_diff[name] = None if name in FLOORS or out[0] is None else (
            out[0] - reference).abs().max().item()
        if name in KEEP:
            outs[name] = out
        del out  # a capture of GBs is not held while the next variant is measured
    # returning drops outs: the timed calls start from the same free memory
    return first, logit_diff, weight_checks(outs)


def weight_checks(outs: dict[str, Any]) -> tuple[float, float, bool]:
    """(float16 storage's largest change to attnlab's weights, their largest difference from
    Hugging Face eager's, whether Trace.run's equal the traced forward's bit for bit)."""
    ours_w = outs["attnlab trace: attn_weights"][1]
    ours_w16 = outs["attnlab trace: attn_weights, float16"][1]
    err16 = max((ours_w16[key].float() - ours_w[key]).abs().max().item() for key in ours_w)
    err_hf = max((ours_w[(i, "attn_weights")] - w).abs().max().item()
                 for i, w in enumerate(outs["HF eager output_attentions"][1]))
    run_equal = outs[RUN][1].keys() == ours_w.keys() and all(
        torch.equal(outs[RUN][1][key], ours_w[key]) for key in ours_w)
    return err16, err_hf, run_equal


def _in_inference_mode(fn: Callable[[], tuple[Any, Any]]) -> Callable[[], None]:
    """fn as `alternate` times it: under `torch.inference_mode`, its result dropped."""
    def go() -> None:
        with torch.inference_mode():
            fn()
    return go


def _ratios(ms: dict[str, float]) -> dict[str, float]:
    """The targets' ratios: each tool's fastest way to every layer's weights against
    attnlab's (Trace.run); "_with_logits": like for like, every tool also computing the
    logits."""
    w, full, fast = ms["attnlab trace: attn_weights"], ms[EVERY_ACTIVATION], ms[RUN]
    ratios: dict[str, float] = {"weights_vs_forward": w / ms["attnlab forward (no trace)"],
                                "vs_hf_eager": min(ms["HF eager output_attentions"],
                                                   ms[HF_BASE]) / fast,
                                "vs_hf_eager_with_logits": ms["HF eager output_attentions"] / w}
    if TL_PATTERN in ms:  # no TransformerLens call keeps the last pattern without the head
        ratios["vs_tl_pattern"] = ms[TL_PATTERN] / fast
        ratios["vs_tl_pattern_with_logits"] = ms[TL_PATTERN] / w
        ratios["full_vs_tl"] = ms[TL_FULL] / full
    if NNSIGHT_STOP in ms:
        ratios["vs_nnsight"] = min(ms["nnsight: attention weights"], ms[NNSIGHT_STOP]) / fast
        ratios["vs_nnsight_with_logits"] = ms["nnsight: attention weights"] / w
    return ratios


def _setup_note(shape: str, T: int, rounds: int, versions: dict[str, str | None]) -> str:
    """The note that says what ran, how it was timed, and which tools' versions."""
    return (
        f"{shape} shape, random weights, batch 1, T={T}, {torch.get_num_threads()} torch "
        f"thread(s), inference mode; median {clock()} time of {rounds} alternating round(s) "
        "on a shared, loaded machine. Versions: "
        + ", ".join(f"{p} {v}" for p, v in versions.items() if v)
        + ("" if versions["transformer-lens"] else " (TransformerLens not installed: no rows)")
        + ("" if versions["nnsight"] else " (nnsight not installed: no row)") + ".")


def _floor_note(ms: dict[str, float], ceiling: dict[str, float]) -> str:
    """The note that sets the floors beside attnlab's forward and gives each tool's ceiling."""
    base = ms["attnlab forward (no trace)"]
    return (
        f"the matrix products a weights trace runs took {ms[FLOOR] / base:.2f}x attnlab's "
        f"untraced forward on their own, Trace.run's {ms[FLOOR_RUN] / base:.2f}x (no trace, "
        "nothing between them: floors, up to this run's noise); the most a capture of every "
        "layer's weights on these kernels can be ahead, about: "
        + ", ".join(f"{v:.2f}x over {k}" for k, v in ceiling.items()) + ".")
