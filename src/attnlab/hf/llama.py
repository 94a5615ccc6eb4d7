"""LlamaForCausalLM and MistralForCausalLM, and the Llama-style mapping Qwen2/Qwen3 reuse.

Llama-style blocks: RMSNorm -> attention with RoPE (rotate-half layout: Hugging Face's
converters already permuted Meta's interleaved q/k rows, so nothing is permuted here) ->
RMSNorm -> SwiGLU MLP. Names: `model.layers.{i}.self_attn.q_proj` etc. Mistral is Llama
with a sliding window on every layer (`sliding_window`, None = none) and no biases.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import MAX_CONTEXT, SILUS, Fields, rope_from_hf, rope_to_hf
from .registry import Family, WeightMap

LLAMA_WEIGHTS = WeightMap(
    top={"wte": "model.embed_tokens", "ln_f": "model.norm", "lm_head": "lm_head"},
    layer="model.layers.{i}.",
    block={
        "ln_1": "input_layernorm", "ln_2": "post_attention_layernorm",
        "attn.query": "self_attn.q_proj", "attn.key": "self_attn.k_proj",
        "attn.value": "self_attn.v_proj", "attn.out_proj": "self_attn.o_proj",
        "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm",
        "mlp.gate": "mlp.gate_proj", "mlp.fc": "mlp.up_proj", "mlp.proj": "mlp.down_proj",
    },
    base="model.",
)


def llama_like_config(f: Fields, *, max_positions: int, default_head_dim: int | None = None,
                      partial_key: str | None = None, rope: dict[str, Any] | None = None,
                      **switches: Any) -> dict[str, Any]:
    """GPTConfig keyword arguments for the fields every Llama-style config shares; the
    family passes its own bias / QK-norm / window switches (which win over these: Gemma's
    norm and MLP), the head_dim its transformers config defaults to (None: hidden_size /
    heads), where its transformers rotates part of each head (Phi-3), the top-level field
    naming that part (else a partial factor is refused), and its own `rope_from_hf`
    arguments (Phi-3: its RoPE types)."""
    n_embd, n_head = f.count("hidden_size", 4096), f.count("num_attention_heads", 32)
    head_dim = f.count("head_dim", default_head_dim or n_embd // n_head)
    if "mlp" not in switches:  # SwiGLU's activation; a family with another MLP reads its own
        f.one_of("hidden_act", SILUS, "silu")
    block_size = f.count("max_position_embeddings", max_positions, MAX_CONTEXT)
    # a family that reads its RoPE its own way (Gemma 3: per layer type) passes rope_theta
    theta, scaling, partial = (0.0, None, 1.0) if "rope_theta" in switches else (
        rope_from_hf(f, max_positions=block_size, partial_key=partial_key, **(rope or {})))
    if partial != 1.0 and partial_key is None:
        raise f.refuse("rope_parameters.partial_rotary_factor", partial,
                       f"{f.family} rotates whole heads in transformers (partial rotary is "
                       "GPT-NeoX's)")
    return {**dict(
        vocab_size=f.count("vocab_size", 32000),
        block_size=block_size,
        n_layer=f.count("num_hidden_layers", 32),
        n_head=n_head,
        n_kv_head=f.count("num_key_value_heads", n_head),
        n_embd=n_embd,
        head_dim=None if head_dim * n_head == n_embd else head_dim,
        d_ff=f.count("intermediate_size", 11008),
        pos="rope", rope_theta=theta, rope_scaling=scaling, rotary_pct=partial,
        norm="rmsnorm", norm_eps=f.number("rms_norm_eps", 1e-6),
        mlp="swiglu",
        tie_weights=f.flag("tie_word_embeddings", False),
    ), **switches}


def llama_like_to_hf(config: GPTConfig, family: Family, **extra: Any) -> dict[str, Any]:
    c = config
    hs = c.head_dim or c.n_embd // c.n_head
    return {
        "architectures": [family.architecture], "model_type": family.model_type,
        "vocab_size": c.vocab_size, "hidden_size": c.n_embd,
        "intermediate_size": c.d_ff or 4 * c.n_embd, "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_heads, "head_dim": hs,
        "hidden_act": "silu", "max_position_embeddings": c.block_size,
        "rms_norm_eps": c.norm_eps, "tie_word_embeddings": c.tie_weights,
        "rope_parameters": rope_to_hf(c), **extra,
    }


def _llama_config(f: Fields) -> dict[str, Any]:
    attention_bias = f.flag("attention_bias", False)
    return llama_like_config(
        f, max_positions=2048, bias=f.flag("mlp_bias", False),
        qkv_bias=attention_bias, out_bias=attention_bias,
    )


def _llama_to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, LLAMA, attention_bias=c.qkv_biased, mlp_bias=c.bias)


def _mistral_config(f: Fields) -> dict[str, Any]:
    window = f.nullable("sliding_window", 4096)  # MistralConfig's default where absent
    return llama_like_config(f, max_positions=131072, bias=False, sliding_window=window)


def _mistral_to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, MISTRAL, sliding_window=c.sliding_window)


LLAMA = Family(
    name="llama", model_type="llama", architecture="LlamaForCausalLM",
    base_architecture="LlamaModel", config_from_hf=_llama_config, config_to_hf=_llama_to_hf,
    weights=LLAMA_WEIGHTS,
)
MISTRAL = Family(
    name="mistral", model_type="mistral", architecture="MistralForCausalLM",
    base_architecture="MistralModel", config_from_hf=_mistral_config,
    config_to_hf=_mistral_to_hf, weights=LLAMA_WEIGHTS,
)
