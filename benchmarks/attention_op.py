"""Attention op: `attend` explicit vs fused vs `F.scaled_dot_product_attention` itself.

Causal self-attention on q, k, v of shape (B, nh, T, hs), forward alone and forward +
backward. The explicit path materialises the (B, nh, T, T) scores and weights (it is the one
a trace can see into); the fused path is SDPA, which skips the masked half of the scores.
The target is explicit within 2x of fused at T=256.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from attnlab.model.attention import attend
from attnlab.model.masks import build_mask

from .common import alternate, clock, machine, median_ms, table

SIZES = (64, 128, 256, 512, 1024)
TARGET_T, TARGET_RATIO = 256, 2.0


def _variants(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backward: bool
) -> dict[str, Any]:
    T = q.shape[2]
    mask = build_mask(T, T, device=q.device)
    grad_out = torch.randn_like(q)

    def step(fn: Any) -> Any:
        if not backward:
            def forward() -> None:
                with torch.no_grad():
                    fn()
            return forward

        def forward_backward() -> None:
            fn().backward(grad_out)
            for t in (q, k, v):
                t.grad = None
        return forward_backward

    return {
        "explicit": step(lambda: attend(q, k, v, mask, fused=False)),
        "fused": step(lambda: attend(q, k, v, mask, fused=True)),
        "sdpa": step(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    }


def run(
    quick: bool = False,
    *,
    sizes: tuple[int, ...] | None = None,
    batch: int = 8,
    n_head: int = 4,
    head_size: int = 32,
    rounds: int | None = None,
) -> dict[str, Any]:
    sizes = sizes or ((64, 128) if quick else SIZES)
    rows: list[list[Any]] = []
    records: list[dict[str, Any]] = []
    clk = clock()
    gen = torch.Generator().manual_seed(0)
    for T in sizes:
        for backward in (False, True):
            q, k, v = (
                torch.randn(batch, n_head, T, head_size, generator=gen).requires_grad_(backward)
                for _ in range(3)
            )
            n = rounds or (3 if quick else max(5, min(30, 30 * 256 // T)))
            times = alternate(_variants(q, k, v, backward), rounds=n, warmup=2)
            ms = {name: median_ms(t[clk]) for name, t in times.items()}
            wall = {name: median_ms(t["wall"]) for name, t in times.items()}
            mode = "fwd+bwd" if backward else "fwd"
            records.append({"T": T, "mode": mode, "ms": ms, "wall_ms": wall, "rounds": n})
            rows.append([T, mode, ms["explicit"], ms["fused"], ms["sdpa"],
                         ms["explicit"] / ms["fused"], ms["fused"] / ms["sdpa"]])
    notes = [
        f"B={batch}, nh={n_head}, hs={head_size}, causal, float32, "
        f"{torch.get_num_threads()} thread(s); median of alternating rounds of "
        f"{'CPU time (one thread on a shared machine)' if clk == 'cpu' else 'wall time'}.",
    ]
    target = [r for r in records if r["T"] == TARGET_T]
    met = None
    if target:
        worst = max(r["ms"]["explicit"] / r["ms"]["fused"] for r in target)
        met = worst <= TARGET_RATIO
        notes.append(f"target: explicit <= {TARGET_RATIO}x fused at T={TARGET_T}: "
                     f"{'met' if met else 'missed'} (worst of fwd, fwd+bwd: {worst:.2f}x)")
    return {
        "suite": "attention",
        "machine": machine(),
        "config": {"batch": batch, "n_head": n_head, "head_size": head_size, "sizes": sizes},
        "clock": clk,
        "records": records,
        "target_met": met,
        "tables": [table(
            "Attention op (ms, median)",
            ["T", "pass", "explicit", "fused", "SDPA", "explicit/fused", "fused/SDPA"],
            rows,
        )],
        "notes": notes,
    }
