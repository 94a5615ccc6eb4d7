"""Where a float32 trace's matrix products lose time on a GPU (issue 33, item 1): a probe
for a lent GPU, not a suite.

Every layer's weights of GPT-2 small at T=1024 in float32 are bound by its matrix products
(docs/performance-gpu.md#where-the-time-goes-on-a-gpu), and Hugging Face's weights-returning
forward runs the same products, so no trace can be 1.5x faster than it unless attnlab's
products run faster than cuBLAS's defaults do on these shapes. The H100 profile's busy time
(9.15 ms for about 210 GFLOP) is about a third of the GPU's float32 rate. A guess to test:
a (1024 x 768) output is 48 tiles of 128 x 128, which fill under half of 132 SMs, and five
of a block's six products have one: attnlab's query, key and value (three products where
Hugging Face's GPT-2 and gpt-fast run one), the attention's output projection and the MLP's
second. Two ways to give the GPU more tiles: q, k and v as one product, and splitting a
product's inner sum into s parts (one batched product of s slices, then a sum).

Per product (the block's linear shapes, the trace's scores and context products): the
median of `REPEATS` synchronised calls as cuBLAS runs it and split s ways, GFLOP/s, and the
largest error against a float64 product; the masked softmax's passes over one layer's
scores, as attnlab runs them and fused. Then `Trace(names="attn_weights").run` end to end:
attnlab as it is, with q, k and v as one product, with each linear at its fastest split,
with both (this probe's patches, not attnlab's code), and with TF32 (not exact: its weights' error
against the float32 trace is the reason it is not an option), in alternating rounds. Where
triton is installed, each linear also as each of two 3xTF32 Triton kernels (three TF32
tensor-core products, near float32's error): attnlab's own (`attnlab.model.tf32x3_triton`,
both operands split in the kernel) and the probe's with the weight split once, before the
call (`gpu_tf32x3`), at each of their tile sizes; the trace with every linear as each, at
each shape's fastest tiles; and the trace with attnlab's 3xTF32 products on
(`tf32x3.ENABLED`: its linears, scores and context, at the tiles its rule picks).

    python -m benchmarks.gpu_gemm --out FILE [--smoke --device cpu]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab import GPTConfig
from attnlab.model import layers, tf32x3
from attnlab.model.trace import Trace

from .gpu_common import (
    alternating_ms,
    cuda_ms,
    gpu_machine,
    largest_difference,
    median,
    random_gpt,
    write_partial,
)

GPT2 = GPTConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, block_size=1024)
TOY = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=65, block_size=64)
SPLITS = (1, 2, 3, 4, 6, 8)
REPEATS = 50
ROUNDS = 10
THREE = "with 3xTF32 linears (Triton)"
THREE_SPLIT = "with 3xTF32 linears, weights split once (Triton)"


def split_linear(x: Tensor, weight: Tensor, bias: Tensor | None, s: int) -> Tensor:
    """F.linear(x, weight, bias) with the inner sum in s parts: x (..., K), weight (N, K)."""
    if s == 1:
        return F.linear(x, weight, bias)  # (..., N)
    *lead, K = x.shape
    N = weight.shape[0]
    x2 = x.reshape(-1, K)  # (M, K)
    parts = torch.bmm(x2.view(-1, s, K // s).transpose(0, 1),  # (s, M, K/s)
                      weight.view(N, s, K // s).permute(1, 2, 0))  # (s, K/s, N) -> (s, M, N)
    out = parts.sum(0)  # (M, N)
    if bias is not None:
        out += bias
    return out.view(*lead, N)


def _time(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    return median(cuda_ms(fn, device, rounds=repeats, warmup=3))


def linears(config: GPTConfig, T: int, device: torch.device, repeats: int
            ) -> list[dict[str, Any]]:
    """Each of a GPT-2 block's four products at every split that divides its inner size."""
    C = config.n_embd
    shapes = {"q, k, v as one product": (C, 3 * C), "attention out (and q, k, v each)": (C, C),
              "MLP in": (C, 4 * C), "MLP out": (4 * C, C)}
    gen = torch.Generator(device).manual_seed(0)
    rows = []
    for name, (K, N) in shapes.items():
        x = torch.randn(T, K, device=device, generator=gen)  # (T, K)
        w = torch.randn(N, K, device=device, generator=gen) * 0.02  # (N, K)
        b = torch.randn(N, device=device, generator=gen) * 0.02  # (N,)
        exact = (x.double() @ w.double().T + b.double())  # (T, N)
        row: dict[str, Any] = {"product": name, "M": T, "K": K, "N": N, "ms": {},
                               "gflops": {}, "max_error": {}}
        for s in SPLITS:
            if K % s or (s > 1 and K // s < 64):  # parts of at least 64
                continue
            ms = _time(functools.partial(split_linear, x, w, b, s), device, repeats)
            row["ms"][s] = ms
            row["gflops"][s] = 2 * T * K * N / ms / 1e6
            row["max_error"][s] = (split_linear(x, w, b, s).double() - exact).abs().max().item()
        row["best"] = min(row["ms"], key=row["ms"].get)
        rows.append(row)
    return rows


def tf32x3_ready(device: torch.device) -> str | None:
    """Why the 3xTF32 kernel cannot run on device, or None where it can (a GPU, or a CPU
    under Triton's interpreter: the smoke test's)."""
    if importlib.util.find_spec("triton") is None:
        return "triton not installed"
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "not a CUDA device (TRITON_INTERPRET=1 runs it on a CPU)"
    return None


#: the 3xTF32 kernels' ways: x and the weight split in the kernel, or the weight split once
ON_THE_FLY, SPLIT_ONCE = "split in the kernel", "weight split once"
#: the end-to-end row of attnlab's own 3xTF32 products (`tf32x3.ENABLED`): its linears and
#: the trace's scores and context, at the tiles its rule picks
OURS = "attnlab's 3xTF32 (tf32x3.ENABLED: linears, scores, context)"


@contextmanager
def attnlab_tf32x3(device: torch.device) -> Iterator[None]:
    """attnlab's 3xTF32 products on (`tf32x3.ENABLED`) for device's tensors (a CPU's: the
    smoke run's, under Triton's interpreter), as they were again after."""
    before = tf32x3.ENABLED, tf32x3.DEVICES
    tf32x3.ENABLED, tf32x3.DEVICES = True, {device.type}
    try:
        yield
    finally:
        tf32x3.ENABLED, tf32x3.DEVICES = before
Tiles = dict[str, dict[tuple[int, int], tuple[int, int, int, int, int]]]


def tf32x3_products(rows: list[dict[str, Any]], T: int, device: torch.device,
                    repeats: int, ways: tuple[str, ...] = (ON_THE_FLY, SPLIT_ONCE)) -> Tiles:
    """Each of `linears`' products as each 3xTF32 kernel of `ways` at its tile sizes, into
    each row's "tf32x3" (way -> tiles -> ms and the error against float64, beside cuBLAS's
    at split 1); way -> (K, N) -> the fastest tiles."""
    from . import gpu_tf32x3 as kernels

    gen = torch.Generator(device).manual_seed(0)
    best: Tiles = {way: {} for way in ways}
    for row in rows:
        K, N = row["K"], row["N"]
        x = torch.randn(T, K, device=device, generator=gen)  # (T, K)
        w = torch.randn(N, K, device=device, generator=gen) * 0.02  # (N, K)
        b = torch.randn(N, device=device, generator=gen) * 0.02  # (N,)
        exact = x.double() @ w.double().T + b.double()  # (T, N)
        row["cublas_max_error"] = (F.linear(x, w, b).double() - exact).abs().max().item()
        split = kernels.split_weight(w)
        calls = {ON_THE_FLY: (kernels.CONFIGS, functools.partial(tf32x3.linear, x, w, b)),
                 SPLIT_ONCE: (kernels.SPLIT_CONFIGS,
                              functools.partial(kernels.split_linear, x, split, b))}
        row["tf32x3"] = {}
        for way in ways:
            configs, call = calls[way]
            found = {}
            for config in configs:
                error = (call(config).double() - exact).abs().max().item()
                found[config] = {"ms": _time(functools.partial(call, config), device, repeats),
                                 "max_error": error}
            row["tf32x3"][way] = {str(c): found[c] for c in configs}
            best[way][(K, N)] = min(found, key=lambda c: found[c]["ms"])
    return best


@contextmanager
def tf32x3_linears(configs: dict[tuple[int, int], tuple[int, ...]],
                   split_once: dict[int, tuple[Tensor, Tensor]] | None = None
                   ) -> Iterator[None]:
    """layers.Linear.forward as the 3xTF32 kernel at each (in, out) shape's tiles; with
    split_once (a dict the caller keeps across calls), the weight-split-once kernel, each
    module's split made at its first call and kept there."""
    from . import gpu_tf32x3 as kernels

    def forward(self: layers.Linear, x: Tensor) -> Tensor:
        config = configs[(self.in_features, self.out_features)]
        if split_once is None:
            return tf32x3.linear(x, self.weight, self.bias, config)  # type: ignore[arg-type]
        if id(self) not in split_once:
            split_once[id(self)] = kernels.split_weight(self.weight)
        return kernels.split_linear(x, split_once[id(self)], self.bias,
                                    config)  # type: ignore[arg-type]

    with linear_forward(forward):
        yield


def attention_products(config: GPTConfig, T: int, device: torch.device, repeats: int
                       ) -> list[dict[str, Any]]:
    """The trace's two products per layer: scores (scale in the product) and context, and
    the context in causal halves (the first half of the rows reads half of the keys); where
    triton runs, both as attnlab's 3xTF32 causal products (the scores with the mask's -inf
    written in the product; the context reading up to the diagonal), with their error
    against float64 beside cuBLAS's (as "max_error" and "cublas_max_error")."""
    nh, hs = config.n_head, config.n_embd // config.n_head
    gen = torch.Generator(device).manual_seed(1)
    q = torch.randn(nh, T, hs, device=device, generator=gen)
    key_t = torch.randn(nh, hs, T, device=device, generator=gen)
    weights = torch.softmax(torch.randn(nh, T, T, device=device, generator=gen), -1).tril()
    v = torch.randn(nh, T, hs, device=device, generator=gen)
    h = T // 2

    def halves() -> Tensor:
        return torch.cat([weights[:, :h, :h] @ v[:, :h], weights[:, h:] @ v], dim=1)

    calls = {
        "scores (baddbmm, scale inside)": (lambda: torch.baddbmm(
            q.new_empty(()), q, key_t, beta=0.0, alpha=hs**-0.5), 2 * nh * T * T * hs),
        "context (bmm)": (lambda: weights @ v, 2 * nh * T * T * hs),
        "context, causal halves": (halves, 2 * nh * T * T * hs),
    }
    rows = []
    for name, (fn, flop) in calls.items():
        ms = _time(fn, device, repeats)
        rows.append({"product": name, "ms": ms, "gflops": flop / ms / 1e6})
    if tf32x3_ready(device) is None:
        rows += _tf32x3_attention(q, key_t, weights, v, device, repeats)
    return rows


def _tf32x3_attention(q: Tensor, key_t: Tensor, weights: Tensor, v: Tensor,
                      device: torch.device, repeats: int) -> list[dict[str, Any]]:
    """attnlab's 3xTF32 causal scores and context (`tf32x3_triton.matmul`), timed, with
    their largest error against float64 beside cuBLAS's (the scores where not masked)."""
    from attnlab.model import tf32x3_triton

    nh, T, hs = q.shape
    hidden = ~torch.ones(T, T, dtype=torch.bool, device=device).tril()  # (T, T)
    exact_scores = (q.double() @ key_t.double() * hs**-0.5).masked_fill(hidden, 0.0)
    exact_context = weights.double() @ v.double()
    calls = {
        "scores, 3xTF32, causal in the product": (
            lambda: tf32x3_triton.matmul(q, key_t, hs**-0.5, diagonal=0), exact_scores,
            lambda: torch.baddbmm(q.new_empty(()), q, key_t, beta=0.0, alpha=hs**-0.5)),
        "context, 3xTF32, up to the diagonal": (
            lambda: tf32x3_triton.matmul(weights, v, diagonal=0, past="zero"), exact_context,
            lambda: weights @ v),
    }
    rows = []
    for name, (fn, exact, cublas) in calls.items():
        ms = _time(fn, device, repeats)
        errors = [(out.double().masked_fill(hidden, 0.0) if out.shape[-1] == T
                   else out.double()) - exact for out in (fn(), cublas())]
        rows.append({"product": name, "ms": ms, "gflops": 2 * nh * T * T * hs / ms / 1e6,
                     "max_error": errors[0].abs().max().item(),
                     "cublas_max_error": errors[1].abs().max().item()})
    return rows


def softmax_passes(config: GPTConfig, T: int, device: torch.device, repeats: int
                   ) -> list[dict[str, Any]]:
    """The trace's passes over one layer's (1, nh, T, T) scores: the causal mask's -inf
    written in place, then the softmax (what attnlab runs), against the softmax alone and
    torch's fused masked softmax (one pass; a private op, so only if it wins)."""
    gen = torch.Generator(device).manual_seed(2)
    scores = torch.randn(1, config.n_head, T, T, device=device, generator=gen)
    hidden = ~torch.ones(T, T, dtype=torch.bool, device=device).tril()  # (T, T) masked cells
    expected = torch.softmax(scores.masked_fill(hidden, float("-inf")), -1)
    calls = {
        "masked_fill_ then softmax": lambda: torch.softmax(
            scores.clone().masked_fill_(hidden, float("-inf")), -1),
        "clone alone (subtract from the above)": scores.clone,
        "softmax alone": lambda: torch.softmax(scores, -1),
        "torch._masked_softmax": lambda: torch._masked_softmax(scores, hidden, -1, 0),
    }
    rows = []
    for name, fn in calls.items():
        row: dict[str, Any] = {"pass": name, "ms": _time(fn, device, repeats)}
        if "masked" in name:
            row["max_error"] = (fn() - expected).abs().max().item()
        rows.append(row)
    return rows


@contextmanager
def patched_linears(splits: dict[tuple[int, int], int]) -> Iterator[None]:
    """layers.Linear.forward with each (in, out) shape's split from `splits`."""
    def forward(self: layers.Linear, x: Tensor) -> Tensor:
        s = splits.get((self.in_features, self.out_features), 1)
        return split_linear(x, self.weight, self.bias, s)

    with linear_forward(forward):
        yield


@contextmanager
def linear_forward(forward: Callable[[layers.Linear, Tensor], Tensor]) -> Iterator[None]:
    """layers.Linear.forward replaced by `forward` meanwhile (the probe's patches), and put
    back after."""
    plain = layers.Linear.forward
    layers.Linear.forward = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        layers.Linear.forward = plain  # type: ignore[method-assign]


@contextmanager
def fused_qkv(model: torch.nn.Module) -> Iterator[None]:
    """Each attention's query, key and value as one product (weights concatenated), as
    Hugging Face's GPT-2 and gpt-fast run them: the query's call makes all three and the key
    and value calls that follow take theirs (self-attention calls them in that order)."""
    patched = []
    for attn in (block.attn for block in model.blocks):  # type: ignore[union-attr]
        mods = (attn.query, attn.key, attn.value)
        weight = torch.cat([m.weight for m in mods])  # (d_out + 2 d_kv, C)
        bias = None if mods[0].bias is None else torch.cat([m.bias for m in mods])
        sizes = [m.out_features for m in mods]
        made: list[Tensor] = []

        def query(x: Tensor, weight: Tensor = weight, bias: Tensor | None = bias,
                  sizes: list[int] = sizes, made: list[Tensor] = made) -> Tensor:
            q, k, v = F.linear(x, weight, bias).split(sizes, dim=-1)  # (B, T, each)
            made[:] = [v, k]
            return q

        attn.query.forward = query
        attn.key.forward = attn.value.forward = lambda x, made=made: made.pop()
        patched += mods
    try:
        yield
    finally:
        for mod in patched:
            del mod.forward  # the class's forward again


def end_to_end(config: GPTConfig, T: int, device: torch.device, splits: dict[tuple[int, int], int],
               rounds: int, tf32x3: Tiles | None = None) -> dict[str, Any]:
    """Trace.run of every layer's weights: as attnlab runs it, with q, k and v as one
    product, with the fastest splits, with both, with TF32, with 3xTF32 linears at their
    fastest tiles (where given); ms (median of alternating rounds) and each one's largest
    weight difference."""
    model = random_gpt(config, device, torch.float32)
    ids = torch.randint(0, config.vocab_size, (1, T), device=device)

    @torch.inference_mode()
    def run() -> list[Tensor]:
        trace = Trace(names="attn_weights").run(model, ids)
        return [trace.get("attn_weights", i) for i in range(config.n_layer)]

    def split() -> list[Tensor]:
        with patched_linears(splits):
            return run()

    def tf32() -> list[Tensor]:
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high")  # TF32 products
        try:
            return run()
        finally:
            torch.set_float32_matmul_precision(before)

    def qkv() -> list[Tensor]:
        with fused_qkv(model):
            return run()

    def both() -> list[Tensor]:
        with fused_qkv(model), patched_linears(splits):
            return run()

    split_once: dict[int, tuple[Tensor, Tensor]] = {}  # kept across calls, as a model would

    def three() -> list[Tensor]:
        assert tf32x3 is not None
        with tf32x3_linears(tf32x3[ON_THE_FLY]):
            return run()

    def three_split() -> list[Tensor]:
        assert tf32x3 is not None
        with tf32x3_linears(tf32x3[SPLIT_ONCE], split_once):
            return run()

    def ours() -> list[Tensor]:
        with attnlab_tf32x3(device):
            return run()

    fns = {"attnlab Trace.run": run, "with q, k, v as one product": qkv,
           "with the fastest splits": split, "with both": both, "with TF32": tf32,
           **({THREE: three, THREE_SPLIT: three_split, OURS: ours} if tf32x3 else {})}
    reference = run()
    errors = {name: largest_difference(fn(), reference) for name, fn in fns.items()}
    return {"ms": alternating_ms(fns, device, rounds),
            "max_weight_error_vs_float32": errors, "splits": {str(k): v for k, v in splits.items()}}


def run(smoke: bool, device: torch.device, out: Path | None = None) -> dict[str, Any]:
    """Every part of the probe, written to out after each (a call stopped by its time limit
    keeps what it finished)."""
    config, T = (TOY, 64) if smoke else (GPT2, 1024)  # 64: tf32x3.MIN_ROWS
    repeats, rounds = (2, 1) if smoke else (REPEATS, ROUNDS)
    result: dict[str, Any] = {"probe": "gpu_gemm", "machine": gpu_machine(device), "T": T,
                              "float32_matmul_precision": torch.get_float32_matmul_precision()}
    result["linears"] = products = linears(config, T, device, repeats)
    write_partial(out, result)
    splits = {(row["K"], row["N"]): row["best"] for row in products}
    why_not = tf32x3_ready(device)
    tiles = None if why_not else tf32x3_products(products, T, device, repeats)
    result["tf32x3"] = why_not or {way: {str(k): v for k, v in best.items()}
                                   for way, best in (tiles or {}).items()}
    write_partial(out, result)
    result["attention"] = attention_products(config, T, device, repeats)
    result["softmax"] = softmax_passes(config, T, device, repeats)
    write_partial(out, result)
    result["trace"] = end_to_end(config, T, device, splits, rounds, tiles)
    write_partial(out, result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_gemm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes: the code paths")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_gemm: no CUDA GPU here; --smoke --device cpu runs its code paths")
        return 0
    result = run(args.smoke, device, args.out)
    for row in result["linears"]:
        print(f"{row['product']:24} best split {row['best']}: "
              + "  ".join(f"s={s} {ms:.3f} ms" for s, ms in row["ms"].items()))
        for way, configs in row.get("tf32x3", {}).items():
            for config, found in configs.items():
                print(f"{'':24} 3xTF32, {way}, {config}: {found['ms']:.3f} ms, error "
                      f"{found['max_error']:.2e} (cuBLAS {row['cublas_max_error']:.2e})")
    for row in result["attention"]:
        print(f"{row['product']:32} {row['ms']:.3f} ms  {row['gflops']:,.0f} GFLOP/s")
    for row in result["softmax"]:
        print(f"{row['pass']:40} {row['ms']:.3f} ms  error {row.get('max_error', '-')}")
    print(json.dumps(result["trace"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
