"""GPU decode (issue 33, item 3): attnlab eager and compiled (CUDA graphs) against Hugging Face.

Per shape, the same random weights in both systems (transformers builds the model from its
config, attnlab gets it through `attnlab.hf.gpt_from_hf`), bfloat16, batch 1, a 16-token
prompt and 256 new greedy tokens, four ways side by side in alternating rounds:

- attnlab eager: `generate(...)`, `DecodeStep` per token;
- attnlab compiled: `generate(..., compile=True)`, the fixed-shape step of
  `model/compiled_decode.py` under `torch.compile(mode="reduce-overhead")`, replayed as a CUDA
  graph; its first call (the compilation) is reported apart;
- Hugging Face eager `generate` (its default attention);
- Hugging Face `generate(cache_implementation="static")`, which on CUDA compiles the model's
  forward itself (`CompileConfig`: `mode="reduce-overhead"`), its fastest path.

Shapes: GPT-2 small and a Qwen2.5-0.5B shape (24 layers, 14 heads, 2 KV heads, 896 wide).
Targets at batch 1: attnlab compiled >= 4x Hugging Face eager and >= 1.3x Hugging Face static
+ compile. The big model against the memory bandwidth is gpu_bandwidth.py's.

    python -m benchmarks.gpu_decode [--smoke [--device cpu]] [--out FILE]
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.generate import generate
from attnlab.model.compiled_decode import compiled_decodes, release_compiled

from . import decode, decode_models
from .common import table
from .gpu_common import (
    alternating_ms,
    gpu_machine,
    pick_device,
    skipped,
    suite_main,
    sync,
    transformers_version,
    write_partial,
)

PROMPT = 16
NEW_TOKENS = 256
TARGETS = {"vs_hf_eager": 4.0, "vs_hf_static": 1.3}
EAGER, COMPILED = "attnlab eager", "attnlab compiled (CUDA graphs)"
HF_EAGER, HF_STATIC = "HF eager generate", "HF static cache + compile"


def build_pair(shape: str, device: torch.device) -> tuple[Any, Any]:
    """(Hugging Face model, attnlab GPT) with the same random weights, bfloat16 on device."""
    if shape in ("gpt2", "toy"):
        hf, ours = decode.build_pair(shape, block_size=1024)
    else:
        hf, ours = decode_models.build_pair(shape)
    return hf.to(device, torch.bfloat16), ours.to(device, torch.bfloat16)


def decoders(hf: Any, ours: Any, ids: torch.Tensor, n: int) -> dict[str, Callable[[], Any]]:
    """name -> a function generating n greedy ids after ids (1, P), returning (1, P + n)."""
    ones = torch.ones_like(ids)
    hf_args = dict(attention_mask=ones, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                   eos_token_id=None, pad_token_id=0)

    def hf_eager() -> Any:
        with torch.inference_mode():
            return hf.generate(ids, **hf_args)

    def hf_static() -> Any:
        with torch.inference_mode():
            return hf.generate(ids, cache_implementation="static", **hf_args)

    return {
        EAGER: lambda: generate(ours, ids, max_new_tokens=n, temperature=0),
        COMPILED: lambda: generate(ours, ids, max_new_tokens=n, temperature=0, compile=True),
        HF_EAGER: hf_eager,
        HF_STATIC: hf_static,
    }


def first_calls(fns: dict[str, Callable[[], Any]], device: torch.device
                 ) -> tuple[dict[str, float], dict[str, Any], dict[str, str]]:
    """Each variant's first call (compilations included): seconds, ids, and errors by name
    (a variant that fails is left out of the timed rounds, its error reported)."""
    seconds, ids, errors = {}, {}, {}
    for name, fn in fns.items():
        sync(device)
        start = time.perf_counter()
        try:
            ids[name] = fn()
        except Exception as err:  # a failing variant is a result to report, not a crash
            errors[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            continue
        sync(device)
        seconds[name] = time.perf_counter() - start
    return seconds, ids, errors


def measure_pair(shape: str, device: torch.device, n: int, rounds: int) -> dict[str, Any]:
    """The four decoders on one shape: tokens/s (median of alternating rounds), first-call
    seconds, the compile time, greedy agreement, the ratios."""
    hf, ours = build_pair(shape, device)
    ids = torch.randint(1, ours.config.vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(1)).to(device)
    fns = decoders(hf, ours, ids, n)
    first, out, errors = first_calls(fns, device)
    hf_compiled = hasattr(hf, "_compiled_call")  # transformers' own compiled forward
    timed = {name: fns[name] for name in first}
    tok_s = {name: n / (ms / 1e3) for name, ms in alternating_ms(timed, device, rounds).items()}
    steps = compiled_decodes(ours)
    reference = out.get(EAGER)
    agreement = {name: (ids_[:, PROMPT:] == reference[:, PROMPT:]).float().mean().item()
                 for name, ids_ in out.items() if reference is not None}
    record = {
        "shape": shape, "dtype": "bfloat16", "batch": 1, "prompt": PROMPT, "new_tokens": n,
        "rounds": rounds, "tokens_per_s": tok_s, "first_call_s": first, "errors": errors,
        "compile_s": steps[0].compile_seconds if steps else None,
        "cuda_graph": steps[0].cuda_graph if steps else None,
        "hf_static_compiled": hf_compiled,
        "greedy_agreement_with_attnlab_eager": agreement,
        "ratios": _ratios(tok_s),
    }
    release_compiled(ours)
    del hf, ours, fns, out
    _free(device)
    return record


def _ratios(tok_s: dict[str, float]) -> dict[str, float]:
    pairs = {"vs_hf_eager": (COMPILED, HF_EAGER), "vs_hf_static": (COMPILED, HF_STATIC),
             "compiled_vs_eager": (COMPILED, EAGER), "eager_vs_hf_eager": (EAGER, HF_EAGER)}
    return {k: tok_s[a] / tok_s[b] for k, (a, b) in pairs.items() if a in tok_s and b in tok_s}


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run(quick: bool = False, device: str | None = None, out: Path | None = None
        ) -> dict[str, Any]:
    """Both shapes; quick: toy shapes, 8 new tokens, one round (a smoke test)."""
    where = pick_device(device)
    if where is None:
        return skipped("gpu_decode")
    shapes, n, rounds = ((["toy", "llama-toy"], 8, 1) if quick else
                         (["gpt2", "qwen2.5-0.5b"], NEW_TOKENS, 2))
    if os.environ.get("GPU_DECODE_SHAPES"):  # e.g. qwen2.5-0.5b: one shape of a lease
        shapes = os.environ["GPU_DECODE_SHAPES"].split(",")
    result: dict[str, Any] = {"suite": "gpu_decode", "machine": gpu_machine(where),
                              "transformers": transformers_version(), "records": []}
    for shape in shapes:  # the JSON is rewritten after each: a time limit keeps the rest
        result["records"].append(measure_pair(shape, where, n, rounds))
        write_partial(out, result)
    result |= report(result, quick)
    write_partial(out, result)
    return result


def report(result: dict[str, Any], quick: bool) -> dict[str, Any]:
    """Tables, notes and targets of a (complete) result."""
    names = (EAGER, COMPILED, HF_EAGER, HF_STATIC)
    rows = [[r["shape"], *(r["tokens_per_s"].get(k) for k in names), r["compile_s"],
             r["ratios"].get("vs_hf_eager"), r["ratios"].get("vs_hf_static"),
             f"{r['greedy_agreement_with_attnlab_eager'].get(COMPILED, 0):.0%}"]
            for r in result["records"]]
    met = {f"{r['shape']} {k}": v >= TARGETS[k] for r in result["records"]
           for k, v in r["ratios"].items() if k in TARGETS}
    gpu = result["machine"].get("gpu") or f"no GPU: {result['machine'].get('smoke_device')}"
    errors = [f"{r['shape']}: {k} failed: {e}" for r in result["records"]
              for k, e in r["errors"].items()]
    notes = [
        f"{gpu}; torch {result['machine']['torch']}, transformers {result['transformers']}; "
        f"bfloat16, batch 1, {PROMPT}-token prompt, greedy; median of alternating rounds, "
        "each call synchronised. compile s: attnlab's first compiled call (compilation and "
        "one step), not in the tokens/s.",
        "attnlab's compiled step was recorded as a CUDA graph in: "
        + (", ".join(r["shape"] for r in result["records"] if r["cuda_graph"]) or "no row")
        + " (Inductor logs why where it skipped graphs).",
        "HF static cache + compile: generate(cache_implementation='static'), which compiles "
        "the forward itself on CUDA (mode reduce-overhead); it did "
        + ("" if all(r["hf_static_compiled"] for r in result["records"]) else "NOT ")
        + "compile in every row here.",
        *errors,
        *(f"target {k} ({TARGETS[k.split()[-1]]}x / share): {'met' if ok else 'missed'}"
          for k, ok in met.items() if not quick),
        *(["smoke run: tiny shapes, figures mean nothing"] if quick else []),
    ]
    return {
        "targets_met": {} if quick else met,
        "tables": [
            table("Decode on a GPU: tokens/s, bfloat16, batch 1 (same weights)",
                  ["shape", *names, "compile s", "compiled / HF eager",
                   "compiled / HF static", "compiled ids = eager ids"], rows),
        ],
        "notes": notes,
    }


def main(argv: Sequence[str] | None = None) -> int:
    return suite_main(run, argv, "python -m benchmarks.gpu_decode", __doc__)


if __name__ == "__main__":
    sys.exit(main())
