"""Falcon (`hf/falcon.py`): a config of Falcon-7B's shape and switches read as transformers
reads it, its tensors named and shaped as transformers' FalconForCausalLM holds them, and the
later architecture and ALiBi refused by name. The family suite (test_hf_families.py's
"falcon-*" cases) checks logits, traces and generation against transformers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from attnlab.hf import config_from_hf, config_to_hf, family_for_config
from helpers import transformers_shapes

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.loading import hf_shapes

#: Falcon-7B's shape and switches, as its config.json gives them
FALCON_7B = {
    "alibi": False, "apply_residual_connection_post_layernorm": False,
    "architectures": ["FalconForCausalLM"], "attention_dropout": 0.0, "bias": False,
    "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0, "hidden_size": 4544,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon",
    "multi_query": True, "new_decoder_architecture": False, "num_attention_heads": 71,
    "num_hidden_layers": 32, "parallel_attn": True, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 65024,
}


def test_falcon_7b_reads_as_transformers_reads_it() -> None:
    config = config_from_hf(FALCON_7B)
    assert (config.n_head, config.n_kv_heads, config.head_size, config.ff_size) == (
        71, 1, 64, 4 * 4544)
    assert (config.parallel_residual, config.shared_norm, config.bias, config.norm_biased,
            config.gelu, config.tie_weights) == (True, True, False, True, "exact", True)
    assert family_for_config(config).name == "falcon"
    assert config_from_hf(config_to_hf(config)) == config
    assert hf_shapes(FALCON_7B) == transformers_shapes(FALCON_7B)[0]


@pytest.mark.parametrize("field, why", [("new_decoder_architecture", "later blocks"),
                                        ("alibi", "not ALiBi")])
def test_the_later_architecture_and_alibi_are_refused_by_name(field: str, why: str) -> None:
    with pytest.raises(ValueError, match=f"{field}=True.*{why}"):
        config_from_hf({**FALCON_7B, field: True})
