"""Llama4ForCausalLM, and the language model of Llama4ForConditionalGeneration (Meta's
Llama 4 Scout and Maverick releases): Llama's blocks with

- NoPE layers: those `no_rope_layers` marks 0 (by default every fourth) turn no q or k
  (`GPTConfig.nope_layers`) and, where `attn_temperature_tuning`, multiply q at position p
  by 1 + attn_scale * log(1 + floor((p + 1) / floor_scale)) (`nope_temperature`);
- `use_qk_norm`: the layers with RoPE divide each head's q and k by their root mean square
  after RoPE, without a weight (`qk_l2_norm`);
- RoPE on adjacent pairs, as complex numbers in float32 (`rope_interleaved`,
  `rope_in_float32`), with llama3 scaling in the releases;
- a mixture in the layers `moe_layers` names (by default every `interleave_moe_layer_step`-th):
  `num_local_experts` SwiGLU experts `intermediate_size` wide, the router's top
  `num_experts_per_tok` logits each scaling the token on its way into its expert by its
  sigmoid (`router_scoring="sigmoid_input"`), and a shared expert added ungated; the other
  layers one dense SwiGLU `intermediate_size_mlp` wide. The files hold each layer's experts
  as two 3-D tensors, (in, out) per expert: gate_up_proj (E, C, 2F: the gate's columns, then
  up's) and down_proj (E, F, C) (`Stacked`, transposed).

Chunked attention: the layers with RoPE attend within chunks of `attention_chunk_size`
(8192) positions, counted from each row's first real token. attnlab does not cut chunks, so
such a model's context (`block_size`) is at most the chunk, within which a chunk is the whole
causal prefix: exact up to there, refused past it (as any position past block_size is).

transformers' eager Llama 4 takes its softmax in the model's dtype, where other families take
it in float32: the same in bfloat16 (torch's CPU softmax computes a bfloat16 row in float32
and rounds once; the releases' dtype), not in float16. It counts the temperature's p by the
slot, left padding included, where attnlab counts the row's own positions (as RoPE does in
both): the same without left padding, and for any row before floor_scale positions.

The releases are Llama4ForConditionalGeneration (model_type "llama4"): `text_config` holds this
family's fields and the files' language_model.* tensors its weights; the vision tower and the
projector are left unread (`LLAMA4_MULTIMODAL`, which reads only: an export writes the
language model as Llama4ForCausalLM).
"""

from __future__ import annotations

from typing import Any, cast

from ..model.gpt import GPTConfig
from .fields import Fields
from .llama import LLAMA_WEIGHTS, llama_like_config, llama_like_to_hf
from .mixtral import ROUTER_TRAINING, experts_from_hf
from .registry import Family, Stacked, WeightMap

_BLOCK = {**{k: v for k, v in LLAMA_WEIGHTS.block.items() if not k.startswith(
    ("mlp.", "attn.q_norm", "attn.k_norm"))},
    "mlp.gate": "feed_forward.gate_proj", "mlp.fc": "feed_forward.up_proj",
    "mlp.proj": "feed_forward.down_proj", "mlp.router": "feed_forward.router",
    "mlp.shared.gate": "feed_forward.shared_expert.gate_proj",
    "mlp.shared.fc": "feed_forward.shared_expert.up_proj",
    "mlp.shared.proj": "feed_forward.shared_expert.down_proj"}
_EXPERTS = (Stacked("feed_forward.experts.gate_up_proj", ("gate", "fc"), transposed=True),
            Stacked("feed_forward.experts.down_proj", ("proj",), transposed=True))
WEIGHTS = WeightMap(top=LLAMA_WEIGHTS.top, layer=LLAMA_WEIGHTS.layer, block=_BLOCK,
                    base=LLAMA_WEIGHTS.base, stacked=_EXPERTS)
