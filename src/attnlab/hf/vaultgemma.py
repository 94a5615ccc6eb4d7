"""VaultGemmaForCausalLM (Google's VaultGemma-1B, trained with differential privacy): Gemma
2's blocks without the norms on the branches' outputs (`sandwich_norm=False`): a norm before
the attention (`input_layernorm`) and one before the MLP (`pre_feedforward_layernorm`), the
soft caps, query_pre_attn_scalar and the windowed layers as Gemma 2 has them.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .gemma2 import IRRELEVANT, gemma2_config, gemma2_to_hf
from .gemma3 import WEIGHTS
from .registry import Family


def _config(f: Fields) -> dict[str, Any]:
    return gemma2_config(f, sandwich_norm=False)


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return gemma2_to_hf(c, VAULTGEMMA)


VAULTGEMMA = Family(
    name="vaultgemma", model_type="vaultgemma", architecture="VaultGemmaForCausalLM",
    base_architecture="VaultGemmaModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
