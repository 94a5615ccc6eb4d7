"""hf/minicpm3.py beyond the family cases of test_hf_families.py: MiniCPM3-4B's shape, with
its longrope written as the release writes it, reads as latent attention in dense blocks with
its three scalars, and counts transformers' parameters."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.hf import config_from_hf
from attnlab.model.gpt import count_params

transformers = pytest.importorskip("transformers")

# openbmb/MiniCPM3-4B's fields (the factor lists' values made up: 16 each, one a frequency)
MINICPM3_4B = {
    "architectures": ["MiniCPM3ForCausalLM"], "model_type": "minicpm3", "vocab_size": 73448,
    "hidden_size": 2560, "intermediate_size": 6400, "num_hidden_layers": 62,
    "num_attention_heads": 40, "num_key_value_heads": 40, "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32, "q_lora_rank": 768, "kv_lora_rank": 256, "hidden_act": "silu",
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "rope_scaling": {"type": "longrope", "long_factor": [1.0 + i / 8 for i in range(16)],
                     "short_factor": [1.0 + i / 16 for i in range(16)],
                     "original_max_position_embeddings": 32768},
    "scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def test_minicpm3_4b_reads_as_transformers_builds_it() -> None:
    c = config_from_hf(MINICPM3_4B)
    assert (c.kv_latent, c.q_latent, c.head_size, c.rope_head_dim, c.v_head_dim) == (
        256, 768, 96, 32, 64)
    assert (c.n_experts, c.rope_interleaved, c.rope_in_float32) == (None, False, False)
    assert c.embedding_multiplier == 12.0 and c.residual_multiplier == 1.4 / math.sqrt(62)
    assert c.logits_scaling == 10.0 and c.logits_scaled_first
    assert c.rope_scaling is not None and c.rope_scaling["rope_type"] == "longrope"
    with torch.device("meta"):
        hf = transformers.MiniCPM3ForCausalLM(transformers.MiniCPM3Config(**MINICPM3_4B))
    assert count_params(c) == sum(p.numel() for p in hf.parameters())
