"""HunYuanDenseV1ForCausalLM (Tencent's Hunyuan-0.5B to 7B): Llama's blocks with an RMSNorm on
each head's q and k after RoPE, not before it (`qk_norm_after_rope`; the files'
`query_layernorm` / `key_layernorm`), and the releases' "dynamic" RoPE with a fixed `alpha`,
which transformers computes as NTK-alpha: the base times alpha^(d / (d - 2)) and nothing else,
read here as a plain RoPE with that base.
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .registry import Family, WeightMap

WEIGHTS = WeightMap(
    top=LLAMA_WEIGHTS.top, layer=LLAMA_WEIGHTS.layer, base=LLAMA_WEIGHTS.base,
    block={**LLAMA_WEIGHTS.block, "attn.q_norm": "self_attn.query_layernorm",
           "attn.k_norm": "self_attn.key_layernorm"})
# HunYuanDenseV1Config's defaults where they differ from those llama_like_config assumes;
# eod_token_id is a token id, for the tokenizer
DEFAULTS = {"vocab_size": 290943, "rms_norm_eps": 1e-5}
IRRELEVANT = frozenset({"eod_token_id"})


def _ntk_alpha(f: Fields, head_dim: int) -> None:
    """A "dynamic" RoPE with an `alpha` (the releases'), which transformers computes with
    the fixed base theta * alpha^(d / (d - 2)): rewritten in `f` as the plain RoPE of that
    base for `rope_from_hf` to read."""
    key = "rope_scaling" if isinstance(f.hf.get("rope_scaling"), dict) else "rope_parameters"
    rope = f.hf.get(key)
    if not isinstance(rope, dict) or rope.get("rope_type", rope.get("type")) != "dynamic" or (
            rope.get("alpha") is None):
        return
    theta, alpha = rope.get("rope_theta", f.hf.get("rope_theta", 10000.0)), rope["alpha"]
    for name, value in (("rope_theta", theta), ("alpha", alpha)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise f.refuse(f"{key}.{name}", value, "expected a positive number")
    f.hf[key] = {"rope_type": "default",
                 "rope_theta": float(theta) * float(alpha) ** (head_dim / (head_dim - 2))}


def _config(f: Fields) -> dict[str, Any]:
    f.setdefaults(DEFAULTS)
    n_embd, n_head = f.count("hidden_size", 4096), f.count("num_attention_heads", 32)
    _ntk_alpha(f, f.count("head_dim", n_embd // n_head))
    bias = f.flag("attention_bias", False)
    f.get("pretraining_tp")  # transformers 5 reads it nowhere
    return llama_like_config(f, max_positions=2048, bias=False, qkv_bias=bias, out_bias=bias,
                             qk_norm=True, qk_norm_after_rope=True)


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, HUNYUAN_DENSE, attention_bias=c.qkv_biased)


HUNYUAN_DENSE = Family(
    name="hunyuan_v1_dense", model_type="hunyuan_v1_dense",
    architecture="HunYuanDenseV1ForCausalLM", base_architecture="HunYuanDenseV1Model",
    config_from_hf=_config, config_to_hf=_to_hf, weights=WEIGHTS, irrelevant=IRRELEVANT,
)
