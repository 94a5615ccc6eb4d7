"""hf/llama4.py: what the family cases of test_hf_families.py do not reach. The NoPE layers'
temperature where it moves the logits (a short floor_scale) against transformers; the
multimodal releases' directory (Llama4ForConditionalGeneration: its language model read, its
vision tower left unread, exported as Llama4ForCausalLM); Scout's released config.json, whose
parameters count as transformers counts them; the context cut at the chunk size."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import GPT, inspect_dir, load_hf, save_hf
from attnlab.generate import generate
from attnlab.hf import config_from_hf, config_to_hf
from attnlab.hf.llama4 import LLAMA4_MULTIMODAL
from attnlab.model.gpt import count_params
from helpers import left_padded, transformers_shapes

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.loading import hf_shapes, sparse_hf_dir

transformers = pytest.importorskip("transformers")

TEXT = dict(vocab_size=97, hidden_size=32, intermediate_size=24, intermediate_size_mlp=40,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=1,
            interleave_moe_layer_step=2, no_rope_layer_interval=2, attention_chunk_size=64,
            initializer_range=0.2, bos_token_id=0, eos_token_id=0, pad_token_id=0)
VISION = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
              image_size=28, patch_size=14, vision_output_dim=16, projector_input_dim=16,
              projector_output_dim=32, pixel_shuffle_ratio=0.5)
# meta-llama/Llama-4-Scout-17B-16E's config.json as released (transformers 4.51.0)
SCOUT_TEXT = {
    "attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0,
    "attn_scale": 0.1, "attn_temperature_tuning": 4, "bos_token_id": 200000,
    "eos_token_id": [200001, 200007, 200008], "floor_scale": 8192,
    "for_llm_compressor": False, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
    "initializer_range": 0.02, "interleave_moe_layer_step": 1, "intermediate_size": 8192,
    "intermediate_size_mlp": 16384, "max_position_embeddings": 262144,
    "model_type": "llama4_text", "moe_layers": list(range(48)),
    "no_rope_layers": [0 if (i + 1) % 4 == 0 else 1 for i in range(48)],
    "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48,
    "num_key_value_heads": 8, "num_local_experts": 16, "output_router_logits": False,
    "pad_token_id": 200018, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
    "torch_dtype": "bfloat16", "use_cache": True, "use_qk_norm": True, "vocab_size": 202048,
}
SCOUT = {"architectures": ["Llama4ForConditionalGeneration"], "boi_token_index": 200080,
         "eoi_token_index": 200081, "image_token_index": 200092, "model_type": "llama4",
         "text_config": SCOUT_TEXT, "tie_word_embeddings": False,
         "transformers_version": "4.51.0", "vision_config": {"model_type": "llama4_vision_model"}}


def _text_model(**fields: Any) -> Any:
    torch.manual_seed(0)
    config = transformers.Llama4TextConfig(**{**TEXT, **fields})
    config._attn_implementation = "eager"
    hf = transformers.Llama4ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return hf


@torch.no_grad()
def test_the_nope_layers_temperature_is_transformers(tmp_path: Path) -> None:
    """With floor_scale 4 the NoPE layers' q grows from position 3 on: the logits of a row
    and 30 greedy tokens (the decode step's own temperature) equal transformers', and set
    to nothing they would not; a left-padded row gives its own logits, counted from its
    first real token (transformers counts the padding: module doc)."""
    hf = _text_model(floor_scale=4, attn_scale=0.5)
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    assert ours.config.nope_temperature == 0.5 and ours.config.nope_temperature_floor == 4
    ids = torch.randint(1, 97, (1, 20), generator=torch.Generator().manual_seed(1))
    expected = hf(ids).logits
    torch.testing.assert_close(ours(ids).logits, expected, atol=1e-4, rtol=0)
    flat = GPT(ours.config.__class__(**{**ours.config.to_dict(), "nope_temperature": 0.0}))
    flat.load_state_dict(ours.state_dict())
    assert (flat(ids).logits - expected).abs().max() > 1e-3
    kwargs = dict(max_new_tokens=30, min_new_tokens=30, do_sample=False, eos_token_id=None)
    assert torch.equal(generate(ours, ids, max_new_tokens=30, temperature=0),
                       hf.generate(ids, attention_mask=torch.ones_like(ids), **kwargs))
    padded, mask = left_padded([6, 11], vocab=97, low=1, seed=4)
    alone = padded[0:1, -6:]
    torch.testing.assert_close(ours(padded, attention_mask=mask).logits[0, -6:],
                               ours(alone).logits[0], atol=1e-5, rtol=0)


def _multimodal(directory: Path) -> Any:
    torch.manual_seed(0)
    config = transformers.Llama4Config(text_config=TEXT, vision_config=VISION)
    hf = transformers.Llama4ForConditionalGeneration(config).eval()
    hf.save_pretrained(directory)
    return hf


@torch.no_grad()
def test_a_multimodal_release_loads_its_language_model_and_exports_it_alone(
        tmp_path: Path) -> None:
    """A Llama4ForConditionalGeneration directory: the language model's logits are
    transformers' (its vision tower's tensors left unread, none left over), `save_hf` writes
    a Llama4ForCausalLM that transformers reloads with the same logits, and the multimodal
    architecture itself is refused as an export by name."""
    hf = _multimodal(tmp_path / "mm")
    ours = load_hf(tmp_path / "mm")
    ids = torch.randint(1, 97, (2, 12), generator=torch.Generator().manual_seed(2))
    expected = hf.language_model(input_ids=ids).logits
    torch.testing.assert_close(ours(ids).logits, expected, atol=1e-4, rtol=0)
    save_hf(tmp_path / "text", ours)
    written = json.loads((tmp_path / "text" / "config.json").read_text())
    assert written["architectures"] == ["Llama4ForCausalLM"]
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "text").eval()
    torch.testing.assert_close(back(ids).logits, expected, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="Llama4ForConditionalGeneration is read, not written"):
        config_to_hf(ours.config, family=LLAMA4_MULTIMODAL)


def test_scouts_released_config_reads_as_transformers_builds_it() -> None:
    """Scout's config.json: 48 layers, every fourth NoPE with the temperature (its
    attn_temperature_tuning is 4), the L2 QK-norm, 16 experts top 1 with a shared one, the
    context cut at the 8192-position chunk; its parameter count equals that of transformers'
    Llama4ForCausalLM built on the meta device from the same text config."""
    c = config_from_hf(SCOUT)
    assert (c.n_layer, c.n_head, c.n_kv_head, c.head_size, c.vocab_size) == (
        48, 40, 8, 128, 202048)
    assert c.nope_layers == list(range(3, 48, 4)) and c.nope_temperature == 0.1
    assert c.qk_l2_norm and c.rope_interleaved and c.block_size == 8192
    assert (c.n_experts, c.experts_per_token, c.shared_expert_size, c.d_ff) == (16, 1, 8192, 8192)
    # transformers 5's strict config takes a boolean (4.51's stored the 4)
    text = {**SCOUT_TEXT, "attn_temperature_tuning": True}
    with torch.device("meta"):
        hf = transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(**text))
    assert count_params(c) == sum(p.numel() for p in hf.parameters())


def test_the_context_stops_at_the_chunk(tmp_path: Path) -> None:
    """attention_chunk_size below max_position_embeddings cuts block_size to the chunk;
    generation past it is refused by name; layer_types naming a chunk without a size is
    refused."""
    _text_model(attention_chunk_size=16).save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    assert ours.config.block_size == 16
    with pytest.raises(ValueError, match="block_size=16"):
        generate(ours, torch.ones(1, 10, dtype=torch.long), max_new_tokens=10, temperature=0)
    text = {**SCOUT_TEXT, "attention_chunk_size": None,
            "layer_types": ["chunked_attention"] * 48}
    with pytest.raises(ValueError, match="layer_types="):
        config_from_hf(text)


def test_scouts_language_model_has_transformers_names_and_shapes(tmp_path: Path) -> None:
    """Scout's language model as Llama4ForCausalLM (its stacked experts (16, 5120, 16384)
    and (16, 8192, 5120), the router, the shared expert): the tensors attnlab writes are
    transformers' names and shapes, and a sparse directory of them (no bytes read) counts
    transformers' parameters."""
    text = {**SCOUT_TEXT, "attn_temperature_tuning": True,
            "architectures": ["Llama4ForCausalLM"]}
    shapes, count = transformers_shapes(text)
    assert hf_shapes(text) == shapes
    assert shapes["model.layers.0.feed_forward.experts.gate_up_proj"] == (16, 5120, 16384)
    info = inspect_dir(sparse_hf_dir(tmp_path / "scout", text, shards=2))
    assert (info.family, info.parameters) == ("llama4", count)
