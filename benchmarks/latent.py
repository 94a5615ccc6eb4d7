"""Decoding over a long cache with multi-head latent attention (DeepSeek-V2-Lite's attention:
2048 wide, 16 heads of 192 dims (64 turned by RoPE), values 128 wide, a 512-wide kv latent,
q straight from x), two dense layers, random float32 weights, batch 1.

Per decode step after a prompt of P tokens: attnlab's latent cache (the latents and RoPE parts
alone, `KVCache.latent`) attending in the latent space where that costs less (`LatentAttention
.absorbs`: every step here), the same cache expanded into every head's k and v at each step
(`absorb = False`, what transformers does), attnlab's per-head cache (`per_head=True`), and
transformers' DeepseekV2 with its cache (the latents, expanded at each step), side by side in
alternating rounds of STEPS steps each. Also the cache's bytes a position and the largest
difference of each variant's logits from the per-head cache's.

    python -m benchmarks latent [--quick]
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from attnlab import GPT
from attnlab.hf import gpt_from_hf

from .common import alternate, clock, machine, median_ms, note, table

FIELDS: dict[str, Any] = dict(
    vocab_size=2000, hidden_size=2048, intermediate_size=1408, num_hidden_layers=2,
    num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None,
    qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, first_k_dense_replace=1,
    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
    max_position_embeddings=16384, initializer_range=0.02, bos_token_id=None,
    eos_token_id=None, pad_token_id=0)
STEPS = 4  # decode steps per timed call


def build_pair() -> tuple[Any, GPT]:
    """(transformers DeepseekV2ForCausalLM, attnlab GPT) with the same random weights."""
    import transformers

    torch.manual_seed(0)
    config = transformers.DeepseekV2Config(**FIELDS)
    hf = transformers.DeepseekV2ForCausalLM(config).eval()
    return hf, gpt_from_hf(config.to_dict(), hf.state_dict()).eval()


def _ours(model: GPT, prompt: torch.Tensor, steps: torch.Tensor, *, per_head: bool,
          absorb: bool | None) -> tuple[Callable[[], torch.Tensor], int]:
    """A call running the STEPS decode steps after the prompt (its cache filled once), and
    the cache's bytes a position."""
    P = prompt.shape[1]
    cache = model.new_cache(1, P + STEPS, per_head=per_head)
    for block in model.blocks:
        block.attn.absorb = absorb  # type: ignore[union-attr]
    with torch.inference_mode():
        model(prompt, kv_cache=cache)

    @torch.inference_mode()
    def run() -> torch.Tensor:
        for block in model.blocks:  # the model is shared: each variant sets its own way
            block.attn.absorb = absorb  # type: ignore[union-attr]
        cache.seq_len = P  # the same P cached positions at every call
        logits = [model(steps[:, t:t + 1], kv_cache=cache).logits[:, -1] for t in range(STEPS)]
        return torch.stack(logits, 1)  # (1, STEPS, V)

    return run, cache.nbytes() // (P + STEPS)


def _theirs(hf: Any, prompt: torch.Tensor, steps: torch.Tensor) -> Callable[[], torch.Tensor]:
    P = prompt.shape[1]
    # transformers 5.24 renamed past_key_values to cache (the old name warns)
    name = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    with torch.inference_mode():
        cache = getattr(hf(prompt, use_cache=True), name)

    @torch.inference_mode()
    def run() -> torch.Tensor:
        grown = cache.get_seq_length() - P
        if grown:  # transformers 5 crops a count of tokens off the end
            cache.crop(-grown)
        logits = [hf(steps[:, t:t + 1], use_cache=True, **{name: cache}).logits[:, -1]
                  for t in range(STEPS)]
        return torch.stack(logits, 1)  # (1, STEPS, V)

    return run


def measure(hf: Any, ours: GPT, P: int, rounds: int) -> dict[str, Any]:
    """Milliseconds a decode step after P cached tokens, per variant."""
    gen = torch.Generator().manual_seed(P)
    prompt = torch.randint(1, FIELDS["vocab_size"], (1, P), generator=gen)
    steps = torch.randint(1, FIELDS["vocab_size"], (1, STEPS), generator=gen)
    note(f"latent: prefilling {P} tokens four times")
    latent, latent_bytes = _ours(ours, prompt, steps, per_head=False, absorb=None)
    expanded, _ = _ours(ours, prompt, steps, per_head=False, absorb=False)
    heads, head_bytes = _ours(ours, prompt, steps, per_head=True, absorb=None)
    fns = {"latent cache, absorbed": latent, "latent cache, expanded": expanded,
           "per-head cache": heads, "transformers": _theirs(hf, prompt, steps)}
    reference = heads()
    differences = {name: (fn() - reference).abs().max().item() for name, fn in fns.items()}
    times = {name: t[clock()] for name, t in alternate(fns, rounds=rounds, warmup=0).items()}
    return {"prompt": P, "ms_per_step": {n: median_ms(t) / STEPS for n, t in times.items()},
            "bytes_per_position": {"latent": latent_bytes, "per_head": head_bytes},
            "max_logit_difference": differences}


def run(quick: bool = False) -> dict[str, Any]:
    prompts, rounds = ((64, 256), 1) if quick else ((1024, 4096, 8192), 3)
    hf, ours = build_pair()
    records = [measure(hf, ours, P, rounds) for P in prompts]
    names = list(records[0]["ms_per_step"])
    rows = [[f"{r['prompt']:,}", *(f"{r['ms_per_step'][n]:.1f}" for n in names),
             f"{r['ms_per_step']['transformers'] / r['ms_per_step'][names[0]]:.1f}x",
             f"{r['bytes_per_position']['latent'] / 1024:.1f} / "
             f"{r['bytes_per_position']['per_head'] / 1024:.1f}"] for r in records]
    worst = max(d for r in records for d in r["max_logit_difference"].values())
    return {
        "suite": "latent", "machine": machine(), "records": records,
        "tables": [table(
            "Decoding over a long cache with latent attention (DeepSeek-V2-Lite's attention, "
            "2 layers, float32, batch 1): ms a step",
            ["cached tokens", *names, "transformers / absorbed", "cache KiB a position: "
             "latent / per head"], rows)],
        "notes": [
            f"random weights; {STEPS} steps a timed call, median {clock()} time of {rounds} "
            f"alternating round(s), {torch.get_num_threads()} torch thread(s); transformers "
            "runs its default attention (SDPA) and keeps the latents, expanding them at each "
            "step.",
            f"every variant's logits within {worst:.1e} of the per-head cache's (float32).",
        ],
    }
