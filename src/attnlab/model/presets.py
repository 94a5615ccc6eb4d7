"""`GPTConfig.from_name`'s presets: the seeds' and the tests' shapes, and real shapes with
random weights."""

from __future__ import annotations

import math
from typing import Any

# The Llama family's shared switches: rotary positions, RMSNorm, SwiGLU, no biases.
_LLAMA: dict[str, Any] = dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=False)

PRESETS: dict[str, dict[str, Any]] = {
    # Seed 002's hello-world model: GPT-2 BPE's 50,257 ids (as the seed's tiktoken gives
    # them), 3-dim embeddings, one single-head attention without q/k/v bias, scores scaled by
    # 1/sqrt(3), a linear head; no MLP, norm or residual. `recipes.seed_experiment` trains it
    # on word ids instead (vocab_size set to the sentences' words: tiktoken's GPT-2 table is a
    # download; docs/notebooks/002_hello_world_and_animals.ipynb).
    "seed-minimal": dict(
        vocab_size=50257, block_size=5, n_layer=1, n_head=1, n_embd=3, bias=False, mlp="none",
        norm="none", residual=False, attn_out_proj=False, tie_weights=False,
        attn_scale=1 / math.sqrt(3), init_std=None,
    ),
    # For unit tests: a complete block stack in a few thousand parameters.
    "nano": dict(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=16),
    # nanoGPT's shakespeare_char CPU recipe shape, with its exact GELU.
    "tiny": dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, gelu="exact"),
    "gpt2": dict(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768),
    "gpt2-medium": dict(vocab_size=50257, block_size=1024, n_layer=24, n_head=16, n_embd=1024),
    # For tests: the Llama family (GQA, RoPE, RMSNorm, SwiGLU, untied head) at nano's size.
    "llama-tiny": dict(
        vocab_size=65, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, d_ff=48,
        tie_weights=False, **_LLAMA,
    ),
    # Real shapes, random init: SmolLM-135M, Pythia-70M (GPT-NeoX), Qwen2.5-0.5B.
    "smollm-135m": dict(
        vocab_size=49152, block_size=2048, n_layer=30, n_head=9, n_kv_head=3, n_embd=576,
        d_ff=1536, rope_theta=10000.0, norm_eps=1e-5, tie_weights=True, **_LLAMA,
    ),
    "pythia-70m": dict(
        vocab_size=50304, block_size=2048, n_layer=6, n_head=8, n_embd=512, d_ff=2048,
        pos="rope", rotary_pct=0.25, rope_theta=10000.0, parallel_residual=True,
        norm="layernorm", norm_eps=1e-5, gelu="exact", tie_weights=False, bias=True,
    ),
    "qwen2.5-0.5b": dict(
        vocab_size=151936, block_size=32768, n_layer=24, n_head=14, n_kv_head=2, n_embd=896,
        d_ff=4864, rope_theta=1000000.0, qkv_bias=True, norm_eps=1e-6, tie_weights=True,
        **_LLAMA,
    ),
}
