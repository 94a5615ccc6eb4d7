"""The DeepSeek-V3-style mixtures (`hf/glm4_moe.py`, `hf/dots1.py`) beyond the family suite
(test_hf_families.py's "glm4_moe-*" and "dots1-*" cases check logits, traces, generation,
export and 16 bits against transformers): GLM-4.5-Air's config.json as released and one of
dots.llm1's shape read as transformers reads them, their tensors the ones it writes and their
counts those `attnlab info` prints (106.9B and 142.8B, 13.4B and 14.0B active per token: the
published 106B / 12B and 142B / 14B, embeddings counted); what they cannot express refused by
name; the correction bias kept float32 in a 16-bit model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab.cli import main
from attnlab.hf import FAMILY_BY_NAME, config_from_hf, config_to_hf, family_for_config, load_hf
from attnlab.load import inspect_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.loading import hf_shapes, sparse_hf_dir

from helpers import assert_logits_match_hf, per_expert, transformers_shapes

#: GLM-4.5-Air's config.json as zai-org released it (as transformers 4.54 prints it)
GLM45_AIR: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": [151329, 151336, 151338], "first_k_dense_replace": 1, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 10944, "max_position_embeddings": 131072, "model_type": "glm4_moe",
    "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 96,
    "num_experts_per_tok": 8, "num_hidden_layers": 46, "num_key_value_heads": 8,
    "num_nextn_predict_layers": 1, "pad_token_id": 151329, "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
    "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1,
    "torch_dtype": "bfloat16", "transformers_version": "4.54.1", "use_cache": True,
    "use_qk_norm": False, "vocab_size": 151552,
}
#: a config of dots.llm1's shape and routing (128 experts 1408 wide, top 6 renormalised times
#: 2.5, two experts' width of shared expert, a dense first layer; n_group and topk_group
#: absent: transformers 5.24 divides by a null one)
DOTS_LLM1: dict[str, Any] = {
    "architectures": ["Dots1ForCausalLM"], "model_type": "dots1", "hidden_size": 4096,
    "num_hidden_layers": 62, "intermediate_size": 10944, "num_attention_heads": 32,
    "num_key_value_heads": 32, "rms_norm_eps": 1e-05, "vocab_size": 152064,
    "first_k_dense_replace": 1, "moe_intermediate_size": 1408, "n_routed_experts": 128,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "max_position_embeddings": 32768, "rope_theta": 10000000,
    "attention_bias": False, "tie_word_embeddings": False,
}
CONFIGS = {"glm4_moe": GLM45_AIR, "dots1": DOTS_LLM1}


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_a_released_shape_reads_and_writes_as_its_family(family: str) -> None:
    config = config_from_hf(CONFIGS[family])
    # without windows or biases dots.llm1 is also a GLM-4.5 with QK-norm turning whole
    # heads, and export picks the first family that holds it (glm4_moe) unless asked
    assert family_for_config(config).name == "glm4_moe"
    assert FAMILY_BY_NAME[family].misfits(config) == []
    assert config_from_hf(config_to_hf(config, family=FAMILY_BY_NAME[family])) == config
    expected = {"glm4_moe": (128, 8, True, 1.0, 1408, 1408, 10944, 0.5, True, False),
                "dots1": (128, 6, True, 2.5, 1408, 2816, 10944, 1.0, False, True)}[family]
    assert (config.n_experts, config.experts_per_token, config.experts_normalized,
            config.routed_scaling, config.ff_size, config.shared_expert_size,
            config.dense_d_ff, config.rotary_pct, config.qkv_biased, config.qk_norm
            ) == expected
    assert (config.router_scoring, config.shared_expert_gated, config.dense_layers,
            config.expert_weights_in_float32) == ("sigmoid", False, 1, True)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_its_tensors_and_counts_are_transformers(family: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    shapes, count = transformers_shapes(CONFIGS[family])
    assert hf_shapes(CONFIGS[family]) == per_expert(shapes)
    directory = sparse_hf_dir(tmp_path / family, CONFIGS[family], shards=3)
    info = inspect_dir(directory)
    assert (info.family, info.parameters) == (family, count)
    # a token's: the dense first layer whole, the shared experts and 8 (6) of 128 routed
    active = {"glm4_moe": 13_424_123_904, "dots1": 14_016_581_120}[family]
    assert main(["info", str(directory)]) == 0
    assert f"{count:,} parameters ({active:,} active per token)" in capsys.readouterr().out


@pytest.mark.parametrize("family,field,value,why", [
    ("glm4_moe", "n_group", 3, "must split the 128 experts into equal groups of at least 2"),
    ("glm4_moe", "n_group", 128, "must split the 128 experts into equal groups of at least 2"),
    ("glm4_moe", "topk_group", 2, "expected a positive integer up to 1"),
    ("glm4_moe", "first_k_dense_replace", 46, "expected 0 to 45"),
    ("glm4_moe", "n_shared_experts", 0, "expected a positive integer"),
    ("dots1", "n_routed_experts", None, "expected a positive integer"),
    ("dots1", "n_group", None, "expected a positive integer"),
    ("dots1", "partial_rotary_factor", 0.5, "attnlab does not know this field"),
])
def test_what_a_deepseek_family_cannot_express_is_refused(family: str, field: str, value: Any,
                                                          why: str) -> None:
    with pytest.raises(ValueError, match=rf"{family} config.json has {field}=.*: {why}"):
        config_from_hf({**CONFIGS[family], field: value})


@torch.no_grad()
def test_a_16_bit_load_keeps_the_correction_bias_and_router_float32(tmp_path: Path) -> None:
    """Rounded to bfloat16 the bias (or the router's weight) would pick other experts than
    transformers' float32 one; loaded, cast and moved both stay the file's float32 values, as
    transformers keeps them (`_keep_in_fp32_modules_strict`), and the 16-bit model's logits
    equal a float32 router's, not a rounded one's."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Glm4MoeConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1)
    torch.manual_seed(0)  # drawn afresh, the last check depended on the tests run before
    hf = transformers.Glm4MoeForCausalLM(config)
    bias = hf.model.layers[1].mlp.gate.e_score_correction_bias
    bias.copy_(torch.tensor([0.1234567, -0.7654321, 1e-3 + 1e-7, 2.0]))
    weight = hf.model.layers[1].mlp.gate.weight
    weight.normal_(0.0, 0.5)
    assert not torch.equal(weight.bfloat16().float(), weight)  # rounding would change it
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path, dtype=torch.bfloat16)
    ids = torch.randint(0, 61, (1, 12), generator=torch.Generator().manual_seed(0))
    logits = ours(ids, fused=False).logits
    for model in (ours, ours.to(torch.float16), ours.float().bfloat16()):
        router = model.blocks[1].mlp.router
        assert router.e_score_correction_bias.dtype == router.weight.dtype == torch.float32
        assert torch.equal(router.e_score_correction_bias, bias)
        assert torch.equal(router.weight, weight)
    assert ours.blocks[1].mlp.experts[0].fc.weight.dtype == torch.bfloat16
    ours.blocks[1].mlp.router.weight.data = weight.bfloat16().float()  # as if rounded
    assert not torch.equal(ours(ids, fused=False).logits, logits)


