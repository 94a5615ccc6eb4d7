"""hf/: attnlab on Llama / Mistral / Qwen2 / Qwen3 / GPT-NeoX / Gemma / Phi / Phi-3 / OLMo 2 /
OLMo 3 / SmolLM3 / GPT-J / GPT-Neo / OPT / StableLM / Granite / Falcon weights equals
transformers' eager attention on the same random weights (nothing downloaded), and exports
back.

Two shapes per family, between them: GQA, tied and untied heads, head_dim != C / nh,
attention / MLP biases, partial rotary, rope_theta != 10000, llama3 and linear RoPE scaling,
sliding windows shorter than the sequence (all layers, and some layers), QK-norm, parallel
and sequential residual, Gemma's scaled embeddings, (1 + w) norm and GeGLU, Gemma 3's sandwich
norms and per-layer-type RoPE, Gemma 2's soft caps, Phi's one norm for a parallel block and
bias on the head, GPT-J's RoPE on adjacent pairs, GPT-Neo's unscaled scores and local
layers, OPT's ReLU and offset position table, StableLM's biased LayerNorms beside unbiased
Linears, Granite's four scalars, Falcon's multi-query fused q/k/v, Phi-3's fused q/k/v and gate/up
projections, OLMo 2's output-only norms and whole-width QK-norm, OLMo 3's windowed layers
with RoPE per layer type, SmolLM3's layers without RoPE; one yarn case per family, its
original_max_position_embeddings (16) shorter than the sequences, its attention factor
derived (from factor, or mscale / mscale_all_dim) or given; and Phi-3's longrope, whose
switch (16) the sequences and generations cross. Each model is written with
`save_pretrained` and read back with `load_hf`, so the directory reading is exercised too.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import GPT, load_hf, save_hf
from attnlab.generate import generate
from attnlab.hf import config_to_hf, family_of
from attnlab.model.gpt import laid_out
from attnlab.model.layers import kept_float32
from helpers import assert_logits_match_hf, assert_ngrams_and_typical_p_match_hf, left_padded

transformers = pytest.importorskip("transformers")

LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=128)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # GQA 4:2, tied, rope_theta 5e5, eps 1e-5
    "llama-gqa-tied": ("Llama", dict(**SMALL, num_key_value_heads=2, tie_word_embeddings=True,
                                     rms_norm_eps=1e-5,
                                     rope_parameters={"rope_type": "default",
                                                      "rope_theta": 500000.0})),
    # untied, multi-query, head_dim 16 != 48 / 4, biases everywhere, llama3 scaling
    "llama-mqa-llama3-bias": ("Llama", dict(
        vocab_size=89, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
        attention_bias=True, mlp_bias=True, tie_word_embeddings=False, rope_parameters=LLAMA3)),
    # window 6 on every layer, GQA, untied
    "mistral-window": ("Mistral", dict(**SMALL, num_key_value_heads=2, sliding_window=6,
                                       tie_word_embeddings=False)),
    # window 9, tied, rope_theta 1e6
    "mistral-tied": ("Mistral", dict(**{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=4,
                                     sliding_window=9, tie_word_embeddings=True,
                                     rope_parameters={"rope_type": "default",
                                                      "rope_theta": 1e6})),
    # q/k/v bias without o bias, window 5 on layers >= 1 only (max_window_layers), tied
    "qwen2-some-layers-windowed": ("Qwen2", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=2, use_sliding_window=True,
        sliding_window=5, max_window_layers=1, tie_word_embeddings=True)),
    # linear RoPE scaling, untied, no window
    "qwen2-linear-rope": ("Qwen2", dict(
        **SMALL, num_key_value_heads=1, tie_word_embeddings=False,
        rope_parameters={"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0})),
    # QK-norm, head_dim 16 (wider than 32 / 4), GQA, tied
    "qwen3-qknorm": ("Qwen3", dict(**SMALL, num_key_value_heads=2, head_dim=16,
                                   tie_word_embeddings=True)),
    # QK-norm with attention_bias, untied, a window on the layers layer_types names
    "qwen3-bias-window": ("Qwen3", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=4, head_dim=8,
        attention_bias=True, tie_word_embeddings=False, use_sliding_window=True,
        sliding_window=7, layer_types=["sliding_attention", "full_attention",
                                       "sliding_attention"])),
    # Pythia-style: parallel residual, rotary on 25% of each head, untied embed_out
    "neox-parallel": ("GPTNeoX", dict(
        vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=128, use_parallel_residual=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25}, tie_word_embeddings=False)),
    # sequential residual, rotary on half of each head, base 1000, tied, no attention bias
    "neox-sequential": ("GPTNeoX", dict(
        vocab_size=83, hidden_size=48, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=3, max_position_embeddings=128, use_parallel_residual=False,
        attention_bias=False, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                         "partial_rotary_factor": 0.5})),
    # yarn as the Qwen3 model card adds it (factor 4, attention factor derived), GQA, untied
    "llama-yarn": ("Llama", dict(**SMALL, num_key_value_heads=2, tie_word_embeddings=False,
                                 rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                                  "factor": 4.0,
                                                  "original_max_position_embeddings": 16})),
    # yarn with DeepSeek's mscale / mscale_all_dim, its own betas, rope_theta 1e6, tied
    "qwen2-yarn-mscale": ("Qwen2", dict(**SMALL, num_key_value_heads=1, tie_word_embeddings=True,
                                        rope_parameters={
                                            "rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0,
                                            "original_max_position_embeddings": 16,
                                            "beta_fast": 16, "beta_slow": 2, "mscale": 1.0,
                                            "mscale_all_dim": 0.5})),
    # yarn with QK-norm and a head_dim of 16; its ramp untruncated
    "qwen3-yarn": ("Qwen3", dict(**SMALL, num_key_value_heads=2, head_dim=16,
                                 tie_word_embeddings=False,
                                 rope_parameters={"rope_type": "yarn", "rope_theta": 1e6,
                                                  "factor": 4.0, "truncate": False,
                                                  "original_max_position_embeddings": 16})),
    # yarn on half of each head with a given attention factor
    "neox-yarn": ("GPTNeoX", dict(
        vocab_size=101, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=128, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                         "original_max_position_embeddings": 16, "attention_factor": 1.25,
                         "partial_rotary_factor": 0.5})),
    # Gemma: scaled embeddings, (1 + w) RMSNorm, GeGLU; multi-query, head_dim 16 (wider than
    # 32 / 4), tied
    "gemma-mqa": ("Gemma", dict(**SMALL, num_key_value_heads=1, head_dim=16)),
    # the first releases' legacy hidden_act "gelu" (tanh in transformers 5), attention
    # bias, GQA, untied, rope_theta 1e5, a hub config's hidden_activation beside it
    "gemma-bias-untied": ("Gemma", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=2, head_dim=8,
        hidden_act="gelu", hidden_activation="gelu_pytorch_tanh", attention_bias=True,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0})),
    # Gemma 3: sandwich norms, (1 + w) QK-norm, query_pre_attn_scalar 24 (not head_dim),
    # window 5 on every other layer with its own RoPE base, linear scaling on the full ones
    "gemma3-local-rope": ("Gemma3Text", dict(
        **{**SMALL, "num_hidden_layers": 4}, num_key_value_heads=2, head_dim=16,
        sliding_window=5, sliding_window_pattern=2, query_pre_attn_scalar=24,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    # every layer full, one RoPE, attention bias, multi-query, untied
    "gemma3-full-untied": ("Gemma3Text", dict(
        **SMALL, num_key_value_heads=1, head_dim=8, attention_bias=True,
        tie_word_embeddings=False, layer_types=["full_attention"] * 2,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    # Gemma 2: soft caps of 50 (scores) and 30 (logits) by default, window 6 on the first and
    # third layers, query_pre_attn_scalar 24, GQA, tied; caps small enough to bite at init 0.2
    "gemma2-caps-window": ("Gemma2", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=2, head_dim=16,
        sliding_window=6, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0)),
    # Gemma 2 without caps (null), attention bias, multi-query, untied, rope_theta 1e5
    "gemma2-uncapped-untied": ("Gemma2", dict(
        **SMALL, num_key_value_heads=1, head_dim=8, attention_bias=True,
        tie_word_embeddings=False, attn_logit_softcapping=None, final_logit_softcapping=None,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0})),
    # Phi-2's shape: one LayerNorm for the parallel attention and MLP, biases on every
    # projection and on the head, RoPE on 0.4 of each head (head_dim 10), untied
    "phi-partial": ("Phi", dict(
        vocab_size=97, hidden_size=40, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=128, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.4})),
    # GQA 4:2, a tied head with its own bias, the exact GELU, linear scaling of half of
    # each head (PhiConfig's default part)
    "phi-gqa-tied": ("Phi", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=2, tie_word_embeddings=True,
        hidden_act="gelu", rope_parameters={"rope_type": "linear", "rope_theta": 500.0,
                                            "factor": 2.0})),
    # GPT-J: Phi's block without attention biases, RoPE on 4 of each head's 8 dims turned in
    # adjacent pairs (GPT-J-6B: 64 of 256), untied
    "gptj-pairs": ("GPTJ", dict(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                                rotary_dim=4)),
    # the whole head turned, a tied head with its own bias, the exact GELU, n_inner 40
    "gptj-whole-tied": ("GPTJ", dict(vocab_size=89, n_embd=32, n_layer=3, n_head=4,
                                     n_positions=128, rotary_dim=8, n_inner=40,
                                     activation_function="gelu", tie_word_embeddings=True)),
    # GPT-Neo (TinyStories): unscaled scores, no q/k/v bias, a window of 5 on its "local"
    # layers between "global" ones, tied
    "gpt_neo-local": ("GPTNeo", dict(vocab_size=97, hidden_size=32, num_heads=4,
                                     max_position_embeddings=128, num_layers=2, window_size=5,
                                     attention_types=[[["global", "local"], 1]])),
    # every layer local (window 6), untied, the exact GELU, intermediate_size 40
    "gpt_neo-all-local": ("GPTNeo", dict(vocab_size=89, hidden_size=32, num_heads=4,
                                         max_position_embeddings=128, num_layers=3,
                                         window_size=6, attention_types=[[["local"], 3]],
                                         tie_word_embeddings=False, intermediate_size=40,
                                         activation_function="gelu")),
    # OPT: GPT-2's blocks with a ReLU MLP, a position table two rows longer, tied
    "opt-tied": ("OPT", dict(vocab_size=97, hidden_size=32, word_embed_proj_dim=32,
                             num_attention_heads=4, num_hidden_layers=2, ffn_dim=48,
                             max_position_embeddings=128, init_std=0.2)),
    # untied, three layers, ffn_dim 40
    "opt-untied": ("OPT", dict(vocab_size=89, hidden_size=32, word_embed_proj_dim=32,
                               num_attention_heads=4, num_hidden_layers=3, ffn_dim=40,
                               max_position_embeddings=128, init_std=0.2,
                               tie_word_embeddings=False)),
    # StableLM 2: Llama's weights with LayerNorms (biased), RoPE on a quarter of each head
    # (StableLmConfig's default), GQA, untied
    "stablelm-gqa": ("StableLm", dict(**SMALL, num_key_value_heads=2)),
    # q/k/v biases, RoPE on half of each head at base 500, tied
    "stablelm-qkv-bias-tied": ("StableLm", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=4, use_qkv_bias=True,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                   "partial_rotary_factor": 0.5})),
    # StableLM-2-12B's QK-norm: a LayerNorm with its own weight on each head's q and k (one
    # tensor a head in the files), GQA (its parallel blocks: test_stablelm.py, in float32)
    "stablelm-qk-layernorm": ("StableLm", dict(**SMALL, num_key_value_heads=2,
                                               qk_layernorm=True)),
    # Granite: Llama with embeddings times 12, branches times 0.22, scores times 1/16 (not
    # 1/sqrt(8)), logits divided by 2; GQA, untied
    "granite-gqa": ("Granite", dict(**SMALL, num_key_value_heads=2, embedding_multiplier=12.0,
                                    residual_multiplier=0.22, attention_multiplier=0.0625,
                                    logits_scaling=2.0)),
    # attention and MLP biases, tied, other scalars
    "granite-bias-tied": ("Granite", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=4, attention_bias=True,
        mlp_bias=True, tie_word_embeddings=True, embedding_multiplier=6.0,
        residual_multiplier=0.8, attention_multiplier=0.25, logits_scaling=1.25)),
    # Falcon-7B's layout: attention and MLP on one LayerNorm (biased, beside unbiased
    # Linears), multi-query q/k/v in one query_key_value, the exact GELU, tied
    "falcon-parallel-mqa": ("Falcon", dict(vocab_size=97, hidden_size=32, num_attention_heads=4,
                                           num_hidden_layers=2, max_position_embeddings=128)),
    # one block after the other, a key/value head per query head (per-head fused q/k/v),
    # biases everywhere, the tanh GELU, untied
    "falcon-sequential": ("Falcon", dict(
        vocab_size=89, hidden_size=32, num_attention_heads=4, num_hidden_layers=3,
        max_position_embeddings=128, multi_query=False, parallel_attn=False, bias=True,
        tie_word_embeddings=False, activation="gelu_pytorch_tanh")),
    # Phi-3: q/k/v in one qkv_proj and gate/up in one gate_up_proj; GQA, window 5 on every
    # layer (Phi-3-mini-4k: 2047), untied
    "phi3-gqa-window": ("Phi3", dict(
        **SMALL, num_key_value_heads=2, sliding_window=5, tie_word_embeddings=False,
        original_max_position_embeddings=128)),
    # Phi-4-mini's shape: RoPE on 3/4 of each head, tied, rope_theta 1e4, no window
    "phi3-partial-tied": ("Phi3", dict(
        **{**SMALL, "num_hidden_layers": 3}, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.75})),
    # Phi-3.5 / Phi-4-mini's longrope: two frequency sets, the long one past
    # original_max_position_embeddings (16), which the sequences and generations cross (the
    # generations encode the sequence again there); its attention factor from 128 / 16
    "phi3-longrope": ("Phi3", dict(
        **SMALL, num_key_value_heads=2, original_max_position_embeddings=16,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "short_factor": [1.0, 1.1, 1.5, 2.0],
                         "long_factor": [1.2, 3.0, 7.5, 16.0]})),
    # OLMo 2: norms on the branches' outputs alone, QK-norm over the whole q and k; GQA,
    # untied, rope_theta 5e5
    "olmo2-gqa": ("Olmo2", dict(
        **SMALL, num_key_value_heads=2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    # attention biases on all four projections, multi-query, tied, head_dim 16 != 32 / 4
    "olmo2-bias-mqa": ("Olmo2", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=1, head_dim=16,
        attention_bias=True, tie_word_embeddings=True)),
    # OLMo 3: OLMo 2's blocks, three windowed layers (window 5) then a full one by default,
    # GQA, untied, both layer types at Olmo3Config's base (500,000)
    "olmo3-windows": ("Olmo3", dict(
        **{**SMALL, "num_hidden_layers": 4}, num_key_value_heads=2, sliding_window=5,
        tie_word_embeddings=False)),
    # layer types given, yarn on the full layers only, the windowed layers' own base (1e4),
    # biases on all four projections, tied
    "olmo3-yarn-full": ("Olmo3", dict(
        **{**SMALL, "num_hidden_layers": 3}, sliding_window=6, attention_bias=True,
        tie_word_embeddings=True,
        layer_types=["full_attention", "sliding_attention", "full_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "yarn", "factor": 8.0, "rope_theta": 500000.0,
                               "original_max_position_embeddings": 16},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    # SmolLM3: no RoPE in every fourth layer (SmolLM3Config's default), GQA, untied, its
    # default base (2e6)
    "smollm3-nope": ("SmolLM3", dict(
        **{**SMALL, "num_hidden_layers": 4}, num_key_value_heads=2, tie_word_embeddings=False)),
    # no RoPE in layers 1 and 3, which also take a window of 5 (use_sliding_window), biases on
    # the attention and the MLP, tied
    "smollm3-nope-windows": ("SmolLM3", dict(
        **{**SMALL, "num_hidden_layers": 4}, no_rope_layers=[1, 0, 1, 0],
        use_sliding_window=True, sliding_window=5, attention_bias=True, mlp_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # Mixtral: 4 experts, each token through its top 2, renormalised; GQA, untied, window 6
    "mixtral-top2-window": ("Mixtral", dict(**SMALL, num_key_value_heads=2, num_local_experts=4,
                                            num_experts_per_tok=2, sliding_window=6)),
    # every token through 3 of 3 experts, tied, no window
    "mixtral-all-tied": ("Mixtral", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=4, num_local_experts=3,
        num_experts_per_tok=3, tie_word_embeddings=True)),
    # OLMoE: QK-norm over whole q and k, 6 experts, top 2 as the router's probabilities
    # (norm_topk_prob false), untied
    "olmoe-top2": ("Olmoe", dict(**SMALL, num_experts=6, num_experts_per_tok=2)),
    # renormalised top 3, attention biases, multi-query, tied
    "olmoe-normed-bias": ("Olmoe", dict(
        **SMALL, num_key_value_heads=1, num_experts=5, num_experts_per_tok=3,
        norm_topk_prob=True, attention_bias=True, tie_word_embeddings=True)),
    # Qwen3-MoE: QK-norm per head, experts 24 wide (moe_intermediate_size), top 2 of 5
    # renormalised; GQA, head_dim 16, untied
    "qwen3_moe-normed": ("Qwen3Moe", dict(
        **SMALL, num_key_value_heads=2, head_dim=16, num_experts=5, num_experts_per_tok=2,
        moe_intermediate_size=24, norm_topk_prob=True)),
    # top 1 of 4 as its probability, attention biases, tied
    "qwen3_moe-top1-bias": ("Qwen3Moe", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_experts=4, num_experts_per_tok=1,
        moe_intermediate_size=40, attention_bias=True, tie_word_embeddings=True)),
    # GraniteMoE: Granite's scalars, 4 experts in two 3-D tensors a layer, top 2 weighed by a
    # softmax of their logits; GQA, untied
    "granitemoe-top2": ("GraniteMoe", dict(
        **SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625,
        logits_scaling=2.0)),
    # top 3 of 5, attention biases, tied, other scalars
    "granitemoe-bias-tied": ("GraniteMoe", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=4, num_local_experts=5,
        num_experts_per_tok=3, attention_bias=True, tie_word_embeddings=True,
        embedding_multiplier=6.0, residual_multiplier=0.8, attention_multiplier=0.25,
        logits_scaling=1.25)),
    # Qwen2-MoE: 4 experts 24 wide, top 2 as the router's probabilities, and a shared expert
    # 40 wide behind its sigmoid gate; q/k/v bias, GQA, untied
    "qwen2_moe-shared": ("Qwen2Moe", dict(
        **SMALL, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=24, shared_expert_intermediate_size=40)),
    # top 3 of 5 renormalised, no q/k/v bias, a window of 6 from layer 1 on, tied
    "qwen2_moe-normed-window": ("Qwen2Moe", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=4, num_experts=5,
        num_experts_per_tok=3, moe_intermediate_size=16, shared_expert_intermediate_size=32,
        norm_topk_prob=True, qkv_bias=False, use_sliding_window=True, sliding_window=6,
        max_window_layers=1, tie_word_embeddings=True)),
    # GLM: half of each head turned on adjacent pairs, q/k/v biases, fused gate and up
    "glm-gqa": ("Glm", dict(**SMALL, num_key_value_heads=2, head_dim=16,
                            rope_parameters=dict(rope_type="default", rope_theta=5e5,
                                                 partial_rotary_factor=0.5))),
    # GLM-4: sandwich norms, heads of 8 (4 dims turned), no attention bias, tied
    "glm4-sandwich": ("Glm4", dict(
        **SMALL, num_key_value_heads=4, head_dim=8, attention_bias=False,
        tie_word_embeddings=True, rms_norm_eps=1e-5,
        rope_parameters=dict(rope_type="default", rope_theta=1e4,
                             partial_rotary_factor=0.5))),
    # StarCoder2: GPT-2's blocks with GQA, RoPE and a window of 6, tied
    "starcoder2-window": ("Starcoder2", dict(
        **SMALL, num_key_value_heads=2, sliding_window=6, norm_epsilon=1e-5,
        rope_parameters=dict(rope_type="default", rope_theta=1e5))),
    # no biases, multi-query, exact GELU, untied
    "starcoder2-mqa": ("Starcoder2", dict(
        **SMALL, num_key_value_heads=1, use_bias=False, hidden_act="gelu",
        tie_word_embeddings=False)),
    # EXAONE 4.0: post-norms alone, QK-norm, three windowed layers with RoPE then a full
    # NoPE one
    "exaone4-hybrid": ("Exaone4", dict(
        **{**SMALL, "num_hidden_layers": 4}, num_key_value_heads=2, head_dim=16,
        sliding_window=6, sliding_window_pattern=4, tie_word_embeddings=True)),
    # no window: every layer full and rotating, multi-query (layer_types named: transformers'
    # default divides by a pattern of 0 without a window)
    "exaone4-global": ("Exaone4", dict(
        **SMALL, num_key_value_heads=1, sliding_window=None,
        layer_types=["full_attention"] * 2,
        rope_parameters=dict(rope_type="default", rope_theta=1e6))),
    # Command-R: parallel blocks on one unbiased LayerNorm, RoPE on pairs, logits x 0.25, tied
    "cohere-gqa": ("Cohere", dict(**SMALL, num_key_value_heads=2, logit_scale=0.25,
                                  layer_norm_eps=1e-5)),
    # attention biases, untied, logit_scale 1
    "cohere-bias": ("Cohere", dict(**SMALL, attention_bias=True, tie_word_embeddings=False,
                                   logit_scale=1.0)),
    # Command R+: a LayerNorm on each head's q and k with a weight row per head, GQA
    "cohere-qk-norm": ("Cohere", dict(**SMALL, num_key_value_heads=2, use_qk_norm=True,
                                      logit_scale=0.5)),
    # Command R7B: three windowed RoPE layers, then a full NoPE one
    "cohere2-hybrid": ("Cohere2", dict(
        **{**SMALL, "num_hidden_layers": 4}, num_key_value_heads=2, sliding_window=6,
        logit_scale=0.5)),
    # Seed-OSS: q/k/v biases (its default), head_dim 16, GQA
    "seed_oss-qkv-bias": ("SeedOss", dict(**SMALL, num_key_value_heads=2, head_dim=16)),
    # every bias off but the output projection's and the MLP's, tied
    "seed_oss-out-bias": ("SeedOss", dict(
        **SMALL, num_key_value_heads=4, head_dim=8, attention_bias=False,
        attention_out_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    # ERNIE 4.5: RoPE on pairs in float32, tied (its default), GQA
    "ernie4_5-tied": ("Ernie4_5", dict(**SMALL, num_key_value_heads=2, head_dim=8)),
    # every bias on, untied
    "ernie4_5-bias": ("Ernie4_5", dict(**SMALL, head_dim=8, use_bias=True,
                                       tie_word_embeddings=False)),
    # Helium: RoPE on pairs, norms scaled in float32, q/k/v biases
    "helium-bias": ("Helium", dict(**SMALL, num_key_value_heads=4, head_dim=8,
                                   attention_bias=True, rms_norm_eps=1e-6)),
    # Arcee (AFM): an ungated relu^2 MLP, GQA, YaRN
    "arcee-yarn": ("Arcee", dict(**SMALL, num_key_value_heads=2, rope_parameters=dict(
        rope_type="yarn", rope_theta=1e4, factor=4.0, original_max_position_embeddings=32))),
    # attention and MLP biases, tied
    "arcee-bias": ("Arcee", dict(**SMALL, attention_bias=True, mlp_bias=True,
                                 tie_word_embeddings=True)),
    # gpt-oss: sinks, windowed and full layers in turn, YaRN, top 2 of 4 clamped experts
    "gpt_oss-windows": ("GptOss", dict(
        **SMALL, num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=4, rope_parameters=dict(
            rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
            original_max_position_embeddings=32, truncate=False))),
    # every layer full, top 3 of 5, a clamp most gates reach, no attention bias, tied
    "gpt_oss-full-clamped": ("GptOss", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=4, head_dim=8,
        num_local_experts=5, num_experts_per_tok=3, swiglu_limit=0.5, swiglu_alpha=1.2,
        attention_bias=False, tie_word_embeddings=True, layer_types=["full_attention"] * 3,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # GLM-4.5: DeepSeek-V3's sigmoid router, top 3 of 8 in 4 groups of which 2 are kept,
    # renormalised, times 2.5; two shared experts' width, a dense first layer, QK-norm, q/k/v
    # biases, half of each head turned, untied
    "glm4_moe-groups": ("Glm4Moe", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=2, head_dim=16,
        n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
        norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=2,
        moe_intermediate_size=16, first_k_dense_replace=1, use_qk_norm=True,
        attention_bias=True)),
    # top 2 of 4 as their scores, no groups, every layer a mixture, no QK-norm or biases, a
    # quarter of each head turned, tied
    "glm4_moe-plain": ("Glm4Moe", dict(
        **SMALL, num_key_value_heads=4, head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
        norm_topk_prob=False, n_shared_experts=1, moe_intermediate_size=24,
        first_k_dense_replace=0, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=1e5,
                             partial_rotary_factor=0.25))),
    # dots.llm1: Qwen3's attention (QK-norm, all four biases), a window of 6 from layer 1 on;
    # top 2 of 6 in 3 groups of which 2 are kept, renormalised, times 1.5, a dense first layer
    "dots1-groups-window": ("Dots1", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=2, n_routed_experts=6,
        num_experts_per_tok=2, n_group=3, topk_group=2, norm_topk_prob=True,
        routed_scaling_factor=1.5, n_shared_experts=1, moe_intermediate_size=16,
        first_k_dense_replace=1, attention_bias=True, sliding_window=6, max_window_layers=1)),
    # top 3 of 4 as their scores times 2, no window, every layer a mixture, tied
    "dots1-plain": ("Dots1", dict(
        **SMALL, num_key_value_heads=1, n_routed_experts=4, num_experts_per_tok=3,
        routed_scaling_factor=2.0, n_shared_experts=1, moe_intermediate_size=24,
        sliding_window=None, tie_word_embeddings=True)),
    # ERNIE 4.5 MoE: a softmax router in float32 picking top 2 of 6 by probability plus a
    # correction bias, renormalised by a sum clamped at 0.6 (which many tokens' picks fall
    # under); mixtures on layers 1 and 3 (from 1, every second), dense layers 0 and 2 48
    # wide; two shared experts' width; head_dim 16 beside hidden_size 32, GQA, untied
    "ernie4_5_moe-interval": ("Ernie4_5_Moe", dict(
        **{**SMALL, "num_hidden_layers": 4}, num_key_value_heads=2, head_dim=16,
        moe_num_experts=6, moe_k=2, moe_intermediate_size=16, moe_num_shared_experts=2,
        moe_layer_start_index=1, moe_layer_end_index=-1, moe_layer_interval=2,
        moe_norm_min=0.6, tie_word_embeddings=False)),
    # top 3 of 4, no shared expert, a dense first layer then mixtures to the last, the clamp
    # at 1e-12 (its default: never reached), tied (its default), multi-query
    "ernie4_5_moe-dense-first": ("Ernie4_5_Moe", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=1, moe_num_experts=4,
        moe_k=3, moe_intermediate_size=24, moe_num_shared_experts=0)),
    # DeepSeek-V3: latent attention (q through a 12-wide latent, k and v from a 16-wide one,
    # 8 dims without RoPE + 4 turned in pairs, values 6 wide); the sigmoid router, top 3 of 8
    # in 4 groups of which 2 are kept, renormalised, times 2.5, a dense first layer, untied
    "deepseek_v3-latent-groups": ("DeepseekV3", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=4, kv_lora_rank=16,
        q_lora_rank=12, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6,
        n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
        norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=1,
        moe_intermediate_size=16, first_k_dense_replace=1)),
    # q straight from x, values as wide as q and k, RoPE in halves (rope_interleave false)
    # and yarn with mscale_all_dim (scores scaled by its square), every layer a mixture of
    # top 2 of 4 as their scores, two shared experts' width, tied
    "deepseek_v3-yarn-direct-q": ("DeepseekV3", dict(
        **SMALL, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, norm_topk_prob=False,
        n_shared_experts=2, moe_intermediate_size=16, first_k_dense_replace=0,
        rope_interleave=False, tie_word_embeddings=True, rope_parameters=dict(
            rope_type="yarn", rope_theta=10000.0, factor=4.0, mscale=1.0, mscale_all_dim=0.8,
            beta_fast=32.0, beta_slow=1.0, original_max_position_embeddings=16))),
    # DeepSeek-V2: RoPE as complex numbers in float32; the softmax router in float32, top 3
    # of 8 in the 2 of 4 groups with the best single expert, unrenormalised, times 16
    "deepseek_v2-group-limited": ("DeepseekV2", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=4, kv_lora_rank=16,
        q_lora_rank=12, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6,
        n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
        topk_method="group_limited_greedy", routed_scaling_factor=16.0, n_shared_experts=1,
        moe_intermediate_size=16, first_k_dense_replace=1)),
    # V2-Lite's shape: q straight from x, greedy top 2 of 6, two shared experts, attention
    # biases, tied
    "deepseek_v2-lite": ("DeepseekV2", dict(
        **SMALL, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None,
        qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=6,
        num_experts_per_tok=2, n_shared_experts=2, moe_intermediate_size=16,
        first_k_dense_replace=1, attention_bias=True, tie_word_embeddings=True)),
    # Llama 4: a mixture every other layer (top 1 of 4, its input scaled, a shared expert)
    # beside dense layers of their own width, NoPE every other layer, the L2 QK-norm after
    # RoPE in the others, llama3 RoPE on pairs in float32, GQA, a chunk as long as the context
    "llama4-interleaved": ("Llama4Text", dict(
        **{**SMALL, "num_hidden_layers": 4, "intermediate_size": 24}, num_key_value_heads=2,
        head_dim=8, intermediate_size_mlp=40, num_local_experts=4, num_experts_per_tok=1,
        interleave_moe_layer_step=2, no_rope_layer_interval=2, attention_chunk_size=128,
        rope_parameters=LLAMA3)),
    # every layer a mixture (top 2 of 4), NoPE layers listed, no QK-norm, no temperature,
    # attention biases, tied
    "llama4-listed-bias": ("Llama4Text", dict(
        **{**SMALL, "num_hidden_layers": 3, "intermediate_size": 24}, num_key_value_heads=4,
        head_dim=8,
        num_local_experts=4, num_experts_per_tok=2, no_rope_layers=[1, 0, 1],
        use_qk_norm=False, attn_temperature_tuning=False, attention_bias=True,
        attention_chunk_size=None, tie_word_embeddings=True)),
    # nanochat: unscaled RMSNorms (one on the embeddings too), RoPE turned backwards and
    # the QK-norm after it, relu^2, logits capped at 15, GQA, untied
    "nanochat-gqa": ("NanoChat", dict(**SMALL, num_key_value_heads=2)),
    # attention biases, no cap, rope_theta off the default
    "nanochat-bias": ("NanoChat", dict(**SMALL, attention_bias=True,
                                       final_logit_softcapping=None,
                                       rope_parameters=dict(rope_type="default",
                                                            rope_theta=500.0))),
    # StarCoder / SantaCoder: GPT-2's blocks with multi-query attention in one c_attn
    "gpt_bigcode-mqa": ("GPTBigCode", dict(vocab_size=97, n_embd=32, n_layer=2, n_head=4,
                                           n_positions=128, n_inner=48)),
    # every head its own k and v (c_attn per head), the exact GELU, unscaled scores, untied
    "gpt_bigcode-mha": ("GPTBigCode", dict(vocab_size=97, n_embd=32, n_layer=2, n_head=4,
                                           n_positions=128, multi_query=False,
                                           activation_function="gelu",
                                           scale_attn_weights=False,
                                           tie_word_embeddings=False)),
    # OLMo 1: LayerNorms without scale or bias, q/k/v clamped, GQA, untied
    "olmo-clip": ("Olmo", dict(**SMALL, num_key_value_heads=2, clip_qkv=0.3)),
    # no clamp, attention biases, tied, rope_theta off the default
    "olmo-bias": ("Olmo", dict(**SMALL, attention_bias=True, tie_word_embeddings=True,
                               rope_parameters=dict(rope_type="default", rope_theta=500.0))),
    # MiniCPM3: latent attention with q through a latent, RoPE in halves, the three
    # scalars (3 x embeddings, branches times 1.4 / sqrt(2), the head's input / 3.2), tied
    "minicpm3-scalars": ("MiniCPM3", dict(
        **SMALL, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=12, qk_nope_head_dim=8,
        qk_rope_head_dim=4, v_head_dim=8, scale_emb=3.0, scale_depth=1.4, dim_model_base=10)),
    # q straight from x, no scalars (two null), values as wide as hidden / heads, untied
    "minicpm3-plain": ("MiniCPM3", dict(
        **SMALL, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=4,
        qk_rope_head_dim=4, scale_emb=1.0, scale_depth=None, dim_model_base=None,
        tie_word_embeddings=False)),
    # Ministral: a window on the layers layer_types names, GQA (head_dim written: transformers
    # 5.24's MinistralConfig leaves it None otherwise and its attention fails)
    "ministral-alternating": ("Ministral", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=2, head_dim=8, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    # Hunyuan: QK-norm after RoPE, the releases' "dynamic" RoPE with a fixed alpha, GQA
    "hunyuan-ntk-alpha": ("HunYuanDenseV1", dict(
        **SMALL, num_key_value_heads=2, head_dim=8, rope_parameters=dict(
            rope_type="dynamic", rope_theta=10000.0, alpha=1000.0, factor=1.0))),
    # plain RoPE, attention biases, tied
    "hunyuan-bias": ("HunYuanDenseV1", dict(**SMALL, head_dim=8, attention_bias=True,
                                            tie_word_embeddings=True)),
    # VaultGemma: Gemma 2 without its post-norms, windows every other layer, both caps
    "vaultgemma-caps": ("VaultGemma", dict(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=2, head_dim=8,
        sliding_window=4, query_pre_attn_scalar=8)),
    # EXAONE 3: Llama's computation under its own model_type (transformers runs it as
    # LlamaForCausalLM and saves Llama's names), llama3 RoPE, GQA, tied
    "exaone-llama3": ("Exaone", dict(**SMALL, num_key_value_heads=2, tie_word_embeddings=True,
                                     rope_parameters=LLAMA3)),
}
# the model class where it is not f"{prefix}ForCausalLM"
MODEL_CLASS = {"Gemma3Text": "Gemma3ForCausalLM", "Llama4Text": "Llama4ForCausalLM",
               "Exaone": "LlamaForCausalLM"}


def hf_model(case: str) -> Any:
    """A random-weight transformers model of `case`, eager attention, eval mode."""
    prefix, fields = CASES[case]
    torch.manual_seed(0)
    config = getattr(transformers, f"{prefix}Config")(
        **fields,
        # a wide init gives peaked logits, so greedy argmax never hinges on a 1e-6 near-tie
        initializer_range=0.2, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # a mixture's experts one by one, not grouped
    model = getattr(transformers, MODEL_CLASS.get(prefix, f"{prefix}ForCausalLM"))(config).eval()
    with torch.no_grad():  # norms start at 1 (and biases at 0): give them values to map
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():  # DeepSeek-V3's router: a bias that moves picks
            if name.endswith("e_score_correction_bias"):
                b.add_(0.3 * torch.randn_like(b))
        # ERNIE 4.5's (a parameter, the 0.1 above) moves picks among probabilities too
        # (`test_ernie4_5_moe.py` checks it and the clamp do)
    return model


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    hf = hf_model(request.param)
    directory = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(directory)
    return hf, load_hf(directory), directory


def test_logits_equal_eager_single_and_left_padded(pair: tuple) -> None:
    hf, ours, _ = pair
    assert_logits_match_hf(ours, hf, [5, 17, 11])


@torch.no_grad()
def test_traced_attention_weights_are_hugging_faces(pair: tuple) -> None:
    """Every layer's traced weights equal transformers' output_attentions on a left-padded
    batch (real query rows; windows, per-layer RoPE and sandwich norms included), and the
    entropy summary equals the entropy of those weights."""
    from attnlab import Trace

    hf, ours, _ = pair
    ids, mask = left_padded([5, 17, 11], vocab=ours.config.vocab_size, low=1, seed=3)
    trace = Trace(names=["attn_weights", "attn_entropy"])
    ours(ids, attention_mask=mask, trace=trace)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T): learned positions need them
    theirs = hf(ids, attention_mask=mask, position_ids=positions,
                output_attentions=True).attentions
    real = mask.bool()[:, None, :, None]  # (B, 1, T, 1): rows of real queries
    for i, expected in enumerate(theirs):
        weights = trace.get("attn_weights", i)  # (B, nh, T, S)
        assert ((weights - expected).abs() * real).max() < 1e-5, i
        entropy = -torch.where(weights > 0, weights * weights.log(), 0.0).sum(-1)  # (B, nh, T)
        torch.testing.assert_close(trace.get("attn_entropy", i) * real[..., 0],
                                   entropy * real[..., 0], atol=1e-5, rtol=0)


def test_greedy_40_tokens_are_hugging_faces(pair: tuple) -> None:
    hf, ours, _ = pair
    ids, mask = left_padded([4, 12, 9], vocab=ours.config.vocab_size, low=1, seed=2)
    kwargs = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False, eos_token_id=None,
                  pad_token_id=0)
    expected = hf.generate(ids, attention_mask=mask, **kwargs)
    assert torch.equal(generate(ours, ids, mask, max_new_tokens=40, temperature=0), expected)
    single = ids[1:2]
    expected = hf.generate(single, attention_mask=torch.ones_like(single), **kwargs)
    assert torch.equal(generate(ours, single, max_new_tokens=40, temperature=0), expected)


def test_greedy_with_a_repetition_penalty_is_hugging_faces(pair: tuple) -> None:
    """generate(repetition_penalty=...) against transformers' generate(): greedy ids equal for
    a left-padded batch (its padding holds real ids, which neither side may count) and a row
    alone; sampled ids too, with every processor on and torch's RNG seeded alike."""
    hf, ours, _ = pair
    V = ours.config.vocab_size
    ids, mask = left_padded([4, 12, 9], vocab=V, low=1, seed=2)
    ids = torch.where(mask.bool(), ids, torch.randint(1, V, ids.shape))  # (B, P)
    kwargs = dict(max_new_tokens=30, min_new_tokens=30, eos_token_id=None, pad_token_id=0)
    for rows in (slice(None), slice(1, 2)):
        expected = hf.generate(ids[rows], attention_mask=mask[rows], do_sample=False,
                               repetition_penalty=2.0, **kwargs)
        got = generate(ours, ids[rows], mask[rows], max_new_tokens=30, temperature=0,
                       repetition_penalty=2.0)
        assert torch.equal(got, expected)
    assert not torch.equal(got, generate(ours, ids[1:2], max_new_tokens=30, temperature=0))
    how = dict(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.3)
    torch.manual_seed(5)
    expected = hf.generate(ids, attention_mask=mask, do_sample=True, **how, **kwargs)
    torch.manual_seed(5)  # generator=None: both draw from torch's global generator
    assert torch.equal(generate(ours, ids, mask, max_new_tokens=30, **how), expected)


