"""Gemma2ForCausalLM (gemma-2-2b, Gemma Scope's model): Gemma's scaled embeddings, (1 + w)
RMSNorm and GeGLU, Gemma 3's sandwich norms and weight names, scores scaled by
query_pre_attn_scalar ** -0.5, a sliding window on every other layer (the first, third, ...:
`layer_types`), one RoPE for all layers, and soft caps: cap * tanh(x / cap) on the attention
scores (`attn_logit_softcapping`, 50 where the field is absent) and on the logits
(`final_logit_softcapping`, 30), which send every attention through the explicit path
(docs/models.md#soft-capping).
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .gemma3 import WEIGHTS, sandwich_config, sandwich_to_hf
from .registry import Family

# hub configs carry hidden_act beside hidden_activation, which Gemma 2's MLP reads in
# transformers 5; and ask generate for the sliding-window cache (attnlab has its own)
IRRELEVANT = frozenset({"hidden_act", "cache_implementation"})


def gemma2_config(f: Fields, **switches: Any) -> dict[str, Any]:
    """GPTConfig keyword arguments for Gemma 2's blocks, a family's `switches` in place of
    its own (VaultGemma's sandwich_norm=False)."""
    return sandwich_config(
        f, max_positions=8192, pattern=2,  # Gemma2Config: every other layer windowed
        attn_logit_softcapping=f.positive_or_none("attn_logit_softcapping", 50.0),
        final_logit_softcapping=f.positive_or_none("final_logit_softcapping", 30.0),
        **switches)


def gemma2_to_hf(c: GPTConfig, family: Family) -> dict[str, Any]:
    """`gemma2_config` the other way, as `family`."""
    return sandwich_to_hf(c, family, attn_logit_softcapping=c.attn_logit_softcapping,
                          final_logit_softcapping=c.final_logit_softcapping)


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return gemma2_to_hf(c, GEMMA2)


GEMMA2 = Family(
    name="gemma2", model_type="gemma2", architecture="Gemma2ForCausalLM",
    base_architecture="Gemma2Model", config_from_hf=gemma2_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