def test_glm45s_multi_token_prediction_layer_is_left_unread(tmp_path: Path) -> None:
    """A released GLM-4.5 directory holds its MTP layer after the last (model.layers.46.* for
    GLM-4.5-Air's 46): loaded as transformers loads it, that layer unread; dots.llm1, which
    has none, refuses a layer past its last as weights left over."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    small = dict(vocab_size=61, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1)
    mtp = {"model.layers.2.eh_proj.weight": torch.randn(32, 64),
           "model.layers.2.enorm.weight": torch.ones(32),
           "model.layers.2.mlp.gate.weight": torch.randn(4, 32)}
    for family, config in (
            ("glm4_moe", transformers.Glm4MoeConfig(**small, num_nextn_predict_layers=1)),
            ("dots1", transformers.Dots1Config(**small, n_shared_experts=1, n_group=1,
                                                topk_group=1))):
        config._attn_implementation = "eager"
        hf = getattr(transformers, f"{type(config).__name__[:-6]}ForCausalLM")(config).eval()
        directory = tmp_path / family
        hf.save_pretrained(directory)
        path = directory / "model.safetensors"
        save_file({**load_file(str(path)), **mtp}, str(path), metadata={"format": "pt"})
        if family == "dots1":
            with pytest.raises(ValueError, match=r"does not account for: \['model\.layers\.2"):
                load_hf(directory)
            continue
        assert_logits_match_hf(load_hf(directory), hf, [7, 4])