def test_no_repeat_ngrams_and_typical_p_are_hugging_faces(pair: tuple) -> None:
    hf, ours, _ = pair
    assert_ngrams_and_typical_p_match_hf(ours, hf)


@torch.no_grad()
def test_save_hf_reloads_in_transformers_with_the_same_logits(pair: tuple, tmp_path: Path) -> None:
    hf, ours, directory = pair
    # as `attnlab export` does, the family the directory came from: a Phi-3 with a window
    # is also a Mistral, which save_hf would pick by default
    source = family_of(json.loads((directory / "config.json").read_text())).name
    save_hf(tmp_path, ours, family=source)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="eager", experts_implementation="eager").eval()
    assert type(reloaded) is type(hf)  # the same family, not merely the same numbers
    for name, tensor in hf.state_dict().items():
        back = reloaded.state_dict()[name]
        if name.endswith("embed_positions.weight"):  # OPT's: rows 0 and 1 only pads read,
            assert not back[:2].any()  # which attnlab does not keep: written as zeros
            back, tensor = back[2:], tensor[2:]
        assert torch.equal(back, tensor), name
    ids = torch.randint(1, ours.config.vocab_size, (2, 24), generator=torch.Generator())
    torch.testing.assert_close(reloaded(ids).logits, ours(ids).logits, atol=1e-4, rtol=0)
    again = load_hf(tmp_path)
    assert again.config == ours.config


