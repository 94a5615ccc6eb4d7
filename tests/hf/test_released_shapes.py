"""GLM, GLM-4, StarCoder2 and EXAONE 4.0 beyond the family suite (test_hf_families.py runs
their random-weight cases through every family test): configs of the released models' shape
read with the tensor names, shapes and parameter counts transformers' own classes hold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from benchmarks.loading import hf_shapes, sparse_hf_dir

from attnlab.cli import main
from attnlab.hf import config_from_hf
from attnlab.load import inspect_dir
from helpers import transformers_shapes

# GLM-4-9B-0414's shape (its config.json's fields as THUDM released them)
GLM4_9B: dict[str, Any] = {
    "architectures": ["Glm4ForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 13696,
    "max_position_embeddings": 32768, "model_type": "glm4", "num_attention_heads": 32,
    "num_hidden_layers": 40, "num_key_value_heads": 2, "pad_token_id": 151329,
    "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 151552,
}
# GLM-4-9B-chat-hf's shape: the same body without the branch norms
GLM_9B = {**GLM4_9B, "architectures": ["GlmForCausalLM"], "model_type": "glm",
          "max_position_embeddings": 131072, "rms_norm_eps": 1.5625e-07}


@pytest.mark.parametrize("hf_config", [GLM4_9B, GLM_9B], ids=["glm4", "glm"])
def test_a_released_shape_reads_and_its_tensors_are_transformers(
        hf_config: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = config_from_hf(hf_config)
    assert (config.rotary_pct, config.rope_interleaved, config.qkv_biased, config.out_biased,
            config.bias) == (0.5, True, True, False, False)
    assert config.sandwich_norm == (hf_config["model_type"] == "glm4")
    shapes, count = transformers_shapes(hf_config)
    assert hf_shapes(hf_config) == shapes
    directory = sparse_hf_dir(tmp_path / "glm", hf_config, shards=2)
    info = inspect_dir(directory)
    assert (info.family, info.parameters) == (hf_config["model_type"], count)
    assert main(["info", str(directory)]) == 0
    assert f"{count:,} parameters" in capsys.readouterr().out


# StarCoder2-3B's config.json as BigCode released it (its training code's switches included)
STARCODER2_3B: dict[str, Any] = {
    "architectures": ["Starcoder2ForCausalLM"], "attention_dropout": 0.1,
    "residual_dropout": 0.1, "embedding_dropout": 0.1, "bos_token_id": 0, "eos_token_id": 0,
    "hidden_act": "gelu_pytorch_tanh", "hidden_size": 3072, "initializer_range": 0.018042,
    "intermediate_size": 12288, "max_position_embeddings": 16384, "mlp_type": "default",
    "model_type": "starcoder2", "norm_epsilon": 1e-05, "norm_type": "layer_norm",
    "num_attention_heads": 24, "num_hidden_layers": 30, "num_key_value_heads": 2,
    "rope_theta": 999999.4420358813, "sliding_window": 4096, "torch_dtype": "bfloat16",
    "use_bias": True, "use_cache": True, "vocab_size": 49152,
}


def test_starcoder2_3b_reads_with_transformers_tensors(tmp_path: Path) -> None:
    config = config_from_hf(STARCODER2_3B)
    assert (config.norm, config.mlp, config.gelu, config.sliding_window, config.tie_weights,
            config.n_kv_heads) == ("layernorm", "gelu", "tanh", 4096, True, 2)
    shapes, count = transformers_shapes(STARCODER2_3B)
    assert hf_shapes(STARCODER2_3B) == shapes
    info = inspect_dir(sparse_hf_dir(tmp_path / "sc2", STARCODER2_3B, shards=2))
    assert (info.family, info.parameters) == ("starcoder2", count)
    assert 3.0e9 < count < 3.1e9  # "3B"
    with pytest.raises(ValueError, match="mlp_type"):
        config_from_hf({**STARCODER2_3B, "mlp_type": "gated"})


# EXAONE-4.0-1.2B's shape (global attention on every layer, Llama 3's RoPE scaling) and
# EXAONE-4.0-32B's (three windowed layers of 4,096 then a full NoPE one, its pattern a string)
EXAONE4_1B: dict[str, Any] = {
    "architectures": ["Exaone4ForCausalLM"], "bos_token_id": 1, "eos_token_id": 361,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 4096, "layer_types": ["full_attention"] * 30,
    "max_position_embeddings": 65536, "model_type": "exaone4", "num_attention_heads": 32,
    "num_hidden_layers": 30, "num_key_value_heads": 8, "pad_token_id": 0,
    "rms_norm_eps": 1e-05, "rope_scaling": {
        "factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 1000000, "sliding_window": None, "sliding_window_pattern": None,
    "tie_word_embeddings": True, "vocab_size": 102400,
}
EXAONE4_32B = {
    **EXAONE4_1B, "hidden_size": 5120, "intermediate_size": 27392, "num_attention_heads": 40,
    "num_hidden_layers": 64, "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    "sliding_window": 4096, "sliding_window_pattern": "LLLG", "tie_word_embeddings": False,
}
EXAONE4_32B["layer_types"] = EXAONE4_32B["layer_types"] * 16


@pytest.mark.parametrize("hf_config", [EXAONE4_1B, EXAONE4_32B], ids=["1.2b", "32b"])
def test_exaone4_shapes_read_with_transformers_tensors(hf_config: dict[str, Any],
                                                       tmp_path: Path) -> None:
    config = config_from_hf(hf_config)
    full = [i for i, t in enumerate(hf_config["layer_types"]) if t == "full_attention"]
    windowed = hf_config["sliding_window"] is not None
    assert config.nope_layers == (full if windowed else None)
    assert config.sliding_window == hf_config["sliding_window"]
    assert (config.qk_norm, config.pre_norm, config.sandwich_norm) == (True, False, True)
    shapes, count = transformers_shapes(hf_config)
    assert hf_shapes(hf_config) == shapes
    info = inspect_dir(sparse_hf_dir(tmp_path / "exaone", hf_config, shards=2))
    assert (info.family, info.parameters) == ("exaone4", count)


@pytest.mark.parametrize("arch", ["Cohere", "Cohere2"])
def test_cohere_defaults_read_as_transformers_builds_them(arch: str, tmp_path: Path) -> None:
    """A config.json naming only its class reads as transformers' defaults (CohereConfig's are
    Command-R's 35B shape; Cohere2Config's windows three layers in four, the fourth NoPE) with
    its tensor names, shapes and count."""
    hf_config = {"architectures": [f"{arch}ForCausalLM"], "model_type": arch.lower()}
    config = config_from_hf(hf_config)
    assert (config.logit_scale, config.parallel_residual, config.shared_norm,
            config.norm_biased, config.rope_interleaved) == (0.0625, True, True, False, True)
    if arch == "Cohere2":
        assert (config.sliding_window, config.nope_layers) == (4096, list(range(3, 40, 4)))
    shapes, count = transformers_shapes(hf_config)
    assert hf_shapes(hf_config) == shapes
    info = inspect_dir(sparse_hf_dir(tmp_path / arch, hf_config, shards=2))
    assert (info.family, info.parameters) == (arch.lower(), count)


@pytest.mark.parametrize("arch,model_type", [("SeedOss", "seed_oss"), ("Ernie4_5", "ernie4_5"),
                                             ("Helium", "helium"), ("Arcee", "arcee")])
def test_llama_kin_defaults_read_as_transformers_builds_them(arch: str, model_type: str,
                                                             tmp_path: Path) -> None:
    """Seed-OSS-36B's, ERNIE-4.5-0.3B's and Helium-1 2B's shapes (each transformers class's
    defaults) read with transformers' own tensor names, shapes and counts."""
    hf_config = {"architectures": [f"{arch}ForCausalLM"], "model_type": model_type}
    transformers = pytest.importorskip("transformers")
    theirs = getattr(transformers, f"{arch}Config")()
    assert config_from_hf(hf_config).rope_theta == theirs.rope_parameters["rope_theta"]
    shapes, count = transformers_shapes(hf_config)
    assert hf_shapes(hf_config) == shapes
    info = inspect_dir(sparse_hf_dir(tmp_path / arch, hf_config, shards=2))
    assert (info.family, info.parameters) == (model_type, count)
