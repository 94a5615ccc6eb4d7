"""Decode speed: attnlab `generate` against Hugging Face `GPT2LMHeadModel.generate`.

Both run greedy decoding of the same random GPT-2 weights (built by transformers, copied
into attnlab with `attnlab.hf.gpt_from_hf`) in the same process, timed in alternating
rounds (common.alternate), so background load hits both alike. Shapes: the tiny config
(4 layers, 4 heads, 128 dims, vocab 65) and GPT-2 small (12 layers, 12 heads, 768 dims,
vocab 50257), batch 1 and 8, a 16-token prompt and 256 new tokens; the ratio is HF time /
attnlab time. Targets at batch 1: >= 3x on tiny, >= 1.2x on GPT-2 small.

Also the flat decode cost: attnlab's time per token at position ~100 and ~1000 of the
tiny config (block_size 1100), target within 2x (the static cache attends over the filled
prefix only, and no step allocates anything of size T x T).

    python -m benchmarks.decode [--quick] [--threads N] [--out decode.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from attnlab.generate import decode_one_token, generate, prefill
from attnlab.hf import gpt_from_hf
from attnlab.model import DecodeStep
from attnlab.model.runtime import reuse_freed_memory
from attnlab.train.recipes import fast_bf16

from .common import alternate, clock, machine, median_ms, render, table

SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, vocab_size=65),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257),
    "toy": dict(n_layer=2, n_head=2, n_embd=32, vocab_size=65),  # --quick
}
TARGETS = {"tiny": 3.0, "gpt2": 1.2}  # HF time / attnlab time at batch 1
FLAT_TARGET = 2.0  # ms/token at position 1000 over position 100
PROMPT = 16


def build_pair(shape: str, block_size: int, seed: int = 0) -> tuple[Any, Any]:
    """(Hugging Face GPT2LMHeadModel, attnlab GPT) with the same random weights, eval mode."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        **SHAPES[shape], n_positions=block_size,
        # wider than GPT-2's 0.02 so logits are peaked: greedy ids then do not hinge on
        # float rounding, and both systems must produce the same ones
        initializer_range=0.1,
        bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )
    hf = transformers.GPT2LMHeadModel(config).eval()
    return hf, gpt_from_hf(config.to_dict(), hf.state_dict())


def _decoders(hf: Any, ours: Any, ids: torch.Tensor, n: int) -> dict[str, Any]:
    ones = torch.ones_like(ids)

    def attnlab() -> torch.Tensor:
        return generate(ours, ids, max_new_tokens=n, temperature=0)

    def huggingface() -> torch.Tensor:
        with torch.inference_mode():
            return hf.generate(
                ids, attention_mask=ones, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                eos_token_id=None, pad_token_id=0,
            )

    return {"attnlab": attnlab, "huggingface": huggingface}


def compare(
    shape: str, batches: Sequence[int], new_tokens: int, rounds: int,
    dtype: torch.dtype = torch.float32, pair: tuple[Any, Any] | None = None,
) -> list[dict[str, Any]]:
    """Both systems at each batch size; dtype bfloat16 casts both models' weights. `pair`:
    (Hugging Face model, attnlab GPT) to compare instead of the GPT-2 `shape` built here."""
    hf, ours = pair or build_pair(shape, block_size=max(1024, PROMPT + new_tokens))
    hf, ours = hf.to(dtype), ours.to(dtype)
    records = []
    for B in batches:
        ids = torch.randint(1, ours.config.vocab_size, (B, PROMPT),
                            generator=torch.Generator().manual_seed(B))
        fns = _decoders(hf, ours, ids, new_tokens)
        ours_ids, hf_ids = fns["attnlab"](), fns["huggingface"]()  # also the warmup
        times = {name: t[clock()] for name, t in alternate(fns, rounds=rounds, warmup=0).items()}
        ms = {name: median_ms(t) for name, t in times.items()}
        records.append({
            "shape": shape, "dtype": str(dtype).removeprefix("torch."), "batch": B,
            "new_tokens": new_tokens, "rounds": rounds,
            "tokens_per_s": {k: B * new_tokens / (v / 1e3) for k, v in ms.items()},
            "ratio": ms["huggingface"] / ms["attnlab"],
            "ratios_per_round": [h / a for h, a in zip(times["huggingface"], times["attnlab"],
                                                       strict=True)],
            "same_greedy_ids": torch.equal(ours_ids, hf_ids),
            # bfloat16 rounds differently in the two systems: once one greedy id differs,
            # the continuations part, so this is the share of positions before that
            "greedy_agreement": (ours_ids == hf_ids)[:, PROMPT:].float().mean().item(),
        })
    return records


