"""StableLmForCausalLM (StableLM-2-1.6B, StableLM-2-Zephyr, StableLM-3B-4E1T): Llama's
weights and SwiGLU MLP with LayerNorms (their bias kept where no Linear has one:
`norm_bias=True`, `bias=False`), RoPE on the first `partial_rotary_factor` of each head
(0.25 by default), q/k/v biases where `use_qkv_bias` says so, and with
`use_parallel_residual` attention and MLP side by side on one norm (`shared_norm`).

transformers' parallel block adds (x + attn) + mlp, attnlab's (mlp + attn) + x: in float32
a rounding apart. `qk_layernorm` (StableLM-2-12B's): a LayerNorm without bias on each
head's q and k before RoPE, its own weight a head (`qk_norm_heads="stablelm"`), which the
files hold as one tensor a head (`q_layernorm.norms.{h}.weight`: `WeightMap.gathered`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields, rope_to_hf
from .llama import LLAMA_WEIGHTS, llama_like_config
from .registry import Family

# StableLmConfig's defaults, where they differ from the Llama ones llama_like_config holds
DEFAULTS = {"vocab_size": 50304, "hidden_size": 2560, "intermediate_size": 6912,
            "max_position_embeddings": 4096}


def _config(f: Fields) -> dict[str, Any]:
    qk_norm = f.flag("qk_layernorm", False)
    f.setdefaults(DEFAULTS)
    parallel = f.flag("use_parallel_residual", False)
    return llama_like_config(
        f, max_positions=4096, partial_key="partial_rotary_factor",
        rope={"default_partial": 0.25}, norm="layernorm",
        norm_eps=f.number("layer_norm_eps", 1e-5), norm_bias=True, bias=False,
        qkv_bias=f.flag("use_qkv_bias", False), out_bias=False,
        parallel_residual=parallel, shared_norm=parallel, qk_norm=qk_norm,
        qk_norm_heads="stablelm" if qk_norm else None,
    )


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return {
        "architectures": [STABLELM.architecture], "model_type": STABLELM.model_type,
        "vocab_size": c.vocab_size, "hidden_size": c.n_embd, "intermediate_size": c.ff_size,
        "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_kv_heads, "hidden_act": "silu",
        "max_position_embeddings": c.block_size, "layer_norm_eps": c.norm_eps,
        "use_qkv_bias": c.qkv_biased, "qk_layernorm": c.qk_norm,
        "use_parallel_residual": c.parallel_residual, "tie_word_embeddings": c.tie_weights,
        "rope_parameters": rope_to_hf(c, partial=True),
    }


STABLELM = Family(
    name="stablelm", model_type="stablelm", architecture="StableLmForCausalLM",
    base_architecture="StableLmModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=replace(LLAMA_WEIGHTS, gathered={
        "attn.q_norm.weight": "self_attn.q_layernorm.norms.{h}.weight",
        "attn.k_norm.weight": "self_attn.k_layernorm.norms.{h}.weight"}),
)