# Llama4ForConditionalGeneration's files: the same under language_model., beside a vision
# tower and its projector, which no text forward reads
MULTIMODAL_WEIGHTS = WeightMap(
    top={"wte": "language_model.model.embed_tokens", "ln_f": "language_model.model.norm",
         "lm_head": "language_model.lm_head"},
    layer="language_model.model.layers.{i}.", block=_BLOCK, base="language_model.model.",
    stacked=_EXPERTS, unread=r"(^|\.)(vision_model|multi_modal_projector)\.")
# read by no transformers module (the released text_config's for_llm_compressor)
IRRELEVANT = ROUTER_TRAINING | {"for_llm_compressor"}
# Llama4Config's fields around the text model's: the image tokens and the vision tower
MULTIMODAL_ONLY = frozenset({"boi_token_index", "eoi_token_index", "image_token_index",
                             "vision_config"})


def _rotating(f: Fields, n_layer: int) -> list[bool]:
    """Whether each layer turns q and k: `no_rope_layers` (1: it does), else all but every
    `no_rope_layer_interval`-th, as Llama4TextConfig fills an absent or empty list."""
    flags = f.get("no_rope_layers")
    interval = f.count("no_rope_layer_interval", 4)
    if not flags:
        return [(i + 1) % interval != 0 for i in range(n_layer)]
    # transformers reads a longer list's first n_layer entries ("at least as long")
    if not isinstance(flags, list) or len(flags) < n_layer or any(
            type(x) not in (int, bool) or x not in (0, 1) for x in flags):
        raise f.refuse("no_rope_layers", flags, f"expected at least {n_layer} entries, each 1 "
                       "(the layer uses RoPE) or 0 (it does not)")
    return [bool(x) for x in flags[:n_layer]]


def _mixture_layers(f: Fields, n_layer: int) -> list[int]:
    """The layers that hold the mixture: `moe_layers`, else every interleave_moe_layer_step-th
    from step - 1 (Llama4TextConfig's default)."""
    step = f.count("interleave_moe_layer_step", 1)
    layers = f.get("moe_layers")
    if layers is None:
        return list(range(step - 1, n_layer, step))
    if not isinstance(layers, list) or any(type(i) is not int or not 0 <= i < n_layer
                                           for i in layers):
        raise f.refuse("moe_layers", layers, f"expected a list of layers within 0..{n_layer - 1}")
    return sorted(set(layers))


def _temperature(f: Fields) -> dict[str, Any]:
    """nope_temperature / _floor from attn_temperature_tuning (transformers tests it for
    truth: the Scout release writes 4), attn_scale and floor_scale."""
    tuning = f.get("attn_temperature_tuning", True)
    if type(tuning) not in (bool, int) or tuning < 0:
        raise f.refuse("attn_temperature_tuning", tuning, "expected true or false")
    scale, floor = f.get("attn_scale", 0.1), f.count("floor_scale", 8192)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 <= scale < 1e6:
        raise f.refuse("attn_scale", scale, "expected a number >= 0 (the temperature's slope)")
    return dict(nope_temperature=float(scale) if tuning else 0.0, nope_temperature_floor=floor)


# Llama4TextConfig's defaults where they differ from those llama_like_config assumes
DEFAULTS = {"vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
            "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
            "head_dim": 128, "rms_norm_eps": 1e-5, "num_local_experts": 16,
            "num_experts_per_tok": 1}


def _config(f: Fields) -> dict[str, Any]:
    f.setdefaults(DEFAULTS)
    n_layer = f.count("num_hidden_layers")
    rotating = _rotating(f, n_layer)
    nope = [i for i, rope in enumerate(rotating) if not rope]
    chunk = f.nullable("attention_chunk_size", 8192)  # null: no chunks
    if chunk is not None and (type(chunk) is not int or chunk < 1):
        raise f.refuse("attention_chunk_size", chunk, "expected a positive integer or null")
    temperature = _temperature(f)
    layers = _mixture_layers(f, n_layer)
    experts = experts_from_hf(f, "num_local_experts", normalized=False)
    d_ff, dense = f.count("intermediate_size"), f.count("intermediate_size_mlp", 16384)
    mixture = dict(**experts, router_scoring="sigmoid_input", shared_expert_size=d_ff,
                   shared_expert_gated=False, mixture_layers=layers, dense_d_ff=dense)
    bias = f.flag("attention_bias", False)
    values = llama_like_config(
        f, max_positions=131072, rope=dict(default_theta=500000.0), bias=False,
        qkv_bias=bias, out_bias=bias, rope_interleaved=True, rope_in_float32=True,
        nope_layers=nope or None, qk_l2_norm=f.flag("use_qk_norm", True) and len(nope) < n_layer,
        **(temperature if nope else {}), **(mixture if layers else {}),
        d_ff=d_ff if layers else dense)
    if _chunked(f, rotating, chunk):  # no context past a chunk (module doc)
        values["block_size"] = min(values["block_size"], cast(int, chunk))
    return values


