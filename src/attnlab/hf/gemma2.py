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


def soft_cap_field(f: Fields, key: str, default: float) -> float | None:
    """A soft cap: the field's value, null for none, Gemma2Config's default when absent."""
    if key not in f.hf:
        return default
    return None if f.get(key) is None else f.number(key, default)


def _config(f: Fields) -> dict[str, Any]:
    return sandwich_config(
        f, max_positions=8192, pattern=2,  # Gemma2Config: every other layer windowed
        attn_logit_softcapping=soft_cap_field(f, "attn_logit_softcapping", 50.0),
        final_logit_softcapping=soft_cap_field(f, "final_logit_softcapping", 30.0),
    )


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return sandwich_to_hf(c, GEMMA2, attn_logit_softcapping=c.attn_logit_softcapping,
                          final_logit_softcapping=c.final_logit_softcapping)


GEMMA2 = Family(
    name="gemma2", model_type="gemma2", architecture="Gemma2ForCausalLM",
    base_architecture="Gemma2Model", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