@torch.no_grad()
def test_bfloat16_load_runs_close_to_float32(pair: tuple) -> None:
    _, ours, directory = pair
    half = load_hf(directory, dtype=torch.bfloat16)
    # a float32 router's weight stays float32, as transformers keeps it (`KeepsFloat32`)
    assert {p.dtype for n, p in half.named_parameters() if n not in kept_float32(half)} == {
        torch.bfloat16}
    ids = torch.randint(1, ours.config.vocab_size, (2, 16), generator=torch.Generator())
    full, low = ours(ids).logits, half(ids).logits.float()
    assert torch.isfinite(low).all()
    scale, error = full.abs().max(), (low - full).abs()
    if ours.config.n_experts is not None:  # a near tie between two experts may pick the
        error = error.max(dim=-1).values.median()  # other in bfloat16: that token moves far
    assert error.max() < 0.1 * scale  # bfloat16 keeps ~3 significant digits


def _laid(w: Any) -> Any:
    """A Linear weight (out, in) with the memory `GPT.lay_out_weights` gives it."""
    return w.t().contiguous().t() if w.shape[0] >= w.shape[1] else w.contiguous()


def _laid_out_as_attnlabs(hf: Any) -> None:
    """Give each of transformers' Linear weights the memory attnlab's has (`laid_out`: (in,
    out) where out >= in): a CPU's 16-bit product may sum in another order for another
    layout (an AMD EPYC's float16 ones do), which is the BLAS's choice, not a rounding
    either side writes."""
    for module in hf.modules():
        if isinstance(module, torch.nn.Linear) and not laid_out(module):
            module.weight.data = _laid(module.weight.data)
    for name, p in hf.named_parameters():  # a mixture's experts (E, out, in), as one a Linear
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")) and (
                hf.config.model_type != "gpt_oss"):  # gpt-oss's are (E, in, out): its own test
            rows = p.shape[1] // (2 if name.endswith("gate_up_proj") else 1)  # attnlab's
            if rows >= p.shape[2]:  # `_laid` of each expert's gate, up or down matrix
                p.data = p.data.transpose(1, 2).contiguous().transpose(1, 2)


