"""GptOssForCausalLM (OpenAI's gpt-oss-20b and gpt-oss-120b): Llama-style blocks with

- attention sinks: a learned logit per query head (`self_attn.sinks`) in each row's softmax,
  which takes weight and adds nothing (`GPTConfig.attn_sinks`), and biases on q, k, v and o;
- sliding-window and full layers in turn (`layer_types`, the window `sliding_window`);
- a mixture of `num_local_experts` experts for the MLP: a router with a bias
  (`mlp.router`) whose top `num_experts_per_tok` logits are softmaxed alone
  (`experts_from_top_logits`), the weights rounded to the model's dtype before they multiply;
  each expert a clamped SwiGLU with biases (`mlp="clamped_swiglu"`: the gate capped at
  `swiglu_limit`, the up projection clamped to it and plus 1, `swiglu_alpha` the sigmoid's
  slope);
- RMSNorm scaled in float32 before the cast back (transformers keeps the norms in float32);
- YaRN RoPE.

Its files hold each layer's experts as 3-D tensors, (in, out) per expert: `gate_up_proj`
(E, C, 2F) with gate and up columns interleaved and its bias (E, 2F) alike, `down_proj`
(E, F, C) and its bias (E, C) (`Stacked`, interleaved and transposed). The released
checkpoints store these four as MXFP4 blocks and scales (`quantization_config` mxfp4),
which attnlab dequantizes to bfloat16 as it reads each (`mxfp4.Mxfp4Files`, exact: the
values transformers' own dequantization gives).
"""

from __future__ import annotations

from typing import Any

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .mixtral import ROUTER_TRAINING, experts_from_hf
from .qwen2 import checked_layer_types
from .registry import Family, Stacked, WeightMap, window_layers_from, window_layers_to_hf

WEIGHTS = WeightMap(
    top=LLAMA_WEIGHTS.top, layer=LLAMA_WEIGHTS.layer, base=LLAMA_WEIGHTS.base,
    block={**{k: v for k, v in LLAMA_WEIGHTS.block.items() if not k.startswith("mlp.")},
           "attn": "self_attn", "mlp.router": "mlp.router"},  # attn: the sinks' module
    stacked=(Stacked("mlp.experts.gate_up_proj", ("gate", "fc"),
                     bias="mlp.experts.gate_up_proj_bias", interleaved=True, transposed=True),
             Stacked("mlp.experts.down_proj", ("proj",), bias="mlp.experts.down_proj_bias",
                     transposed=True)),
)
# what transformers' GptOssConfig falls back on where config.json is silent
DEFAULT_WINDOW = 128
MXFP4 = "mxfp4"  # the released checkpoints' quant_method: experts as `mxfp4.Mxfp4Files` read
SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}


def _window(f: Fields, n_layer: int) -> dict[str, Any]:
    """sliding_window / window_layers from `layer_types` (default: windowed, full, in turn
    from layer 0, as GptOssConfig makes them)."""
    types = checked_layer_types(f, ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                    for i in range(n_layer)])
    windowed = [i for i, t in enumerate(types) if t == "sliding_attention"]
    window = f.count("sliding_window", DEFAULT_WINDOW) if windowed else f.get("sliding_window")
    if not windowed:
        return dict(sliding_window=None, window_layers=None)
    return dict(sliding_window=window, window_layers=window_layers_from(windowed, n_layer))


def _config(f: Fields) -> dict[str, Any]:
    if not (f.has("rope_parameters") or f.has("rope_scaling")):
        raise f.refuse("rope_parameters", None, "transformers then uses YaRN with factor 32 "
                       "over 4,096 positions and theta 150,000; write those out (gpt-oss's "
                       "released config.json has them under rope_scaling)")
    f.one_of("hidden_act", ["silu"], "silu")  # written, read by no gpt-oss module
    n_layer = f.count("num_hidden_layers", 36)
    experts = experts_from_hf(f, "num_local_experts", normalized=True)
    if f.has("experts_per_token") and f.get("experts_per_token") != experts[
            "experts_per_token"]:  # the released config.json's second spelling
        raise f.refuse("experts_per_token", f.hf["experts_per_token"],
                       f"num_experts_per_tok={experts['experts_per_token']} says otherwise")
    f.get("initial_context_length")  # YaRN's original length, which rope_scaling holds
    quantized = f.get("quantization_config")
    if quantized is not None and (not isinstance(quantized, dict)
                                  or quantized.get("quant_method") != MXFP4):
        raise f.refuse("quantization_config", quantized, "attnlab reads gpt-oss's float "
                       "weights, or its experts in MXFP4 (quant_method 'mxfp4'), only")
    attention_bias = f.flag("attention_bias", True)
    return llama_like_config(
        f, max_positions=131072, rope=dict(default_theta=150000.0), bias=True,
        qkv_bias=attention_bias, out_bias=attention_bias, norm="olmo_rmsnorm",
        mlp="clamped_swiglu", swiglu_alpha=f.number("swiglu_alpha", SWIGLU["swiglu_alpha"]),
        swiglu_limit=f.number("swiglu_limit", SWIGLU["swiglu_limit"]), attn_sinks=True,
        router_bias=True, experts_from_top_logits=True,
        expert_weights_in_float32=False, **experts, **_window(f, n_layer))


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    return llama_like_to_hf(c, GPT_OSS, attention_bias=c.qkv_biased,
                            num_local_experts=c.n_experts,
                            num_experts_per_tok=c.experts_per_token,
                            swiglu_alpha=c.swiglu_alpha, swiglu_limit=c.swiglu_limit,
                            # transformers builds a windowed mask whether a layer uses it
                            sliding_window=c.sliding_window or DEFAULT_WINDOW,
                            layer_types=window_layers_to_hf(c))


GPT_OSS = Family(
    name="gpt_oss", model_type="gpt_oss", architecture="GptOssForCausalLM",
    base_architecture="GptOssModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=ROUTER_TRAINING,
)
