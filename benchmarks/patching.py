"""Activation patching: the grid `attnlab patch` draws, against TransformerLens's, same weights.

The grid: every head's output ("context", TransformerLens's hook_z) at every position, and
the residual stream entering every layer ("resid_pre") at each position, each patched alone
from a clean run into a corrupted one and scored by the logit difference at the last
position, normalized ((patched - corrupted) / (clean - corrupted)). One GPT-2-small-shaped
model with random weights (transformers, GPT-2's initializer 0.02, copied into attnlab with
`gpt_from_hf`; TransformerLens boots the same weights from a `save_pretrained` directory),
a clean and a corrupted prompt of 20 random tokens (the IOI prompts' length), batch 1, one
torch thread, no autograd, in alternating rounds. Every row runs the clean and the corrupted
run too. Rows:

- attnlab `activation_patching` as it runs by default: up to 32 patches per forward pass,
  the last position's logits alone, each pass started at the lowest layer it patches from
  the corrupted run's residual stream there;
- the same with every pass from the embeddings (`patching.RESTARTS = False`);
- one pass per patch (`batch=1`), and one pass per patch from the embeddings with every
  position's logits: how attnlab ran before batching, and how TransformerLens runs;
- attnlab `attribution_patching`: all the effects to first order, from one forward and
  backward pass (an estimate, not the grid);
- TransformerLens `patching.get_act_patch_attn_head_out_all_pos` and
  `get_act_patch_resid_pre` after `run_with_cache` on the clean prompt (where it imports:
  `pip install -e ".[bench]"`).

Each row's effects are compared with the default's (largest absolute difference). No target:
the issue that asked for faster patching set none.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Callable
from typing import Any

import torch

from attnlab.hf import gpt_from_hf
from attnlab.interp import patching
from attnlab.interp.patching import LogitDiff, Patching
from attnlab.model.runtime import one_thread

from .common import alternate, clock, machine, median_ms, package_version, table
from .trace import SHAPES

DEFAULT = "attnlab activation_patching"
TL = "TransformerLens get_act_patch (head outputs + resid_pre)"
ANSWER, WRONG = 5, 7  # the metric's two token ids


def _hf_model(shape: str, block_size: int) -> Any:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        **SHAPES[shape], n_positions=block_size, initializer_range=0.02,
        bos_token_id=None, eos_token_id=None, attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(config).eval()


def attnlab_rows(model: Any, clean: torch.Tensor, corrupt: torch.Tensor
                 ) -> dict[str, Callable[[], Patching]]:
    """name -> a call of attnlab's patching that returns its grid."""
    last = LogitDiff(ANSWER, WRONG, position=-1)

    def every(logits: torch.Tensor) -> torch.Tensor:  # no last_logits_only: every position
        return last(logits)

    def grid(metric: Any = last, batch: int | None = None,
             restarts: bool = True) -> Callable[[], Patching]:
        def go() -> Patching:
            before, patching.RESTARTS = patching.RESTARTS, restarts
            try:
                return patching.activation_patching(model, clean, corrupt, metric, batch=batch)
            finally:
                patching.RESTARTS = before
        return go

    return {
        DEFAULT: grid(),
        "attnlab, every pass from the embeddings": grid(restarts=False),
        "attnlab, one pass per patch": grid(batch=1),
        "attnlab, one pass per patch from the embeddings, every position's logits":
            grid(every, batch=1, restarts=False),
        "attnlab attribution_patching (first order, one backward)":
            lambda: patching.attribution_patching(model, clean, corrupt, last),
    }


def tl_row(hf: Any, clean: torch.Tensor, corrupt: torch.Tensor, tmp: str
           ) -> Callable[[], Patching]:
    """TransformerLens's two grids, normalized as attnlab's, from its own clean cache."""
    import transformer_lens.patching as tl_patching
    from transformer_lens.model_bridge import TransformerBridge

    hf.save_pretrained(tmp)
    bridge = TransformerBridge.boot_transformers(tmp, device="cpu")
    bridge.eval()

    def diff(logits: torch.Tensor) -> torch.Tensor:
        return (logits[:, -1, ANSWER] - logits[:, -1, WRONG]).mean()

    def go() -> Patching:
        with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):  # its tqdm bars
            clean_logits, cache = bridge.run_with_cache(clean)
            good, bad = float(diff(clean_logits)), float(diff(bridge(corrupt)))

            def metric(logits: torch.Tensor) -> torch.Tensor:
                return (diff(logits) - bad) / (good - bad)

            heads = tl_patching.get_act_patch_attn_head_out_all_pos(bridge, corrupt, cache,
                                                                    metric)
            resid = tl_patching.get_act_patch_resid_pre(bridge, corrupt, cache, metric)
        return Patching(heads, resid, good, bad)
    return go


def run(quick: bool = False) -> dict[str, Any]:
    """Time every row on one torch thread; quick: the toy shape, one round."""
    with one_thread():
        return _run(quick)


def _run(quick: bool) -> dict[str, Any]:
    shape, T, rounds = ("toy", 8, 1) if quick else ("gpt2", 20, 3)
    hf = _hf_model(shape, block_size=64)
    clean, corrupt = torch.randint(0, hf.config.vocab_size, (2, 1, T),
                                   generator=torch.Generator().manual_seed(1))
    model = gpt_from_hf(hf.config.to_dict(), hf.state_dict()).eval()
    with tempfile.TemporaryDirectory() as tmp:
        fns = attnlab_rows(model, clean, corrupt)
        if package_version("transformer-lens"):
            fns[TL] = tl_row(hf, clean, corrupt, tmp)
        grids = {name: fn() for name, fn in fns.items()}  # the warmup calls
        times = alternate(dict(fns), rounds=rounds, warmup=0)
    ms = {name: median_ms(t[clock()]) for name, t in times.items()}
    ref = grids[DEFAULT]
    diffs = {name: max((g.heads - ref.heads).abs().max().item(),
                       (g.resid - ref.resid).abs().max().item()) for name, g in grids.items()}
    runs = ref.heads.numel() + ref.resid.numel()
    rows = [[name, ms[name] / 1e3, ms[name] / runs, ms[name] / ms[DEFAULT], diffs[name]]
            for name in fns]
    ratios = {name: ms[name] / ms[DEFAULT] for name in fns if name != DEFAULT}
    versions = {p: package_version(p) for p in ("torch", "transformers", "transformer-lens")}
    c = model.config
    notes = [
        f"{shape} shape ({c.n_layer} layers x {c.n_head} heads + {c.n_layer} layers x {T} "
        f"positions = {runs} patched runs), random weights, batch 1, T={T}, one torch "
        f"thread; median {clock()} time of {rounds} alternating round(s). Versions: "
        + ", ".join(f"{p} {v}" for p, v in versions.items() if v)
        + ("" if versions["transformer-lens"] else " (TransformerLens not installed: no row)")
        + ".",
        f"clean - corrupted logit difference: {ref.clean - ref.corrupted:.3g}; effects differ "
        "from the default's by the last column (attribution: a first-order estimate, not the "
        "same numbers).",
        "ratios (each row's time over the default's): "
        + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()),
    ]
    return {
        "suite": "patching", "machine": machine(), "versions": versions, "ms": ms,
        "ratios": ratios, "max_effect_difference": diffs, "runs": runs,
        "tables": [table(f"Activation patching grid ({shape}, T={T})",
                         ["variant", "s", "ms per effect", "x default",
                          "max |effect - default's|"], rows)],
        "notes": notes,
    }