def _chunked(f: Fields, rotating: list[bool], chunk: int | None) -> bool:
    """Whether `layer_types` (by default: the layers with RoPE, where there is a chunk size)
    names a chunked layer."""
    types = f.get("layer_types") or [
        "chunked_attention" if rope and chunk is not None else "full_attention"
        for rope in rotating]
    if not isinstance(types, list) or len(types) != len(rotating) or any(
            t not in ("chunked_attention", "full_attention") for t in types) or (
            chunk is None and "chunked_attention" in types):
        raise f.refuse("layer_types", types, f"expected {len(rotating)} entries, each "
                       "chunked_attention (with an attention_chunk_size) or full_attention")
    return "chunked_attention" in types


def _to_hf(c: GPTConfig) -> dict[str, Any]:
    mixture = [] if c.n_experts is None else [i for i in range(c.n_layer) if c.has_mixture(i)]
    return llama_like_to_hf(
        c, LLAMA4, intermediate_size=c.ff_size,
        intermediate_size_mlp=c.dense_d_ff or c.ff_size if mixture else c.ff_size,
        num_local_experts=c.n_experts or 1,
        num_experts_per_tok=c.experts_per_token if c.n_experts else 1,
        moe_layers=mixture, no_rope_layers=[int(c.rotates(i)) for i in range(c.n_layer)],
        use_qk_norm=c.qk_l2_norm, attn_temperature_tuning=bool(c.nope_temperature),
        attn_scale=c.nope_temperature or 0.1, floor_scale=c.nope_temperature_floor,
        attention_chunk_size=c.block_size, attention_bias=c.qkv_biased,
        layer_types=["chunked_attention" if c.rotates(i) else "full_attention"
                     for i in range(c.n_layer)])


def _multimodal_config(f: Fields) -> dict[str, Any]:
    """The text model's fields, read from `text_config` (its own fields' bookkeeping)."""
    text = f.get("text_config")
    if not isinstance(text, dict):
        raise f.refuse("text_config", text, "expected the language model's config (a dict)")
    f.flag("tie_word_embeddings", False)  # Llama4Config's, which ties nothing either way
    inner = Fields(text, f.family)
    values = _config(inner)
    inner.finish(IRRELEVANT)
    return values


def _multimodal_to_hf(c: GPTConfig) -> dict[str, Any]:
    """The config.json `misfits` reads back (export writes Llama4ForCausalLM: `exports`)."""
    return {"architectures": [LLAMA4_MULTIMODAL.architecture], "model_type": "llama4",
            "text_config": _to_hf(c)}


LLAMA4 = Family(
    name="llama4", model_type="llama4_text", architecture="Llama4ForCausalLM",
    base_architecture="Llama4TextModel", config_from_hf=_config, config_to_hf=_to_hf,
    weights=WEIGHTS, irrelevant=IRRELEVANT,
)
LLAMA4_MULTIMODAL = Family(
    name="llama4_multimodal", model_type="llama4",
    architecture="Llama4ForConditionalGeneration", base_architecture="Llama4Model",
    config_from_hf=_multimodal_config, config_to_hf=_multimodal_to_hf,
    weights=MULTIMODAL_WEIGHTS, irrelevant=MULTIMODAL_ONLY, exports=False,
)
