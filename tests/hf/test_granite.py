"""Granite (`hf/granite.py`): a config of Granite-3.3-2B's shape and scalars read as
transformers reads it, its tensors named and shaped as transformers' GraniteForCausalLM holds
them, and the three scalars refused by every other family. The family suite
(test_hf_families.py's "granite-*" cases) checks logits, traces and generation against
transformers; tests/interp/test_lens.py the logit lens and attribution with the scalars."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from attnlab import GPTConfig
from attnlab.hf import FAMILY_BY_NAME, config_from_hf, config_to_hf, family_for_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.loading import hf_shapes

from helpers import transformers_shapes

#: Granite-3.3-2B's shape and scalars, as its config.json gives them
GRANITE_3_3_2B = {
    "architectures": ["GraniteForCausalLM"], "attention_multiplier": 0.015625,
    "bos_token_id": 0, "embedding_multiplier": 12.0, "eos_token_id": 0, "hidden_size": 2048,
    "intermediate_size": 8192, "logits_scaling": 8.0, "max_position_embeddings": 131072,
    "model_type": "granite", "num_attention_heads": 32, "num_hidden_layers": 40,
    "num_key_value_heads": 8, "residual_multiplier": 0.22, "rms_norm_eps": 1e-05,
    "rope_theta": 10000000.0, "tie_word_embeddings": True, "vocab_size": 49159,
}


def test_granite_reads_as_transformers_reads_it() -> None:
    config = config_from_hf(GRANITE_3_3_2B)
    assert (config.attn_scale, config.embedding_multiplier, config.residual_multiplier,
            config.logits_scaling, config.rope_theta) == (0.015625, 12.0, 0.22, 8.0, 1e7)
    assert family_for_config(config).name == "granite"
    assert config_from_hf(config_to_hf(config)) == config
    assert hf_shapes(GRANITE_3_3_2B) == transformers_shapes(GRANITE_3_3_2B)[0]


@pytest.mark.parametrize("scalar", ["embedding_multiplier", "residual_multiplier",
                                    "logits_scaling"])
def test_a_scalar_is_refused_by_every_other_family(scalar: str) -> None:
    llama = dataclasses.replace(config_from_hf(GRANITE_3_3_2B), attn_scale=None,
                                embedding_multiplier=1.0, residual_multiplier=1.0,
                                logits_scaling=1.0)
    assert family_for_config(llama).name == "llama"
    scaled = dataclasses.replace(llama, **{scalar: 2.0})
    assert family_for_config(scaled).name == "granite"
    for name, family in FAMILY_BY_NAME.items():
        misfits = family.misfits(scaled)
        if name == "granite":
            assert misfits == []
        elif name == "falcon":  # its first architecture has no grouped-query attention
            assert misfits[0].startswith("a config.json it can read back (falcon config.json "
                                         "has num_kv_heads=8"), misfits
        elif name == "granitemoe":  # the scalars too, with a mixture of experts for the MLP
            assert misfits == ["n_experts=8 (not None)"], misfits
        elif name == "minicpm3":  # the scalars too, with latent attention (and its own head)
            assert f"{scalar}=1.0 (not 2.0)" not in misfits and any(
                m.startswith("kv_latent=") for m in misfits), misfits
        else:
            assert f"{scalar}=1.0 (not 2.0)" in misfits, name


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), float("nan"), True, "8"])
def test_a_scalar_that_is_no_positive_number_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"logits_scaling=.* must be a positive finite number"):
        GPTConfig(logits_scaling=value)  # type: ignore[arg-type]
