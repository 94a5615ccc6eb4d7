"""VaultGemmaForCausalLM (Google's VaultGemma-1B, trained with differential privacy): Gemma
2's blocks without the norms on the branches' outputs (`sandwich_norm=False`): a norm before
the attention (`input_layernorm`) and one before the MLP (`pre_feedforward_layernorm`), the
soft caps, query_pre_attn_scalar and the windowed layers as Gemma 2 has them.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .gemma2 import IRRELEVANT, soft_cap_field
from .gemma3 import WEIGHTS, sandwich_config, sandwich_to_hf
from .registry import Family


def _config(f: Fields) -> dict[str, Any]:
    return sandwich_config(
        f, max_positions=8192, pattern=2, sandwich_norm=False,  # Gemma2Config's pattern
        attn_logit_softcapping=soft_cap_field(f, "attn_logit_softcapping", 50.0),
        final_logit_softcapping=soft_cap_field(f, "final_logit_softcapping", 30.0))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return sandwich_to_hf(c, VAULTGEMMA, attn_logit_softcapping=c.attn_logit_softcapping,
                          final_logit_softcapping=c.final_logit_softcapping)


VAULTGEMMA = Family(
    name="vaultgemma", model_type="vaultgemma", architecture="VaultGemmaForCausalLM",
    base_architecture="VaultGemmaModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
