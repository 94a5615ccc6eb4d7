"""What a generation allocates beside the weights, for a load's fit check."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from ..model.decode import decodes_by_forward
from ..model.gpt import GPT, GPTConfig
from ..model.memory import Use, capped_scores

if TYPE_CHECKING:
    from ..model.attention import CausalSelfAttention
    from ..model.block import Block


def cache_numbers(c: GPTConfig) -> int:
    """The numbers `model.new_cache` holds a position, every layer's: latent attention's
    latent and RoPE part (`KVCache.latent`), else each key/value head's k and v."""
    if c.kv_latent is not None:
        return c.n_layer * (c.kv_latent + c.rope_head_dim)
    return c.n_layer * 2 * c.n_kv_heads * c.head_size


def generation_memory(model: GPT, batch_size: int, length: int, *, prompt: int = 0,
                      device: str | torch.device | None = None,
                      float16_weights: bool = False) -> list[Use]:
    """What generating `batch_size` rows of `length` tokens (prompt + new) allocates beside
    the weights, for a load's fit check (`OpenedCheckpoint.load(uses=...)`; `model` may be
    on the meta device): the KV cache (`_steps`' `model.new_cache`), the decode step's q/k/v
    matrices stacked into one per layer (`DecodeStep`, kept with the model), with a
    soft-capped model the prefill's scores over the longest `prompt` on `device`
    (`capped_scores`), and with `float16_weights` the packed float16 copy of every matrix
    (`decode.half_weights`)."""
    c = model.config
    slots = min(length, c.block_size)
    cache = batch_size * slots * cache_numbers(c)
    stacked = 0 if decodes_by_forward(model) else sum(
        sum(m.weight.numel() for m in (a.query, a.key, a.value)) for a in (
            cast("CausalSelfAttention", b.attn) for b in cast("list[Block]", list(model.blocks))))
    rows = f"{batch_size} row{'s' if batch_size != 1 else ''}"
    uses = [Use(f"the KV cache for {rows} of {slots:,} positions", elements=cache),
            Use("the decode step's stacked q/k/v matrices", elements=stacked)]
    scores = capped_scores(c, min(prompt, c.block_size), batch_size, device)
    if scores:
        uses.append(Use(f"the capped attention scores of a {prompt:,}-token prefill",
                        elements=scores, fix="a shorter prompt, or fewer rows (--batch_size)"))
    if float16_weights:
        matrices = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
        uses.append(Use("the packed float16 copies of the matrices", nbytes=2 * matrices))
    return uses
