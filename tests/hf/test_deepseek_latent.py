"""DeepSeek-V2 and V3 (`hf/deepseek.py`) beyond the family suite (test_hf_families.py's
"deepseek_*" cases check logits, traces, generation, export and 16 bits against transformers):
DeepSeek-V2-Lite's and DeepSeek-V3's config.json as released read as transformers reads them
(the score scale with yarn's mscale, latent widths, routing), their tensors the ones it
writes and their counts those `attnlab info` prints (15.7B, 2.7B active per token; 671.0B,
37.6B active: the published 15.7B / 2.4B and 671B / 37B, embeddings counted here), V3's fp8
release read as its bfloat16 conversion, and what neither family can express refused by
name."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.cli import main
from attnlab.hf import FAMILY_BY_NAME, config_from_hf, config_to_hf
from attnlab.load import inspect_dir
from attnlab.model.moe import idle_parameters

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.loading import hf_shapes, sparse_hf_dir

from helpers import per_expert, transformers_shapes

#: DeepSeek-V2-Lite's config.json as deepseek-ai released it (auto_map left out)
V2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 100000,
    "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06, "rope_scaling": {
        "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
        "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy",
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": True,
    "v_head_dim": 128, "vocab_size": 102400,
}
#: DeepSeek-V3's config.json as deepseek-ai released it, with its fp8 quantization_config
#: (auto_map left out); the bfloat16 conversions drop that field
V3_FP8: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1,
    "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "quantization_config": {
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_scaling": {
        "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16", "transformers_version": "4.46.3", "use_cache": True,
    "v_head_dim": 128, "vocab_size": 129280,
}
V3 = {k: v for k, v in V3_FP8.items() if k != "quantization_config"}
CONFIGS = {"deepseek_v2": V2_LITE, "deepseek_v3": V3}
# (total, active per token): transformers' count, and ours less each mixture's idle experts
COUNTS = {"deepseek_v2": (15_706_484_224, 2_661_150_208),
          "deepseek_v3": (671_026_404_352, 37_552_282_624)}


def _transformers_scale(hf_config: dict[str, Any]) -> float:
    transformers = pytest.importorskip("transformers")
    cls = getattr(transformers, hf_config["architectures"][0])
    small = {**hf_config, "num_hidden_layers": 1, "n_routed_experts": 8, "n_group": 1,
             "topk_group": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 0}
    with torch.device("meta"):
        model = cls(cls.config_class(**small))
    return float(model.model.layers[0].self_attn.scaling)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_a_released_config_reads_as_transformers_does_and_writes_back(family: str) -> None:
    hf = CONFIGS[family]
    config = config_from_hf(hf)
    assert FAMILY_BY_NAME[family].misfits(config) == []
    assert config_from_hf(config_to_hf(config, family=FAMILY_BY_NAME[family])) == config
    heads = hf["num_attention_heads"]
    assert (config.head_size, config.kv_latent, config.rope_head_dim, config.v_head_dim,
            config.n_kv_heads, config.rotary_dims) == (192, 512, 64, 128, heads, 64)
    assert config.q_latent == hf["q_lora_rank"]
    # yarn's mscale(40, mscale_all_dim) squared on 1/sqrt(192), the same float
    assert config.score_scale == _transformers_scale(hf) != 192 ** -0.5
    expected = {"deepseek_v2": ("softmax_float32", 1, False, 1.0, 6, True, True),
                "deepseek_v3": ("sigmoid", 8, True, 2.5, 8, False, True)}[family]
    assert (config.router_scoring, config.expert_groups, config.experts_normalized,
            config.routed_scaling, config.experts_per_token, config.rope_in_float32,
            config.rope_interleaved) == expected


def test_v3s_fp8_release_reads_as_its_bfloat16_conversion() -> None:
    """Its quantization_config says its matrices load dequantized (hf/fp8.py, tested in
    test_fp8.py): the same model."""
    assert config_from_hf(V3_FP8) == config_from_hf(V3)
    with pytest.raises(ValueError, match=r"deepseek_v3 config.json has quantization_config."
                                         r"fmt='e5m2': attnlab reads FP8 weights stored as e4m3"):
        config_from_hf({**V3_FP8, "quantization_config": {
            **V3_FP8["quantization_config"], "fmt": "e5m2"}})


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_its_tensors_and_counts_are_transformers(family: str) -> None:
    shapes, count = transformers_shapes(CONFIGS[family])
    assert hf_shapes(CONFIGS[family]) == per_expert(shapes)
    config = config_from_hf(CONFIGS[family])
    assert (count, count - idle_parameters(config)) == COUNTS[family]


def test_info_prints_the_counts_of_a_v2_lite_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = sparse_hf_dir(tmp_path / "v2-lite", V2_LITE, shards=3)
    total, active = COUNTS["deepseek_v2"]
    assert (inspect_dir(directory).family, inspect_dir(directory).parameters) == (
        "deepseek_v2", total)
    assert main(["info", str(directory)]) == 0
    out = capsys.readouterr().out
    assert f"{total:,} parameters ({active:,} active per token)" in out
    # 27 layers x 576 numbers x 2 bytes a token: the latent cache, a tenth of the heads' k, v
    assert ("kv cache    31.1 kB a token in bfloat16 (27 layers of a latent of 512 and a RoPE "
            "part of 64), 5.1 GB for the whole context (163,840)\n") in out


@pytest.mark.parametrize(("family", "field", "value", "why"), [
    ("deepseek_v3", "num_key_value_heads", 8, "latent attention projects k and v for each of "
     "the 128 heads"),
    ("deepseek_v3", "scoring_func", "softmax", "attnlab supports 'sigmoid'"),
    ("deepseek_v3", "topk_method", "group_limited_greedy", "attnlab supports 'noaux_tc'"),
    ("deepseek_v3", "moe_layer_freq", 2, "transformers puts a mixture in every layer"),
    ("deepseek_v2", "mlp_bias", True, "transformers' DeepseekV2 puts it on the dense"),
    ("deepseek_v2", "topk_method", "noaux_tc", "attnlab supports 'greedy' or "
     "'group_limited_greedy'"),
    ("deepseek_v2", "qk_rope_head_dim", 0, "expected a positive integer"),
])
def test_what_a_deepseek_config_cannot_say_is_refused_by_name(family: str, field: str,
                                                              value: Any, why: str) -> None:
    with pytest.raises(ValueError, match=rf"{family} config.json has {field}=.*: {why}"):
        config_from_hf({**CONFIGS[family], field: value})


def test_v2s_groups_are_read_only_with_group_limited_greedy() -> None:
    grouped = config_from_hf({**V2_LITE, "n_group": 8, "topk_group": 3,
                              "topk_method": "group_limited_greedy"})
    assert (grouped.expert_groups, grouped.expert_groups_chosen) == (8, 3)
    greedy = config_from_hf({**V2_LITE, "n_group": 8, "topk_group": 3})  # ignored, as there
    assert (greedy.expert_groups, greedy.expert_groups_chosen) == (1, 1)
