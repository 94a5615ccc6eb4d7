"""hf/ministral.py: a config.json that says model_type "mistral" and writes layer_types (as
Ministral-8B's does) is read as Ministral, windows on the layers it names, as transformers'
AutoConfig reads it; a plain Mistral stays Mistral."""

from __future__ import annotations

import pytest

from attnlab.hf import config_from_hf, family_of

MISTRAL = {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
           "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 97,
           "sliding_window": 4}


def test_a_mistral_with_layer_types_is_read_as_ministral() -> None:
    types = ["sliding_attention", "full_attention", "sliding_attention"]
    config = {**MISTRAL, "layer_types": types}
    assert family_of(config).name == "ministral"
    c = config_from_hf(config)
    assert (c.sliding_window, c.window_layers) == (4, [0, 2])
    assert family_of(MISTRAL).name == "mistral"
    assert config_from_hf(MISTRAL).window_layers is None


def test_layer_types_naming_a_window_without_one_are_refused() -> None:
    config = {**MISTRAL, "sliding_window": None, "layer_types": ["sliding_attention"] * 3}
    with pytest.raises(ValueError, match=r"layer_types=.*need a sliding_window"):
        config_from_hf(config)