def _rounding_as_attnlabs(hf: Any, vocab: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Give transformers' model the two roundings attnlab does not copy, each checked to
    change its logits: `gelu_new` (Phi's, GPT-J's and GPT-Neo's MLP), whose tanh formula
    transformers rounds step by step and attnlab's one F.gelu (tanh) call once, becomes
    F.gelu's (transformers' gelu_pytorch_tanh); OPT's attention, which scales q before its
    product with k, scales the product, and Falcon's, which divides the scores by sqrt(hs)
    and adds each Linear's bias after its product, multiplies them by the inverse and adds
    the bias in the product (nn.Linear), as attnlab does; Falcon's two checked together, in
    float16.
    (GPT-J's and GPT-Neo's q and k multiplied in float32 attnlab copies:
    `GPTConfig.scores_in_float32`.)"""
    ids, mask = left_padded([5, 17, 11], vocab=vocab, low=1, seed=1)
    stepwise = [m for m in hf.modules() if isinstance(
        getattr(m, "activation_fn", getattr(m, "act", None)),
        transformers.activations.NewGELUActivation)]
    for module in stepwise:
        before = hf(ids, attention_mask=mask).logits
        setattr(module, "activation_fn" if hasattr(module, "activation_fn") else "act",
                transformers.activations.GELUTanh())
        assert not torch.equal(hf(ids, attention_mask=mask).logits, before)
    if hf.config.model_type == "opt":  # q scaled before its product with k: after it
        from transformers.models.opt import modeling_opt

        def scaled_after(module: Any, q: Any, k: Any, v: Any, attention_mask: Any,
                         scaling: float, **_: Any) -> tuple[Any, Any]:
            scores = torch.matmul(q, k.transpose(2, 3)) * module.head_dim ** -0.5
            weights = torch.softmax(scores + attention_mask, dim=-1, dtype=torch.float32)
            return torch.matmul(weights.to(q.dtype), v).transpose(1, 2).contiguous(), weights

        before = hf(ids, attention_mask=mask).logits
        for module in hf.modules():
            if isinstance(module, modeling_opt.OPTAttention):
                monkeypatch.setattr(module, "scaling", 1.0)
        monkeypatch.setattr(modeling_opt, "eager_attention_forward", scaled_after)
        assert not torch.equal(hf(ids, attention_mask=mask).logits, before)
    if hf.config.model_type == "falcon":  # scores divided by sqrt(hs), a bias added after
        # the product (FalconLinear): multiplied by 1/sqrt(hs), added in it (nn.Linear)
        from transformers.models.falcon import modeling_falcon

        def multiplied(module: Any, hidden_states: Any, alibi: Any, attention_mask: Any,
                       layer_past: Any = None, position_embeddings: Any = None,
                       **_: Any) -> tuple[Any, Any]:
            q, k, v = module._split_heads(module.query_key_value(hidden_states))
            B, T, nh, hs = q.shape
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, hs)
            q, k = modeling_falcon.apply_rotary_pos_emb(q, k, *position_embeddings)
            if layer_past is not None:
                k, v = layer_past.update(k, v, module.layer_idx)
            scores = q @ k.transpose(-1, -2) * hs ** -0.5 + attention_mask
            weights = torch.softmax(scores, dim=-1, dtype=hidden_states.dtype)
            return module.dense((weights @ v).transpose(1, 2).reshape(B, T, nh * hs)), weights

        def linear(module: Any, x: Any) -> Any:  # the bias added inside the product
            return torch.nn.functional.linear(x, module.weight, module.bias)

        before = hf(ids, attention_mask=mask).logits
        monkeypatch.setattr(modeling_falcon.FalconAttention, "forward", multiplied)
        monkeypatch.setattr(modeling_falcon.FalconLinear, "forward", linear)
        if hf.dtype == torch.float16:  # bfloat16 rounds these test models' two ways alike
            assert not torch.equal(hf(ids, attention_mask=mask).logits, before)
    if hf.config.model_type in ("cohere", "cohere2"):
        _cohere_sum_as_attnlabs(hf, ids, mask, monkeypatch)
    if hf.config.model_type == "gpt_oss":
        _oss_experts_as_attnlabs(hf, ids, mask, monkeypatch)
        kept = [p for name, p in hf.named_parameters() if "norm" in name and p.dtype != hf.dtype]
        if kept:  # float16: transformers keeps gpt-oss's norms in float32 (_keep_in_fp32_modules),
            # attnlab rounds every weight to the model's dtype (the released checkpoints'
            # bfloat16 norms round to float16 exactly; these tests' float32 ones do not)
            before = hf(ids, attention_mask=mask).logits
            for p in kept:
                p.data = p.data.to(hf.dtype).to(p.dtype)
            assert not torch.equal(hf(ids, attention_mask=mask).logits, before)


def _cohere_sum_as_attnlabs(hf: Any, ids: Any, mask: Any, monkeypatch: pytest.MonkeyPatch
                            ) -> None:
    """Cohere's parallel block adds (x + attn) + mlp, attnlab's (mlp + attn) + x (GPT-NeoX's
    order, which every parallel family shares): given to transformers' layers, checked to
    change its logits."""
    def summed(module: Any, hidden_states: Any, **kwargs: Any) -> Any:
        h = module.input_layernorm(hidden_states)
        attn, _ = module.self_attn(hidden_states=h, **kwargs)
        return module.mlp(h) + attn + hidden_states

    before = hf(ids, attention_mask=mask).logits
    monkeypatch.setattr(type(hf.model.layers[0]), "forward", summed)
    assert not torch.equal(hf(ids, attention_mask=mask).logits, before)


def _oss_experts_as_attnlabs(hf: Any, ids: Any, mask: Any, monkeypatch: pytest.MonkeyPatch
                             ) -> None:
    """gpt-oss's experts multiply by gate and up together and add each bias after its
    product; attnlab's (one Linear each, as every family's MLP) add it in the product: given
    to transformers' experts, checked to change its logits."""
    from transformers.models.gpt_oss import modeling_gpt_oss

    def in_product(module: Any, x: Any, router_indices: Any, routing_weights: Any) -> Any:
        out = torch.zeros_like(x)  # (N, C)
        F = torch.nn.functional
        for e in range(module.num_experts):  # in expert order, as its loop and attnlab's
            rows, k = torch.where(router_indices == e)
            if len(rows) == 0:
                continue
            w, b = module.gate_up_proj[e], module.gate_up_proj_bias[e]  # (C, 2F), (2F,)
            gate = F.linear(x[rows], _laid(w[:, ::2].t()), b[::2]).clamp(max=module.limit)
            up = F.linear(x[rows], _laid(w[:, 1::2].t()), b[1::2]).clamp(-module.limit,
                                                                         module.limit)
            h = (up + 1) * (gate * torch.sigmoid(gate * module.alpha))  # (n, F)
            y = F.linear(h, _laid(module.down_proj[e].t()), module.down_proj_bias[e])  # (n, C)
            out.index_add_(0, rows, (y * routing_weights[rows, k, None]).to(out.dtype))
        return out

    before = hf(ids, attention_mask=mask).logits
    monkeypatch.setattr(modeling_gpt_oss.GptOssExperts, "forward", in_product)
    assert not torch.equal(hf(ids, attention_mask=mask).logits, before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@torch.no_grad()
def test_the_explicit_path_in_16_bits_is_transformers_bit_for_bit(
        pair: tuple, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded in bfloat16 or float16, the explicit path (fused=False: transformers' eager
    steps one by one) gives transformers' eager logits bit for bit at a left-padded batch's
    real tokens: each rounding lands where transformers' does (norms, RoPE, scores, the
    softmax in float32 then cast, every product; OLMo's norms scaled and RoPE turned in
    float32; GPT-J's and GPT-Neo's q and k multiplied in float32; OLMoE's and Qwen3-MoE's
    expert weights rounded before they multiply). Without OLMo's roundings, GPT-J's and
    GPT-Neo's float32 scores, or OLMoE's and Qwen3-MoE's rounded weights, their logits differ.
    A mixture of experts is checked on one unpadded row (the comment below says why). The
    roundings attnlab does not copy (`gelu_new`'s steps, OPT's scaled q, Falcon's division and
    bias add, gpt-oss's experts' bias add and float32 norms) are given to transformers' model
    first (`_rounding_as_attnlabs`), and its weights attnlab's memory layout
    (`_laid_out_as_attnlabs`)."""
    _, ours, directory = pair
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=dtype, attn_implementation="eager",
        experts_implementation="eager").eval()
    _rounding_as_attnlabs(hf, ours.config.vocab_size, monkeypatch)
    _laid_out_as_attnlabs(hf)
    ids, mask = left_padded([5, 17, 11], vocab=ours.config.vocab_size, low=1, seed=1)
    half = load_hf(directory, dtype=dtype)
    if half.config.n_experts is not None:
        # the real tokens as one unpadded row: a padding row goes through the experts its
        # own values pick, which differ between the two (transformers' padding rows are not
        # attnlab's), and an expert's product over another count of rows may round a real
        # row's apart
        ids, mask = ids[mask.bool()][None], torch.ones(1, int(mask.sum()), dtype=torch.long)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P): the real positions
    expected = hf(ids, attention_mask=mask, position_ids=positions).logits  # (B, P, V)
    real = mask.bool()
    got = half(ids, attention_mask=mask, fused=False).logits  # (B, P, V)
    assert got.dtype == dtype and torch.equal(got[real], expected[real])
    if half.config.scores_in_float32:
        plain = GPT(replace(half.config, scores_in_float32=False)).to(dtype)
        plain.load_state_dict(half.state_dict())
        assert not torch.equal(plain(ids, attention_mask=mask, fused=False).logits[real],
                               expected[real])
    if half.config.n_experts is not None and not half.config.expert_weights_in_float32:
        plain = GPT(replace(half.config, expert_weights_in_float32=True)).to(dtype)
        plain.load_state_dict(half.state_dict())
        assert not torch.equal(plain(ids, attention_mask=mask, fused=False).logits[real],
                               expected[real])
    if half.config.norm == "olmo_rmsnorm":
        plain = GPT(replace(half.config, norm="rmsnorm", rope_in_float32=False)).to(dtype)
        plain.load_state_dict(half.state_dict())
        assert not torch.equal(plain(ids, attention_mask=mask, fused=False).logits[real],
                               expected[real])


@torch.no_grad()
def test_a_mistral_without_a_window_exports_as_mistral_when_asked(tmp_path: Path) -> None:
    """Mistral v0.2+ has sliding_window null: the same computation as Llama, which is what
    save_hf picks by default; family="mistral" (the loaded directory's meta) keeps the
    family. It was refused ("needs sliding_window set")."""

    torch.manual_seed(0)
    config = transformers.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=None,
                                        initializer_range=0.2)
    hf = transformers.MistralForCausalLM(config).eval()
    hf.save_pretrained(tmp_path / "src")
    model = load_hf(tmp_path / "src")
    source = family_of(json.loads((tmp_path / "src" / "config.json").read_text())).name
    assert source == "mistral"  # what load_checkpoint puts in meta["family"]
    ids = torch.randint(1, config.vocab_size, (2, 20), generator=torch.Generator())
    for family, kind in ((None, "LlamaForCausalLM"), (source, "MistralForCausalLM")):
        out = tmp_path / str(family)
        save_hf(out, model, family=family)
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        assert type(reloaded).__name__ == kind
        torch.testing.assert_close(reloaded(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="unknown family 'mistrel'; choose one of"):
        save_hf(tmp_path / "bad", model, family="mistrel")


def test_gemma3_reads_the_older_rope_and_window_spelling(tmp_path: Path) -> None:
    """Hub Gemma 3 configs written before transformers 5 spell RoPE as rope_theta,
    rope_local_base_freq and rope_scaling, and the layers as sliding_window_pattern (every
    Nth full) with no layer_types: the same model as transformers 5's spelling."""

    hf = hf_model("gemma3-local-rope")
    hf.save_pretrained(tmp_path / "new")
    hf_config = json.loads((tmp_path / "new" / "config.json").read_text())
    for key in ("rope_parameters", "layer_types", "_sliding_window_pattern"):
        hf_config.pop(key, None)
    hf_config.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=2,
                     rope_scaling={"rope_type": "linear", "factor": 2.0})
    (tmp_path / "old").mkdir()
    for name in ("model.safetensors",):
        (tmp_path / "old" / name).write_bytes((tmp_path / "new" / name).read_bytes())
    (tmp_path / "old" / "config.json").write_text(json.dumps(hf_config))
    new, old = load_hf(tmp_path / "new"), load_hf(tmp_path / "old")
    assert old.config == new.config
    assert (new.config.window_layers, new.config.local_rope_theta) == ([0, 2], 1e4)


@pytest.mark.parametrize(("field", "value", "why"), [
    ("attn_logit_softcapping", 50.0, "soft-capping"),
    ("final_logit_softcapping", 30.0, "soft-capping"),
    ("use_bidirectional_attention", True, "causal"),
])
def test_gemma3_refuses_what_it_cannot_compute(tmp_path: Path, field: str, value: Any,
                                               why: str) -> None:

    hf_model("gemma3-full-untied").save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    with pytest.raises(ValueError, match=rf"gemma3 config.json has {field}=.*{why}"):
        load_hf(tmp_path)


def test_gemma2_caps_default_to_transformers_when_absent(tmp_path: Path) -> None:
    """Gemma2Config caps scores at 50 and logits at 30 when config.json has no such field;
    a null is no cap (the uncapped case above)."""

    hf_model("gemma2-uncapped-untied").save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    fields = json.loads(path.read_text())
    assert fields["attn_logit_softcapping"] is None  # what the parametrized cases load
    del fields["attn_logit_softcapping"], fields["final_logit_softcapping"]
    path.write_text(json.dumps(fields))
    config = load_hf(tmp_path).config
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (50.0, 30.0)
    assert transformers.AutoConfig.from_pretrained(tmp_path).attn_logit_softcapping == 50.0



@pytest.mark.parametrize("case", ["gemma-mqa", "gemma3-local-rope", "gemma2-caps-window"])
@torch.no_grad()
def test_bfloat16_embeddings_and_norms_round_as_transformers(case: str, tmp_path: Path) -> None:
    """In bfloat16 the scaled embeddings are bit-equal to transformers' (the factor
    sqrt(hidden_size) rounded to bfloat16 before it multiplies: 5.65625 for 32, not
    5.6568...), and so is every (1 + w) norm on the same input (float32 inside, one cast at
    the end); the logits stay within bfloat16's reach of transformers' bfloat16 logits."""
    from attnlab import Trace

    hf_model(case).save_pretrained(tmp_path)
    ours = load_hf(tmp_path, dtype=torch.bfloat16)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.bfloat16, attn_implementation="eager",
        experts_implementation="eager").eval()
    ids, mask = left_padded([5, 17, 11], vocab=ours.config.vocab_size, low=1, seed=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P): the real positions
    out = hf(ids, attention_mask=mask, position_ids=positions, output_hidden_states=True)
    trace = Trace(names=["emb", "logits"])
    ours(ids, attention_mask=mask, trace=trace)
    assert trace.get("emb").dtype == torch.bfloat16
    assert torch.equal(trace.get("emb"), out.hidden_states[0])
    x = 3 * torch.randn(2, 7, ours.config.n_embd, generator=torch.Generator().manual_seed(0))
    x = x.bfloat16()  # (B, T, C)
    norms = [(ours.ln_f, hf.model.norm)]
    for block, layer in zip(ours.blocks, hf.model.layers, strict=True):
        norms += [(block.ln_1, layer.input_layernorm), (block.ln_2, layer.post_attention_layernorm
                                                        if block.ln_attn_post is None else
                                                        layer.pre_feedforward_layernorm)]
        if block.ln_attn_post is not None:
            norms += [(block.ln_attn_post, layer.post_attention_layernorm),
                      (block.ln_mlp_post, layer.post_feedforward_layernorm)]
    for mine, theirs in norms:
        assert torch.equal(mine(x), theirs(x)), theirs
    heads = x[..., :ours.config.head_size]  # (B, T, hs): the QK-norm's input is one head's
    for block, layer in zip(ours.blocks, hf.model.layers, strict=True):
        if block.attn.q_norm is not None:  # Gemma 3
            assert torch.equal(block.attn.q_norm(heads), layer.self_attn.q_norm(heads))
            assert torch.equal(block.attn.k_norm(heads), layer.self_attn.k_norm(heads))
    real = mask.bool()
    logits, expected = trace.get("logits").float(), out.logits.float()  # (B, P, V)
    assert (logits - expected)[real].abs().max() < 0.05 * expected[real].abs().max()