def _decode_steps(model: Any, position: int, steps: int) -> Any:
    """A function running `steps` decode steps (batch 1) after `position` cached tokens."""
    ids = torch.randint(0, model.config.vocab_size, (1, position),
                        generator=torch.Generator().manual_seed(position))
    cache = model.new_cache(1, position + steps)
    decode = DecodeStep(model)  # what generate runs
    with torch.inference_mode():
        first = prefill(model, ids, None, cache).argmax(-1, keepdim=True)  # (1, 1)

    @torch.inference_mode()
    def run_steps() -> None:
        cache.seq_len = position  # rewind: every round decodes positions position..+steps
        token = first
        for _ in range(steps):
            token = decode_one_token(decode, token, None, cache).argmax(-1, keepdim=True)

    return run_steps


def flat_cost(shape: str, positions: tuple[int, int], steps: int, rounds: int) -> dict[str, Any]:
    """attnlab's ms per decode step at two context lengths, timed in alternating rounds."""
    _, model = build_pair(shape, block_size=max(1100, positions[1] + steps))
    fns = {str(p): _decode_steps(model, p, steps) for p in positions}
    times = alternate(fns, rounds=rounds, warmup=1)
    near, far = (median_ms(times[str(p)][clock()]) / steps for p in positions)
    return {"shape": shape, "positions": list(positions), "ms_per_token": [near, far],
            "ratio": far / near, "steps": steps, "rounds": rounds}


def run(quick: bool = False) -> dict[str, Any]:
    """Measure everything; quick: the toy shape, 16 new tokens, one round (a smoke test)."""
    bf16 = torch.bfloat16
    if quick:
        new_tokens, rounds = 16, 1
        runs = [("toy", (1, 2), torch.float32), ("toy", (1,), bf16)]
        flat = flat_cost("toy", (16, 64), steps=8, rounds=1)
    else:
        new_tokens, rounds = 256, 3
        runs = [("tiny", (1, 8), torch.float32), ("gpt2", (1, 8), torch.float32)]
        if fast_bf16():  # emulated bf16 matmuls run ~40x slower: hours, and no news
            runs.append(("gpt2", (1,), bf16))
        flat = flat_cost("tiny", (100, 1000), steps=64, rounds=9)
    records = [r for shape, batches, dtype in runs
               for r in compare(shape, batches, new_tokens, rounds, dtype)]

    rows = [[r["shape"], r["dtype"], r["batch"], r["tokens_per_s"]["attnlab"],
             r["tokens_per_s"]["huggingface"], r["ratio"],
             "yes" if r["same_greedy_ids"] else f"{r['greedy_agreement']:.0%} of tokens"]
            for r in records]
    met = {  # the targets compare the systems at float32, on the same weights
        r["shape"]: r["ratio"] >= TARGETS[r["shape"]]
        for r in records if r["batch"] == 1 and r["shape"] in TARGETS and r["dtype"] == "float32"
    }
    notes = [
        f"greedy, {PROMPT}-token prompt, {new_tokens} new tokens, "
        f"{torch.get_num_threads()} torch thread(s); median {clock()} time of {rounds} "
        "alternating round(s). A shared CPU makes these noisy: compare the ratio, measured "
        "side by side. bfloat16 rows cast both models' weights (`attnlab generate --dtype "
        "bfloat16`).",
        *(f"target {TARGETS[s]}x Hugging Face on {s} at batch 1: {'met' if ok else 'missed'}"
          for s, ok in met.items()),
        f"flat decode cost ({flat['shape']}): {flat['ms_per_token'][0]:.3f} ms/token at "
        f"position {flat['positions'][0]}, {flat['ms_per_token'][1]:.3f} at "
        f"{flat['positions'][1]}: {flat['ratio']:.2f}x (target <= {FLAT_TARGET}x)",
    ]
    return {
        "suite": "decode",
        "machine": machine(),
        "records": records,
        "flat": flat,
        "targets_met": {**met, "flat": flat["ratio"] <= FLAT_TARGET} if not quick else {},
        "tables": [table(
            "Decode: attnlab vs Hugging Face generate (tokens/s, same weights)",
            ["shape", "dtype", "batch", "attnlab tok/s", "HF tok/s", "HF time / attnlab time",
             "same greedy ids"],
            rows,
        )],
        "notes": notes,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="toy shape, seconds (smoke run)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    reuse_freed_memory()  # as the attnlab CLI does
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads {args.threads} must be >= 1")
        torch.set_num_threads(args.threads)
    result = run(quick=args.quick)
    print(render(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
