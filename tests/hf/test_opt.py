"""OPT (`hf/opt.py`): OPT-6.7b's config.json as published read as transformers reads it, the
tensors named and shaped as transformers' OPTForCausalLM holds them (the position table two
rows longer), and OPT-350m's layout refused by name. The family suite (test_hf_families.py's
"opt-*" cases) checks logits, traces and generation against transformers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from attnlab import inspect_dir
from attnlab.hf import config_from_hf, config_to_hf, family_for_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.loading import hf_shapes

from helpers import sparse_dir_with_tokenizer, transformers_shapes

#: facebook/opt-6.7b's config.json as published
OPT_6_7B = {
    "_name_or_path": "facebook/opt-6.7b", "_remove_final_layer_norm": False,
    "activation_dropout": 0.0, "activation_function": "relu",
    "architectures": ["OPTForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 2,
    "do_layer_norm_before": True, "dropout": 0.1, "eos_token_id": 2, "ffn_dim": 16384,
    "hidden_size": 4096, "init_std": 0.02, "layerdrop": 0.0, "max_position_embeddings": 2048,
    "model_type": "opt", "num_attention_heads": 32, "num_hidden_layers": 32,
    "pad_token_id": 1, "prefix": "</s>", "torch_dtype": "float16",
    "transformers_version": "4.20.1", "use_cache": True, "vocab_size": 50272,
    "word_embed_proj_dim": 4096,
}


def test_opt_config_as_published_reads_as_opt() -> None:
    config = config_from_hf(OPT_6_7B)
    assert (config.n_layer, config.n_head, config.n_embd, config.ff_size, config.block_size) == (
        32, 32, 4096, 16384, 2048)
    assert (config.pos, config.mlp, config.bias, config.tie_weights) == (
        "learned", "relu", True, True)
    assert family_for_config(config).name == "opt"
    assert config_from_hf(config_to_hf(config)) == config


def test_opt_tensors_are_transformers_names_and_shapes(tmp_path: Path) -> None:
    ours = hf_shapes(OPT_6_7B)
    assert ours == transformers_shapes(OPT_6_7B)[0]
    assert ours["model.decoder.embed_positions.weight"] == (2050, 4096)
    small = {**OPT_6_7B, "hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "word_embed_proj_dim": 64}
    count = transformers_shapes(small)[1]
    info = inspect_dir(sparse_dir_with_tokenizer(tmp_path / "opt", small))
    # attnlab's model: the two offset rows left out
    assert (info.family, info.parameters) == ("opt", count - 2 * 64)


@pytest.mark.parametrize("field, value, why", [
    ("do_layer_norm_before", False, "pre-LayerNorm"),
    ("_remove_final_layer_norm", True, "pre-LayerNorm"),
    ("layer_norm_elementwise_affine", False, "affine norms"),
    ("enable_bias", False, "biases"),
    ("word_embed_proj_dim", 512, "projection is not built"),
    ("activation_function", "gelu", "relu"),
])
def test_opt_350ms_layout_is_refused_by_name(field: str, value: object, why: str) -> None:
    with pytest.raises(ValueError, match=f"{field}={value!r}.*{why}"):
        config_from_hf({**OPT_6_7B, field: value})
