"""StableLM (`hf/stablelm.py`): a config of StableLM-2-1.6B's shape read as transformers reads
it, its tensors named and shaped as transformers' StableLmForCausalLM holds them, the parallel
block (StableLM-2-12B's `use_parallel_residual`) against transformers in float32, and
`qk_layernorm` refused. The family suite (test_hf_families.py's "stablelm-*" cases) checks
the sequential blocks' logits, traces and generation, in 16 bits too; the parallel block is
here because transformers sums its branches in another order (bit for bit in float32 only
up to that rounding)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from attnlab import load_hf
from attnlab.generate import generate
from attnlab.hf import config_from_hf, config_to_hf, family_for_config
from helpers import assert_logits_match_hf, left_padded, transformers_shapes

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.loading import hf_shapes

transformers = pytest.importorskip("transformers")

#: StableLM-2-1.6B's shape and switches, as its config.json gives them
STABLELM_2_1_6B = {
    "architectures": ["StableLmForCausalLM"], "bos_token_id": 100257, "eos_token_id": 100257,
    "hidden_act": "silu", "hidden_dropout": 0.0, "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5632, "layer_norm_eps": 1e-05, "max_position_embeddings": 4096,
    "model_type": "stablelm", "num_attention_heads": 32, "num_hidden_layers": 24,
    "num_key_value_heads": 32, "partial_rotary_factor": 0.25, "qk_layernorm": False,
    "rope_scaling": None, "rope_theta": 10000, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_parallel_residual": False,
    "use_qkv_bias": True, "vocab_size": 100352,
}


def test_stablelm_2_reads_as_transformers_reads_it() -> None:
    config = config_from_hf(STABLELM_2_1_6B)
    assert (config.norm, config.norm_biased, config.bias, config.qkv_bias, config.out_bias,
            config.mlp, config.rotary_pct, config.head_size) == (
        "layernorm", True, False, True, False, "swiglu", 0.25, 64)
    assert family_for_config(config).name == "stablelm"
    assert config_from_hf(config_to_hf(config)) == config
    assert hf_shapes(STABLELM_2_1_6B) == transformers_shapes(STABLELM_2_1_6B)[0]


def test_stablelm_2_12b_reads_its_norms_per_head_one_tensor_a_head() -> None:
    """qk_layernorm (StableLM-2-12B's shape: parallel blocks, 32 heads, 8 key/value heads):
    a weight row a head, written as transformers names them, one tensor a head."""
    twelve = {**STABLELM_2_1_6B, "qk_layernorm": True, "use_parallel_residual": True,
              "hidden_size": 5120, "num_attention_heads": 32, "num_key_value_heads": 8,
              "intermediate_size": 13824, "num_hidden_layers": 2}
    config = config_from_hf(twelve)
    assert (config.qk_norm, config.qk_norm_heads, config.parallel_residual) == (
        True, "stablelm", True)
    assert config_from_hf(config_to_hf(config)) == config
    shapes = hf_shapes(twelve)
    assert shapes == transformers_shapes(twelve)[0]
    assert shapes["model.layers.1.self_attn.k_layernorm.norms.7.weight"] == (160,)
    assert "model.layers.1.self_attn.k_layernorm.norms.8.weight" not in shapes


@torch.no_grad()
def test_the_parallel_block_is_transformers(tmp_path: Path) -> None:
    """use_parallel_residual: attention and MLP on one LayerNorm (`shared_norm`); logits
    within 1e-4 of transformers' eager, single and left-padded, and greedy ids equal."""
    torch.manual_seed(0)
    config = transformers.StableLmConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        use_parallel_residual=True, use_qkv_bias=True, initializer_range=0.2,
        bos_token_id=0, eos_token_id=0, pad_token_id=0)
    config._attn_implementation = "eager"
    hf = transformers.StableLmForCausalLM(config).eval()
    for name, p in hf.named_parameters():
        if "norm" in name or name.endswith("bias"):
            p.add_(0.1 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    assert (ours.config.parallel_residual, ours.config.shared_norm) == (True, True)
    assert_logits_match_hf(ours, hf, [5, 17, 11])
    ids, mask = left_padded([4, 12, 9], vocab=97, low=1, seed=2)
    expected = hf.generate(ids, attention_mask=mask, max_new_tokens=30, min_new_tokens=30,
                           do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(generate(ours, ids, mask, max_new_tokens=30, temperature=0), expected)
