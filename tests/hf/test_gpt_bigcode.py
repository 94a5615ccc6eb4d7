"""hf/gpt_bigcode.py beyond the family cases of test_hf_families.py: a StarCoderBase-1B-shaped
config.json as the releases write it (the old runner's fields beside the model's) reads as
multi-query attention, with transformers' tensor names, shapes and parameter count."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from attnlab import inspect_dir
from attnlab.hf import config_from_hf, family_for_config
from helpers import transformers_shapes

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.loading import hf_shapes, sparse_hf_dir

pytest.importorskip("transformers")

# bigcode/starcoderbase-1b's fields (transformers 4.28's writing, the runner's fields with it)
STARCODERBASE_1B = {
    "activation_function": "gelu_pytorch_tanh", "architectures": ["GPTBigCodeForCausalLM"],
    "attention_softmax_in_fp32": True, "attn_pdrop": 0.1, "bos_token_id": 0,
    "embd_pdrop": 0.1, "eos_token_id": 0, "inference_runner": 0, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "max_batch_size": None, "max_sequence_length": None,
    "model_type": "gpt_bigcode", "multi_query": True, "n_embd": 2048, "n_head": 16,
    "n_inner": 8192, "n_layer": 24, "n_positions": 8192, "pad_key_length": True,
    "pre_allocate_kv_cache": False, "resid_pdrop": 0.1, "scale_attention_softmax_in_fp32": True,
    "scale_attn_weights": True, "summary_activation": None, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
    "torch_dtype": "float32", "transformers_version": "4.28.1", "use_cache": True,
    "validate_runner_input": True, "vocab_size": 49152,
}


def test_starcoderbase_reads_as_multi_query_gpt2_blocks() -> None:
    c = config_from_hf(STARCODERBASE_1B)
    assert (c.n_layer, c.n_head, c.n_kv_head, c.n_embd, c.ff_size, c.block_size) == (
        24, 16, 1, 2048, 8192, 8192)
    assert (c.pos, c.norm, c.mlp, c.gelu, c.tie_weights, c.bias) == (
        "learned", "layernorm", "gelu", "tanh", True, True)
    assert family_for_config(c).name == "gpt_bigcode"


def test_starcoderbase_tensors_are_transformers_names_and_shapes(tmp_path: Path) -> None:
    """The tensors attnlab writes for it (c_attn (2048 + 2 x 128, 2048)) are transformers'
    names and shapes, and a sparse directory of them counts transformers' parameters."""
    fields = {k: v for k, v in STARCODERBASE_1B.items() if k not in (
        "inference_runner", "max_batch_size", "max_sequence_length", "pad_key_length",
        "pre_allocate_kv_cache", "validate_runner_input")}  # transformers 5 takes none of them
    shapes, count = transformers_shapes(fields)
    assert hf_shapes(STARCODERBASE_1B) == shapes
    assert shapes["transformer.h.0.attn.c_attn.weight"] == (2048 + 2 * 128, 2048)
    info = inspect_dir(sparse_hf_dir(tmp_path / "starcoderbase-1b", STARCODERBASE_1B, shards=2))
    assert (info.family, info.parameters) == ("gpt_bigcode", count)