@pytest.mark.parametrize("case", ["phi3-gqa-window", "phi3-partial-tied"])
def test_a_phi3_directory_splits_its_fused_matrices_and_exports_as_phi3(
        case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Phi-3's qkv_proj and gate_up_proj become attnlab's separate projections (each q
    head's rows where a Llama keeps them), `attnlab info` names the family and counts
    transformers' parameters, and `attnlab export` (the loaded directory's family) writes
    the fused matrices back bit for bit."""
    from test_hf_files import write_tokenizer

    from attnlab.cli import main

    hf = hf_model(case)
    hf.save_pretrained(tmp_path / "src")
    write_tokenizer(tmp_path / "src")  # export needs one
    ours = load_hf(tmp_path / "src")
    c, layer = ours.config, hf.model.layers[1]
    q_rows = c.n_head * c.head_size
    assert torch.equal(ours.blocks[1].attn.query.weight, layer.self_attn.qkv_proj.weight[:q_rows])
    assert torch.equal(ours.blocks[1].mlp.fc.weight, layer.mlp.gate_up_proj.weight[c.d_ff:])
    assert main(["info", str(tmp_path / "src"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["family"], info["architecture"]) == ("phi3", "Phi3ForCausalLM")
    assert info["parameters"] == hf.num_parameters()
    assert main(["export", str(tmp_path / "src"), str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == ["Phi3ForCausalLM"]
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    for name, tensor in hf.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name


def test_an_olmo2_directory_reads_its_norms_and_no_other_family_writes_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """OLMo 2's blocks: no norm before a branch, one after each (its post_attention_layernorm
    is the attention's output norm, not Llama's pre-MLP norm), QK-norm weights as wide as a
    token's q and k; `attnlab info` names the family and counts transformers' parameters;
    exporting it as Llama or Gemma 2 is refused with what those lack."""
    from attnlab.cli import main

    hf = hf_model("olmo2-gqa")
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    block, layer = ours.blocks[0], hf.model.layers[0]
    assert isinstance(block.ln_1, torch.nn.Identity) and isinstance(block.ln_2, torch.nn.Identity)
    assert torch.equal(block.ln_attn_post.weight, layer.post_attention_layernorm.weight)
    assert torch.equal(block.ln_mlp_post.weight, layer.post_feedforward_layernorm.weight)
    assert block.attn.q_norm.weight.shape == (32,) and block.attn.k_norm.weight.shape == (16,)
    assert main(["info", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["family"], info["architecture"]) == ("olmo2", "Olmo2ForCausalLM")
    assert info["parameters"] == hf.num_parameters()
    with pytest.raises(ValueError, match=r"LlamaForCausalLM cannot express this model: it "
                                         r"needs norm='rmsnorm' \(not 'olmo_rmsnorm'\), "
                                         r"qk_norm=False \(not True\), qk_norm_whole=False "
                                         r"\(not True\), rope_in_float32=False \(not True\), "
                                         r"sandwich_norm=False \(not True\), pre_norm=True "
                                         r"\(not False\)"):
        save_hf(tmp_path / "llama", ours, family="llama")
    with pytest.raises(ValueError, match=r"Gemma2ForCausalLM .* pre_norm=True"):
        save_hf(tmp_path / "gemma2", ours, family="gemma2")


@torch.no_grad()
def test_an_olmo3_config_reads_its_layer_types_as_transformers(tmp_path: Path) -> None:
    """A legacy top-level rope_theta and rope_scaling reach the full layers alone (the
    windowed layers keep Olmo3Config's base, 500,000, unscaled), as transformers reads them:
    logits equal its eager attention's; an OLMo 3 with windows is no OLMo 2, and one without
    is exported as OLMo 2 unless the family is named."""
    torch.manual_seed(0)
    fields = dict(**{**SMALL, "num_hidden_layers": 4}, sliding_window=4, initializer_range=0.2,
                  rope_theta=20000.0, rope_scaling={"rope_type": "linear", "factor": 2.0})
    hf = transformers.Olmo3ForCausalLM(transformers.Olmo3Config(**fields)).eval()
    hf.config._attn_implementation = "eager"
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    c = ours.config
    assert (c.rope_theta, c.rope_scaling, c.local_rope_theta) == (
        20000.0, {"rope_type": "linear", "factor": 2.0}, 500000.0)
    assert (c.sliding_window, c.window_layers) == (4, [0, 1, 2])
    ids = torch.randint(1, 97, (1, 24), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"Olmo2ForCausalLM .* sliding_window=None"):
        save_hf(tmp_path / "olmo2", ours, family="olmo2")
    plain = GPT(replace(c, sliding_window=None, window_layers=None, local_rope_theta=None))
    assert family_of(config_to_hf(plain.config)).name == "olmo2"
    save_hf(tmp_path / "olmo3", plain, family="olmo3")
    written = json.loads((tmp_path / "olmo3" / "config.json").read_text())
    assert written["layer_types"] == ["full_attention"] * 4
    assert load_hf(tmp_path / "olmo3").config.rope_scaling == c.rope_scaling


def test_olmo3_7bs_yarn_reaches_the_full_layers_alone_as_in_transformers() -> None:
    """OLMo-3-7B's RoPE as its config.json spells it (top-level rope_theta and a yarn
    rope_scaling with its attention factor): each layer type's cos and sin equal
    transformers' Olmo3RotaryEmbedding's at 12,000 positions (past the 8,192 it extends)."""
    from attnlab.hf import config_from_hf

    olmo3 = pytest.importorskip("transformers.models.olmo3.modeling_olmo3")
    fields = {"architectures": ["Olmo3ForCausalLM"], "model_type": "olmo3",
              "hidden_size": 64, "num_attention_heads": 2, "num_hidden_layers": 4,
              "intermediate_size": 8, "vocab_size": 11, "max_position_embeddings": 65536,
              "rope_theta": 500000, "sliding_window": 4096,
              "rope_scaling": {"attention_factor": 1.2079441541679836, "beta_fast": 32.0,
                               "beta_slow": 1.0, "factor": 8.0, "rope_type": "yarn",
                               "original_max_position_embeddings": 8192}}
    model = GPT(config_from_hf(fields))
    theirs = olmo3.Olmo3RotaryEmbedding(transformers.AutoConfig.for_model(**fields))
    positions = torch.arange(12000)[None]  # (1, T)
    x = torch.zeros(1, 1, 32)
    for layer_type, rotary in (("full_attention", model.rotary),
                               ("sliding_attention", model.local_rotary)):
        assert rotary is not None
        cos, sin = rotary.cos_sin(positions)  # (1, 1, T, hs)
        their_cos, their_sin = theirs(x, positions, layer_type)  # (1, T, hs)
        assert torch.equal(cos[:, 0], their_cos) and torch.equal(sin[:, 0], their_sin)
    assert model.local_rotary is not None and model.local_rotary.attention_factor == 1.0


@torch.no_grad()
def test_smollm3s_nope_layers_turn_nothing_and_no_other_family_writes_them(
        tmp_path: Path) -> None:
    """The NoPE layers' traced q and k are the unrotated ones, the others' are not; a
    config.json's no_rope_layers must hold one 0 or 1 per layer; Llama cannot express it."""
    from attnlab import Trace
    from attnlab.hf import config_from_hf

    hf = hf_model("smollm3-nope-windows")
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    assert ours.config.nope_layers == [1, 3]
    trace = Trace(names=["q_pre_rope", "q", "k_pre_rope", "k"])
    ours(torch.randint(1, 97, (1, 9), generator=torch.Generator().manual_seed(0)), trace=trace)
    for layer in range(4):
        turned = not torch.equal(trace.get("q", layer), trace.get("q_pre_rope", layer))
        assert turned == (layer in (0, 2)), layer
        assert torch.equal(trace.get("k", layer), trace.get("k_pre_rope", layer)) != turned
    fields = json.loads((tmp_path / "config.json").read_text())
    # a field transformers 5's SmolLM3 reads nowhere changes nothing
    assert config_from_hf({**fields, "max_window_layers": 28}) == ours.config
    with pytest.raises(ValueError, match=r"smollm3 config.json has no_rope_layers=\[1, 2, 1, 0\]: "
                                         r"expected 4 entries, each 1 \(the layer uses RoPE\)"):
        config_from_hf({**fields, "no_rope_layers": [1, 2, 1, 0]})
    with pytest.raises(ValueError, match=r"LlamaForCausalLM .* nope_layers=None"):
        save_hf(tmp_path / "llama", ours, family="llama")


@pytest.mark.parametrize("case", ["gemma-mqa", "gemma3-local-rope", "gemma2-caps-window"])
def test_info_on_a_gemma_directory(case: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`attnlab info` on a Gemma directory, from its config.json and headers alone: the
    family, transformers' parameter count (sandwich norms and QK-norms included, the tied head
    once) and the switches that make it Gemma."""
    from attnlab.cli import main

    hf = hf_model(case)
    hf.save_pretrained(tmp_path)
    assert main(["info", str(tmp_path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["family"], info["architecture"]) == ({"Gemma": "gemma", "Gemma2": "gemma2",
                                                       "Gemma3Text": "gemma3"}[CASES[case][0]],
                                                      type(hf).__name__)
    assert info["parameters"] == hf.num_parameters()
    config = info["config"]
    assert (config["norm"], config["mlp"], config["scale_embeddings"]) == (
        "gemma_rmsnorm", "geglu", True)
    assert config["sandwich_norm"] == (case != "gemma-mqa")
    assert main(["info", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"family      {type(hf).__name__} (Hugging Face {info['family']} directory)" in out
    assert f"{hf.num_parameters():,} parameters" in out
