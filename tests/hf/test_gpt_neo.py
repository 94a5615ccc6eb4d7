"""GPT-Neo (`hf/gpt_neo.py`): TinyStories-1M's and GPT-Neo-125M's config.json as published
read as transformers reads them, the tensors named and shaped as transformers'
GPTNeoForCausalLM holds them, `attention_types` checked and written back. The family suite
(test_hf_families.py's "gpt_neo-*" cases) checks logits, traces and generation against
transformers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from attnlab import inspect_dir
from attnlab.hf import config_from_hf, config_to_hf, family_for_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.loading import hf_shapes

from helpers import sparse_dir_with_tokenizer, transformers_shapes

#: roneneldan/TinyStories-1M's config.json as published
TINYSTORIES_1M = {
    "architectures": ["GPTNeoForCausalLM"], "activation_function": "gelu_new",
    "attention_dropout": 0, "attention_layers": ["global", "local"] * 4,
    "attention_types": [[["global", "local"], 4]], "bos_token_id": 50256, "embed_dropout": 0,
    "eos_token_id": 50256, "intermediate_size": None, "layer_norm_epsilon": 1e-5,
    "max_position_embeddings": 2048, "model_type": "gpt_neo", "hidden_size": 64,
    "num_layers": 8, "num_heads": 16, "resid_dropout": 0, "torch_dtype": "float32",
    "use_cache": True, "vocab_size": 50257, "window_size": 256,
}
#: EleutherAI/gpt-neo-125M's
GPT_NEO_125M = {
    "activation_function": "gelu_new", "architectures": ["GPTNeoForCausalLM"],
    "attention_dropout": 0, "attention_layers": ["global", "local"] * 6,
    "attention_types": [[["global", "local"], 6]], "bos_token_id": 50256, "embed_dropout": 0,
    "eos_token_id": 50256, "gradient_checkpointing": False, "hidden_size": 768,
    "initializer_range": 0.02, "intermediate_size": None, "layer_norm_epsilon": 1e-05,
    "max_position_embeddings": 2048, "model_type": "gpt_neo", "num_heads": 12,
    "num_layers": 12, "resid_dropout": 0, "use_cache": True, "vocab_size": 50257,
    "window_size": 256,
}


def test_tinystories_config_as_published_reads_as_gpt_neo() -> None:
    config = config_from_hf(TINYSTORIES_1M)
    assert (config.n_layer, config.n_head, config.n_embd, config.head_size, config.ff_size) == (
        8, 16, 64, 4, 256)
    assert (config.pos, config.attn_scale, config.qkv_bias, config.out_bias, config.gelu,
            config.tie_weights, config.scores_in_float32) == (
        "learned", 1.0, False, True, "tanh", True, True)
    assert (config.sliding_window, config.window_layers) == (256, [1, 3, 5, 7])
    assert config_to_hf(config)["attention_types"] == [[["global", "local"] * 4, 1]]
    assert config_from_hf(config_to_hf(config)) == config


def test_gpt_neo_125ms_tensors_are_transformers_names_and_shapes(tmp_path: Path) -> None:
    shapes, count = transformers_shapes(GPT_NEO_125M)
    assert hf_shapes(GPT_NEO_125M) == shapes and count == 125_198_592
    info = inspect_dir(sparse_dir_with_tokenizer(tmp_path / "gpt-neo-125m", GPT_NEO_125M))
    assert (info.family, info.parameters) == ("gpt_neo", 125_198_592)


@pytest.mark.parametrize("types", [
    [[["global", "local"], 3]],  # 6 kinds for 8 layers
    [[["global", "sliding"], 4]],
    [["global", 8]],
    "global",
    [[["local"], True]],
])
def test_attention_types_that_do_not_give_one_kind_per_layer_are_refused(types: object) -> None:
    with pytest.raises(ValueError, match=r"attention_types=.*expected \[\[kinds, repeats\]"):
        config_from_hf({**TINYSTORIES_1M, "attention_types": types})


def test_all_global_layers_have_no_window_and_export_back() -> None:
    config = config_from_hf({**TINYSTORIES_1M, "attention_types": [[["global"], 8]]})
    assert (config.sliding_window, config.window_layers) == (None, None)
    assert family_for_config(config).name == "gpt_neo"
    assert config_to_hf(config)["attention_types"] == [[["global"] * 8, 1]]
    local = config_from_hf({**TINYSTORIES_1M, "attention_types": [[["local"], 8]]})
    assert (local.sliding_window, local.window_layers) == (256, None)
