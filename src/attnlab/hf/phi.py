"""PhiForCausalLM (Phi-1, Phi-1.5, Phi-2): GPT-NeoX-style parallel blocks whose attention
and MLP read one LayerNorm (x + attn(ln(x)) + mlp(ln(x)): `shared_norm`), biases on every
projection and on the output head (`head_bias`), the tanh GELU MLP (`gelu_new`), and RoPE on
the first `partial_rotary_factor` of each head (rotate-half layout; Phi-2: 0.4 of 80 dims).

q, k and v are separate Linears (`self_attn.q_proj`, ...), the output projection is
`self_attn.dense`, the MLP `mlp.fc1` / `mlp.fc2`, the final norm `model.final_layernorm`.
`qk_layernorm` (a LayerNorm on each head's q and k, false in every published Phi) is refused.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import MAX_CONTEXT, Fields, rope_from_hf, rope_to_hf
from .registry import Family, WeightMap

# transformers reads the custom-code pointers (auto_map) only with trust_remote_code, whose
# modules early Phi-2 revisions and many fine-tunes keep from before transformers had Phi
IRRELEVANT = frozenset({"auto_map"})

WEIGHTS = WeightMap(
    top={"wte": "model.embed_tokens", "ln_f": "model.final_layernorm", "lm_head": "lm_head"},
    layer="model.layers.{i}.",
    block={"ln_1": "input_layernorm", "attn.query": "self_attn.q_proj",
           "attn.key": "self_attn.k_proj", "attn.value": "self_attn.v_proj",
           "attn.out_proj": "self_attn.dense", "mlp.fc": "mlp.fc1", "mlp.proj": "mlp.fc2"},
    base="model.",
)


def _config(f: Fields) -> dict[str, Any]:
    if f.flag("qk_layernorm", False):
        raise f.refuse("qk_layernorm", True, "attnlab's QK-norm is an RMSNorm, Phi's a "
                       "LayerNorm (no published Phi sets it)")
    n_embd, n_head = f.count("hidden_size", 2048), f.count("num_attention_heads", 32)
    head_dim = f.count("head_dim", n_embd // n_head)  # PhiAttention reads it where present
    block_size = f.count("max_position_embeddings", 2048, MAX_CONTEXT)
    theta, scaling, partial = rope_from_hf(f, max_positions=block_size,
                                           partial_key="partial_rotary_factor",
                                           default_partial=0.5)  # PhiConfig's default
    return dict(
        vocab_size=f.count("vocab_size", 51200), block_size=block_size,
        n_layer=f.count("num_hidden_layers", 24), n_head=n_head,
        n_kv_head=f.count("num_key_value_heads", n_head), n_embd=n_embd,
        head_dim=None if head_dim * n_head == n_embd else head_dim,
        d_ff=f.count("intermediate_size", 8192),
        pos="rope", rope_theta=theta, rope_scaling=scaling, rotary_pct=partial,
        norm="layernorm", norm_eps=f.number("layer_norm_eps", 1e-5),
        mlp="gelu", gelu=f.gelu("hidden_act", "gelu_new"), bias=True,
        parallel_residual=True, shared_norm=True, head_bias=True,
        tie_weights=f.flag("tie_word_embeddings", False),
    )


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    hs = c.head_size
    return {
        "architectures": [PHI.architecture], "model_type": PHI.model_type,
        "vocab_size": c.vocab_size, "hidden_size": c.n_embd,
        "intermediate_size": c.d_ff or 4 * c.n_embd, "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head, "num_key_value_heads": c.n_kv_heads,
        **({} if hs * c.n_head == c.n_embd else {"head_dim": hs}),
        "hidden_act": "gelu" if c.gelu == "exact" else "gelu_new",
        "max_position_embeddings": c.block_size, "layer_norm_eps": c.norm_eps,
        "qk_layernorm": False, "tie_word_embeddings": c.tie_weights,
        "rope_parameters": rope_to_hf(c, partial=True),
    }


PHI = Family(
    name="phi", model_type="phi", architecture="PhiForCausalLM",
    base_architecture="PhiModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
