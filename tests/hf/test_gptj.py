"""GPT-J (`hf/gptj.py`): the published GPT-J-6B config.json read as transformers reads it, its
tensors named and shaped as transformers' GPTJForCausalLM holds them, RoPE on adjacent pairs
(`GPTConfig.rope_interleaved`) equal to transformers' rotate_every_two and refused by every
other family. The family suite (test_hf_families.py's "gptj-*" cases) checks logits, traces
and generation against transformers."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from attnlab import GPT, GPTConfig, inspect_dir
from attnlab.hf import FAMILY_BY_NAME, config_from_hf, config_to_hf, family_for_config
from attnlab.model.rope import Rotary, apply_rotary

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.loading import hf_shapes, sparse_hf_dir

from helpers import transformers_shapes

#: EleutherAI/gpt-j-6b's config.json as published
GPTJ_6B = {
    "activation_function": "gelu_new", "architectures": ["GPTJForCausalLM"],
    "attn_pdrop": 0.0, "bos_token_id": 50256, "embd_pdrop": 0.0, "eos_token_id": 50256,
    "gradient_checkpointing": False, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
    "model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_inner": None, "n_layer": 28,
    "n_positions": 2048, "resid_pdrop": 0.0, "rotary": True, "rotary_dim": 64,
    "scale_attn_weights": True, "summary_activation": None, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50,
                                                 "temperature": 1.0}},
    "tie_word_embeddings": False, "tokenizer_class": "GPT2Tokenizer",
    "transformers_version": "4.18.0.dev0", "use_cache": True, "vocab_size": 50400,
}


def test_gptj_6bs_config_as_published_reads_as_gptj() -> None:
    config = config_from_hf(GPTJ_6B)
    assert (config.n_layer, config.n_head, config.n_embd, config.head_size, config.ff_size) == (
        28, 16, 4096, 256, 16384)
    assert (config.rope_interleaved, config.shared_norm, config.head_bias, config.qkv_bias,
            config.out_bias, config.bias, config.gelu, config.scores_in_float32) == (
        True, True, True, False, False, True, "tanh", True)
    # the float32 scores are GPT-J's and GPT-Neo's: every other family refuses them
    for name, family in FAMILY_BY_NAME.items():
        refused = "scores_in_float32=False (not True)" in family.misfits(config)
        assert refused == (name not in ("gptj", "gpt_neo")), name
    with torch.device("meta"):
        rotary = GPT(config).rotary
    assert rotary is not None and rotary.dims == 64


def test_gptj_6bs_tensors_are_transformers_names_and_shapes(tmp_path: Path) -> None:
    shapes, count = transformers_shapes(GPTJ_6B)
    assert hf_shapes(GPTJ_6B) == shapes
    info = inspect_dir(sparse_hf_dir(tmp_path / "gpt-j-6b", GPTJ_6B, shards=2))
    assert (info.family, info.parameters) == ("gptj", count)


@pytest.mark.parametrize("rotary_dim", [2, 6, 8])
def test_pairs_turn_as_transformers_rotate_every_two(rotary_dim: int) -> None:
    """cos and sin in the interleaved layout and the turn of adjacent pairs give
    transformers' GPT-J rotation bit for bit, on part of a head and on the whole of it; the
    halves' layout does not."""
    pytest.importorskip("transformers")
    from transformers.models.gptj import modeling_gptj

    x = torch.randn(2, 3, 7, 8, generator=torch.Generator().manual_seed(0))  # (B, nh, T, hs)
    positions = torch.arange(7)[None]  # (1, T)
    table = modeling_gptj.create_sinusoidal_positions(7, rotary_dim)  # (T, rd): sin | cos
    sin, cos = table[positions].split(rotary_dim // 2, dim=-1)  # (1, T, rd/2) each
    rot = x.transpose(1, 2)[..., :rotary_dim]  # (B, T, nh, rd): GPT-J's layout
    turned = modeling_gptj.apply_rotary_pos_emb(rot, sin, cos)
    expected = torch.cat((turned, x.transpose(1, 2)[..., rotary_dim:]), -1).transpose(1, 2)
    ours = Rotary(8, rotary_dim / 8, interleaved=True).cos_sin(positions)
    assert torch.equal(apply_rotary(x, *ours, pairs=True), expected)
    halves = Rotary(8, rotary_dim / 8).cos_sin(positions)
    assert rotary_dim == 2 or not torch.equal(apply_rotary(x, *halves), expected)


def test_rotary_dim_is_checked_and_written_back() -> None:
    for bad in (3, 0, 300, True, "64"):
        with pytest.raises(ValueError, match="rotary_dim"):
            config_from_hf({**GPTJ_6B, "rotary_dim": bad})
    with pytest.raises(ValueError, match="rotary_dim"):  # null: the whole hidden size
        config_from_hf({**GPTJ_6B, "rotary_dim": None})
    single = config_from_hf({**GPTJ_6B, "n_head": 1, "rotary_dim": None})
    assert single.rotary_pct == 1.0
    for dims in (2, 64, 96, 254, 256):
        config = config_from_hf({**GPTJ_6B, "rotary_dim": dims})
        assert config_to_hf(config)["rotary_dim"] == dims


def test_pairs_export_as_gptj_and_no_other_family() -> None:
    gptj = config_from_hf(GPTJ_6B)
    assert family_for_config(gptj).name == "gptj"
    phi = dataclasses.replace(gptj, qkv_bias=True, out_bias=True)  # GPT-J with Phi's biases
    with pytest.raises(ValueError, match="rope_interleaved=False"):
        config_to_hf(phi, family=FAMILY_BY_NAME["phi"])
    assert family_for_config(dataclasses.replace(phi, rope_interleaved=False,
                                                 scores_in_float32=False)).name == "phi"
    halves = dataclasses.replace(gptj, rope_interleaved=False)
    with pytest.raises(ValueError, match="rope_interleaved=True"):
        config_to_hf(halves, family=FAMILY_BY_NAME["gptj"])
    with pytest.raises(ValueError, match=r"rope_interleaved=True says how RoPE turns"):
        GPTConfig(rope_interleaved=True)  # learned positions
