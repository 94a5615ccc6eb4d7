"""Phi-1 / 1.5 / 2 (`hf/phi.py`): the published Phi-2 config.json read as transformers reads it,
its tensors named and shaped as transformers' PhiForCausalLM holds them, and the two block
switches Phi brought (`shared_norm`, `head_bias`) refused by every other family. The family
suite (test_hf_families.py's "phi-*" cases) checks logits, traces and generation against
transformers."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from attnlab import GPT, GPTConfig, inspect_dir
from attnlab.hf import FAMILY_BY_NAME, config_from_hf, config_to_hf, family_for_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.loading import hf_shapes, sparse_hf_dir

from helpers import transformers_shapes

#: microsoft/phi-2's config.json as published
PHI2 = {
    "_name_or_path": "microsoft/phi-2", "architectures": ["PhiForCausalLM"],
    "attention_dropout": 0.0, "bos_token_id": 50256, "embd_pdrop": 0.0, "eos_token_id": 50256,
    "hidden_act": "gelu_new", "hidden_size": 2560, "initializer_range": 0.02,
    "intermediate_size": 10240, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
    "model_type": "phi", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "partial_rotary_factor": 0.4, "qk_layernorm": False,
    "resid_pdrop": 0.1, "rope_scaling": None, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.37.0",
    "use_cache": True, "vocab_size": 51200,
}


def test_phi2s_config_as_published_reads_as_phi2() -> None:
    config = config_from_hf(PHI2)
    assert (config.n_layer, config.n_head, config.n_embd, config.head_size, config.d_ff) == (
        32, 32, 2560, 80, 10240)
    assert (config.parallel_residual, config.shared_norm, config.head_bias, config.bias,
            config.norm, config.gelu, config.tie_weights) == (
        True, True, True, True, "layernorm", "tanh", False)
    with torch.device("meta"):
        rotary = GPT(config).rotary
    assert rotary is not None and rotary.dims == 32  # 0.4 of each head's 80 dims
    # early revisions' pointer to the hub's custom code, which transformers ignores too
    custom = {"AutoConfig": "configuration_phi.PhiConfig",
              "AutoModelForCausalLM": "modeling_phi.PhiForCausalLM"}
    assert config_from_hf({**PHI2, "auto_map": custom}) == config


def test_phi2s_tensors_are_transformers_names_and_shapes(tmp_path: Path) -> None:
    """Every tensor of transformers' PhiForCausalLM for Phi-2, by name and shape, is what
    attnlab writes and reads (the head's bias included), 2,779,683,840 parameters; `info`
    on a directory of them counts the same from its headers."""
    shapes, count = transformers_shapes(PHI2)
    assert hf_shapes(PHI2) == shapes and count == 2_779_683_840
    info = inspect_dir(sparse_hf_dir(tmp_path / "phi-2", PHI2, shards=2))
    assert (info.family, info.parameters) == ("phi", 2_779_683_840)


def test_a_qk_layernorm_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"qk_layernorm=True.*LayerNorm"):
        config_from_hf({**PHI2, "qk_layernorm": True})


def test_one_norm_or_a_head_bias_exports_as_phi_and_no_other_family() -> None:
    phi = config_from_hf(PHI2)
    assert family_for_config(phi).name == "phi"
    assert config_to_hf(phi)["rope_parameters"]["partial_rotary_factor"] == 0.4
    neox = dataclasses.replace(phi, shared_norm=False, head_bias=False)
    assert family_for_config(neox).name == "gpt_neox"  # a parallel block of two norms
    for switch in ("shared_norm", "head_bias"):
        with pytest.raises(ValueError, match=f"{switch}=False"):
            config_to_hf(dataclasses.replace(neox, **{switch: True}),
                         family=FAMILY_BY_NAME["gpt_neox"])
    with pytest.raises(ValueError, match="head_bias=True"):
        config_to_hf(dataclasses.replace(phi, head_bias=False), family=FAMILY_BY_NAME["phi"])


def test_shared_norm_needs_a_parallel_residual() -> None:
    with pytest.raises(ValueError, match=r"shared_norm=True .* needs parallel_residual=True"):
        GPTConfig(shared_norm=True)
