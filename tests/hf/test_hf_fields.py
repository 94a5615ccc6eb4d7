"""hf/fields.py and the families' config mappings: every field that changes the math is
honoured or refused with one line naming it and its value; both RoPE spellings read alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.hf import config_from_hf, config_to_hf, save_hf_gpt2

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
NEOX = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=128)


def hf_dict(prefix: str, **fields: Any) -> dict[str, Any]:
    """config.json as transformers 5 writes it for `<prefix>Config(**fields)`."""
    config = getattr(transformers, f"{prefix}Config")(**fields)
    head = "LMHeadModel" if prefix == "GPT2" else "ForCausalLM"
    return {**config.to_dict(), "architectures": [f"{prefix}{head}"]}


def assert_read_as_transformers_reads(fields: dict[str, Any]) -> None:
    """config_from_hf(fields) gives the numbers the math uses as transformers' own config class
    reads them from config.json `fields` (its attribute map gives GPT-2's n_embd etc. the
    common names): sizes, heads, RoPE, norm epsilon, each layer's window, tying."""
    hf = transformers.AutoConfig.for_model(**fields)
    ours = config_from_hf(fields)
    heads, layers = hf.num_attention_heads, hf.num_hidden_layers
    rope = getattr(hf, "rope_parameters", None)  # None: learned positions (GPT-2)
    types = getattr(hf, "layer_types", None) or ["sliding_attention"] * layers  # Mistral: all
    window = getattr(hf, "sliding_window", None)
    eps = next(getattr(hf, name) for name in ("rms_norm_eps", "layer_norm_eps",
                                              "layer_norm_epsilon") if hasattr(hf, name))
    theirs = (hf.vocab_size, hf.max_position_embeddings, layers, heads,
              getattr(hf, "num_key_value_heads", None) or heads, hf.hidden_size,
              getattr(hf, "head_dim", None) or hf.hidden_size // heads,
              getattr(hf, "intermediate_size", None) or getattr(hf, "n_inner", None)
              or 4 * hf.hidden_size,
              rope and rope["rope_theta"], rope and rope.get("partial_rotary_factor", 1.0), eps,
              [window if t == "sliding_attention" else None for t in types],
              hf.tie_word_embeddings)
    rotary = ours.pos == "rope"
    assert (ours.vocab_size, ours.block_size, ours.n_layer, ours.n_head, ours.n_kv_heads,
            ours.n_embd, ours.head_size, ours.ff_size, ours.rope_theta if rotary else None,
            ours.rotary_pct if rotary else None, ours.norm_eps,
            [ours.window_of(i) for i in range(ours.n_layer)], ours.tie_weights) == theirs


# fields off every default, so that one read wrong or not at all shows
ODD = dict(rope_parameters={"rope_type": "default", "rope_theta": 123456.0}, rms_norm_eps=3e-6)
ODD_QWEN = dict(**ODD, use_sliding_window=True, sliding_window=6, max_window_layers=1)
ODD_NEOX = dict(layer_norm_eps=2e-5, rope_parameters={"rope_type": "default", "rope_theta": 777.0,
                                                      "partial_rotary_factor": 0.5})
ODD_GPT2 = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=71, n_positions=96, n_inner=40,
                layer_norm_epsilon=2e-5, bos_token_id=0, eos_token_id=0)  # ids in the vocab

LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
# (case, config.json dict, the one line expected)
#: what a config.json of no known model_type is told attnlab imports
IMPORTS = (
    "gpt2, llama, mistral, ministral, qwen2, qwen3, gpt_neox, gemma, gemma2, gemma3_text, "
    "phi, phi3, olmo, olmo2, olmo3, smollm3, gptj, gpt_neo, opt, stablelm, granite, falcon, "
    "gpt_bigcode, mixtral, olmoe, qwen3_moe, granitemoe, qwen2_moe, gpt_oss, glm, glm4, "
    "starcoder2, exaone, exaone4, cohere, cohere2, seed_oss, ernie4_5, helium, arcee, "
    "glm4_moe, dots1, ernie4_5_moe, deepseek_v2, deepseek_v3, minicpm3, llama4_text, llama4, "
    "nanochat, hunyuan_v1_dense, vaultgemma (GPT2LMHeadModel, LlamaForCausalLM, "
    "MistralForCausalLM, MinistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
    "GPTNeoXForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, "
    "PhiForCausalLM, Phi3ForCausalLM, OlmoForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM, "
    "SmolLM3ForCausalLM, GPTJForCausalLM, GPTNeoForCausalLM, OPTForCausalLM, "
    "StableLmForCausalLM, GraniteForCausalLM, FalconForCausalLM, GPTBigCodeForCausalLM, "
    "MixtralForCausalLM, OlmoeForCausalLM, Qwen3MoeForCausalLM, GraniteMoeForCausalLM, "
    "Qwen2MoeForCausalLM, GptOssForCausalLM, GlmForCausalLM, Glm4ForCausalLM, "
    "Starcoder2ForCausalLM, LlamaForCausalLM, Exaone4ForCausalLM, CohereForCausalLM, "
    "Cohere2ForCausalLM, SeedOssForCausalLM, Ernie4_5ForCausalLM, HeliumForCausalLM, "
    "ArceeForCausalLM, Glm4MoeForCausalLM, Dots1ForCausalLM, Ernie4_5_MoeForCausalLM, "
    "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, MiniCPM3ForCausalLM, Llama4ForCausalLM, "
    "Llama4ForConditionalGeneration, NanoChatForCausalLM, HunYuanDenseV1ForCausalLM, "
    "VaultGemmaForCausalLM)"
)
REFUSED: list[tuple[str, Any, str]] = [
    ("hidden_act", lambda: {**hf_dict("Llama", **SMALL), "hidden_act": "gelu"},
     "llama config.json has hidden_act='gelu': attnlab supports 'silu' or 'swish'"),
    ("rope_type", lambda: {**hf_dict("Llama", **SMALL), "rope_parameters": {
        "rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
        "original_max_position_embeddings": 16}},
     "llama config.json has rope_parameters.rope_type='longrope': transformers' llama would "
     "keep the cached keys' frequencies when a generation crosses longrope's switch (only "
     "Phi-3 encodes again); attnlab supports RoPE types default, linear, llama3, yarn"),
    ("legacy rope_scaling.type", lambda: {**hf_dict("Qwen2", **SMALL), "rope_scaling":
                                          {"type": "dynamic", "factor": 2.0}},
     "qwen2 config.json has rope_scaling.type='dynamic': it rescales RoPE only past "
     "max_position_embeddings, where attnlab does not run and transformers' numbers depend on "
     "its earlier calls (up to there it equals 'default': use that); attnlab supports RoPE "
     "types default, linear, llama3, yarn"),
    ("unknown rope type", lambda: {**hf_dict("Qwen3", **SMALL), "rope_parameters": {
        "rope_type": "ntk", "factor": 2.0}},
     "qwen3 config.json has rope_parameters.rope_type='ntk': not a RoPE type attnlab knows; "
     "attnlab supports RoPE types default, linear, llama3, yarn"),
    ("yarn beta", lambda: {**hf_dict("Qwen3", **SMALL), "rope_scaling": {**YARN,
                                                                         "beta_fast": -32}},
     "qwen3 config.json has rope_scaling.beta_fast=-32: expected a finite number >= 0 (0 or "
     "null: transformers' default)"),
    ("yarn attention factor", lambda: {**hf_dict("Qwen2", **SMALL), "rope_parameters": {
        **YARN, "attention_factor": 0}},
     "qwen2 config.json has rope_parameters.attention_factor=0: expected a finite number > 0"),
    ("yarn truncate", lambda: {**hf_dict("Llama", **SMALL), "rope_parameters": {
        **YARN, "truncate": "false"}},
     "llama config.json has rope_parameters.truncate='false': expected true or false"),
    ("yarn mscale", lambda: {**hf_dict("Llama", **SMALL), "rope_parameters": {
        **YARN, "mscale": [1.0]}},
     "llama config.json has rope_parameters.mscale=[1.0]: expected a finite number >= 0 (0 or "
     "null: transformers' default)"),
    ("yarn original length", lambda: {**hf_dict("Llama", **SMALL), "rope_parameters": {
        **YARN, "original_max_position_embeddings": 0}},
     "llama config.json has rope_parameters.original_max_position_embeddings=0: expected a "
     "positive integer"),
    ("yarn key of llama3", lambda: {**hf_dict("Llama", **SMALL), "rope_parameters": {
        **YARN, "low_freq_factor": 1.0}},
     "llama config.json has rope_parameters.low_freq_factor=1.0: not a parameter of rope_type "
     "'yarn', which attnlab implements as transformers does"),
    ("yarn base of one", lambda: {**hf_dict("Llama", **SMALL), "rope_parameters": {
        **YARN, "rope_theta": 1.0}},
     "llama config.json has rope_parameters rope_type 'yarn' with rope_theta=1.0: its "
     "frequency ramp divides by log(rope_theta); use the model's base (e.g. 10000.0)"),
    ("rope key of another type", lambda: {**hf_dict("Llama", **SMALL), "rope_parameters": {
        "rope_type": "linear", "factor": 2.0, "attention_factor": 1.5}},
     "llama config.json has rope_parameters.attention_factor=1.5: not a parameter of rope_type "
     "'linear', which attnlab implements as transformers does"),
    ("llama3 without a key", lambda: {**hf_dict("Llama", **SMALL), "rope_parameters": {
        k: v for k, v in LLAMA3.items() if k != "high_freq_factor"}},
     "llama config.json has rope_parameters.high_freq_factor=None: rope_type 'llama3' needs it"),
    ("rope factor zero", lambda: {**hf_dict("Llama", **SMALL), "rope_scaling": {
        "rope_type": "linear", "factor": 0}},
     "llama config.json has rope_scaling.factor=0: expected a finite number > 0"),
    ("rope factor text", lambda: {**hf_dict("Llama", **SMALL), "rope_parameters": {
        **LLAMA3, "factor": "8"}},
     "llama config.json has rope_parameters.factor='8': expected a finite number > 0"),
    ("tie flag as text", lambda: {**hf_dict("Llama", **SMALL), "tie_word_embeddings": "false"},
     "llama config.json has tie_word_embeddings='false': expected true or false (JSON "
     "booleans, unquoted)"),
    ("bias flag as a number", lambda: {**hf_dict("Qwen3", **SMALL), "attention_bias": 1},
     "qwen3 config.json has attention_bias=1: expected true or false (JSON booleans, "
     "unquoted)"),
    ("partial rotary on llama", lambda: {**hf_dict("Mistral", **SMALL), "rope_parameters": {
        "rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "mistral config.json has rope_parameters.partial_rotary_factor=0.5: mistral rotates whole "
     "heads in transformers (partial rotary is GPT-NeoX's)"),
    ("sliding layers without a window", lambda: {
        **hf_dict("Qwen2", **SMALL), "use_sliding_window": False,
        "layer_types": ["full_attention", "sliding_attention"]},
     "qwen2 config.json has layer_types=['full_attention', 'sliding_attention']: names "
     "sliding_attention layers but use_sliding_window is false or sliding_window is unset"),
    ("unknown layer type", lambda: {**hf_dict("Qwen3", **SMALL),
                                    "layer_types": ["full_attention", "chunked_attention"]},
     "qwen3 config.json has layer_types=['full_attention', 'chunked_attention']: expected 2 "
     "entries, each one of full_attention, sliding_attention"),
    ("neox activation", lambda: {**hf_dict("GPTNeoX", **NEOX), "hidden_act": "relu"},
     "gpt_neox config.json has hidden_act='relu': attnlab's GELU MLP supports ['gelu', "
     "'gelu_fast', 'gelu_new', 'gelu_pytorch_tanh']"),
    ("gpt2 inverse layer scaling", lambda: {**hf_dict("GPT2", n_layer=2, n_embd=32, n_head=4),
                                            "scale_attn_by_inverse_layer_idx": True},
     "gpt2 config.json has scale_attn_by_inverse_layer_idx=True: attnlab scales every layer's "
     "scores alike (1/sqrt(hs))"),
    ("encoder-decoder", lambda: {**hf_dict("Llama", **SMALL), "is_encoder_decoder": True},
     "llama config.json has is_encoder_decoder=True: attnlab runs decoder-only models; it must "
     "be false"),
    ("cross attention", lambda: {**hf_dict("GPT2", n_layer=2, n_embd=32, n_head=4),
                                 "add_cross_attention": True},
     "gpt2 config.json has add_cross_attention=True: attnlab runs decoder-only models; it must "
     "be false"),
    ("quantized", lambda: {**hf_dict("Qwen2", **SMALL), "quantization_config": {"bits": 4}},
     "qwen2 config.json has quantization_config={'bits': 4}: attnlab loads float weights, "
     "and FP8 ones (quant_method 'fp8') dequantized"),
    ("unknown field", lambda: {**hf_dict("Llama", **SMALL), "logit_softcapping": 30.0},
     "llama config.json has logit_softcapping=30.0: attnlab does not know this field, so it "
     "cannot vouch for the math; remove it if it does not apply"),
    ("per-layer rope", lambda: {**hf_dict("Llama", **SMALL), "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "llama config.json has rope_parameters.full_attention={'rope_type': 'default', "
     "'rope_theta': 10000.0}: per-layer-type RoPE parameters are not supported"),
    ("model_type", lambda: {"model_type": "mpt", "hidden_size": 32},
     f"config.json has model_type='mpt'; attnlab imports {IMPORTS}"),
    # a list is no model_type (it raised a bare TypeError: unhashable type)
    ("model_type list", lambda: {"model_type": [], "hidden_size": 32},
     f"config.json has model_type=[]; attnlab imports {IMPORTS}"),
    ("multimodal gemma3", lambda: {"model_type": "gemma3", "architectures": [
        "Gemma3ForConditionalGeneration"], "text_config": {"model_type": "gemma3_text"}},
     "config.json has model_type='gemma3': that is the multimodal "
     "Gemma3ForConditionalGeneration (a vision tower and a language model: gemma-3-4b and "
     "larger); attnlab reads the text-only Gemma3ForCausalLM (model_type 'gemma3_text': "
     "gemma-3-270m, gemma-3-1b)"),
    ("architecture", lambda: {**hf_dict("Llama", **SMALL),
                              "architectures": ["LlamaForSequenceClassification"]},
     "llama config.json has architectures=['LlamaForSequenceClassification']: attnlab builds "
     "LlamaForCausalLM (a causal LM head); LlamaForSequenceClassification is another model"),
]


@pytest.mark.parametrize("case,make,line", REFUSED, ids=[case for case, _, _ in REFUSED])
def test_refused_field_gets_one_line_naming_it(case: str, make: Any, line: str) -> None:
    with pytest.raises(ValueError) as err:
        config_from_hf(make())
    assert str(err.value) == line


def test_the_hugging_face_configs_as_saved_all_map() -> None:
    """Every field transformers 5 writes for these families is read or known irrelevant, and
    read as transformers reads it: with the defaults, and with fields off them."""
    for prefix, fields in [
            ("Llama", SMALL), ("Mistral", SMALL), ("Qwen2", SMALL), ("Qwen3", SMALL),
            ("GPTNeoX", NEOX), ("GPT2", dict(n_layer=2, n_embd=32, n_head=4)),
            ("Llama", {**SMALL, **ODD, "tie_word_embeddings": True}),
            ("Mistral", {**SMALL, **ODD, "sliding_window": 7}), ("Qwen2", {**SMALL, **ODD_QWEN}),
            ("Qwen3", {**SMALL, **ODD_QWEN, "head_dim": 16}), ("GPTNeoX", {**NEOX, **ODD_NEOX}),
            ("GPT2", ODD_GPT2), ("Phi3", {**SMALL, "pad_token_id": None}),
            # a copy of ODD's RoPE: Phi3Config writes the partial factor into the dict given
            ("Phi3", {**SMALL, **ODD, "rope_parameters": dict(ODD["rope_parameters"]),
                      "sliding_window": 7, "pad_token_id": None, "partial_rotary_factor": 0.5}),
            ("Olmo2", {**SMALL, "pad_token_id": None, "eos_token_id": None}),
            ("Olmo2", {**SMALL, **ODD, "attention_bias": True, "pad_token_id": None,
                       "eos_token_id": None})]:
        assert_read_as_transformers_reads(hf_dict(prefix, **fields))


#: Phi-3-mini-4k-instruct's config.json as published (transformers 4.40 names, the custom
#: code's auto_map kept from before transformers had the family)
PHI3_MINI = {
    "_name_or_path": "Phi-3-mini-4k-instruct", "architectures": ["Phi3ForCausalLM"],
    "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                 "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
    "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
    "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
    "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": True,
    "vocab_size": 32064,
}


def test_phi3_mini_as_published_loads() -> None:
    """Phi-3-mini-4k's config.json reads as transformers reads it (a window of 2047 on every
    layer, whole-head RoPE); the 128k variants' longrope: tests/hf/test_rope_longrope.py."""
    assert_read_as_transformers_reads(PHI3_MINI)
    assert config_from_hf(PHI3_MINI).window_of(0) == 2047


def test_both_rope_spellings_give_the_same_config() -> None:
    v5 = hf_dict("Llama", **SMALL, rope_parameters=LLAMA3)
    legacy = {k: v for k, v in v5.items() if k != "rope_parameters"}
    legacy.update(rope_theta=500000.0, rope_scaling={  # transformers 4: "type", theta apart
        "type": "llama3", **{k: v for k, v in LLAMA3.items() if k not in ("rope_type",
                                                                          "rope_theta")}})
    ours = config_from_hf(v5)
    assert ours == config_from_hf(legacy)
    assert ours.rope_theta == 500000.0
    assert ours.rope_scaling == {k: v for k, v in LLAMA3.items() if k != "rope_theta"}


def test_a_rope_scaling_beside_rope_parameters_replaces_them_whole() -> None:
    """transformers 5 reads a legacy rope_scaling added to a config that has rope_parameters
    (context extended by hand) in place of them, theta and partial factor included: the
    top-level fields or the defaults fill what it lacks."""
    llama = hf_dict("Llama", **SMALL, rope_parameters={"rope_type": "default",
                                                       "rope_theta": 500000.0})
    llama["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    ours = config_from_hf(llama)
    assert ours.rope_theta == 10000.0 and ours.rope_scaling == {"rope_type": "linear",
                                                                 "factor": 2.0}
    neox = hf_dict("GPTNeoX", **NEOX, rope_parameters={
        "rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5})
    neox["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    ours = config_from_hf(neox)
    assert (ours.rope_theta, ours.rotary_pct) == (10000.0, 0.25)


def test_fields_hub_configs_keep_that_no_model_reads_load() -> None:
    """SmolLM2's, GPT-2 medium's and distilgpt2's config.json as published, and a causal LM
    saved with is_decoder=True, load as transformers loads them."""
    for prefix, fields, extra in [
            ("Llama", {**SMALL, "rope_parameters": {"rope_type": "default", "rope_theta": 1e5},
                       "rms_norm_eps": 1e-5, "tie_word_embeddings": True},  # SmolLM2's
             {"is_llama_config": True, "rope_interleaved": False}),
            ("GPT2", dict(n_layer=2, n_embd=32, n_head=4),
             {"n_special": 0, "predict_special_tokens": True, "_num_labels": 1}),
            ("GPTNeoX", NEOX, {"is_decoder": True, "gradient_checkpointing": False})]:
        assert_read_as_transformers_reads({**hf_dict(prefix, **fields), **extra})


def test_a_qwen3_config_without_head_dim_has_transformers_default() -> None:
    fields = {k: v for k, v in hf_dict("Qwen3", **SMALL).items() if k != "head_dim"}
    assert config_from_hf(fields).head_dim == 128 == transformers.Qwen3Config(**{
        k: v for k, v in fields.items() if k != "architectures"}).head_dim


def test_legacy_neox_and_qwen_fields() -> None:
    """Pythia's and Qwen2.5's config.json as published (transformers 4 field names)."""
    pythia = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
              "hidden_act": "gelu", "hidden_size": 512, "intermediate_size": 2048,
              "layer_norm_eps": 1e-5, "max_position_embeddings": 2048,
              "num_attention_heads": 8, "num_hidden_layers": 6, "rotary_emb_base": 10000,
              "rotary_pct": 0.25, "tie_word_embeddings": False, "use_parallel_residual": True,
              "vocab_size": 50304, "bos_token_id": 0, "eos_token_id": 0,
              "initializer_range": 0.02, "torch_dtype": "float16", "use_cache": True,
              "transformers_version": "4.24.0"}
    config = config_from_hf(pythia)
    assert (config.rotary_pct, config.rope_theta, config.parallel_residual) == (0.25, 1e4, True)
    assert (config.norm, config.mlp, config.gelu, config.vocab_size) == (
        "layernorm", "gelu", "exact", 50304)
    qwen = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
            "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
            "intermediate_size": 4864, "max_position_embeddings": 32768,
            "max_window_layers": 24, "num_attention_heads": 14, "num_hidden_layers": 24,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "transformers_version": "4.40.1", "use_cache": True, "use_sliding_window": False,
            "vocab_size": 151936}
    config = config_from_hf(qwen)
    assert config.sliding_window is None  # use_sliding_window false: no window at all
    assert (config.qkv_bias, config.out_bias, config.bias) == (True, False, False)
    assert (config.n_kv_head, config.rope_theta, config.tie_weights) == (2, 1e6, True)


@pytest.mark.parametrize("preset,family", [
    ("gpt2", "gpt2"), ("nano", "gpt2"), ("llama-tiny", "llama"), ("smollm-135m", "llama"),
    ("qwen2.5-0.5b", "qwen2"), ("pythia-70m", "gpt_neox"),
])
def test_presets_export_as_their_family(preset: str, family: str) -> None:
    from attnlab import GPTConfig
    from attnlab.hf import config_to_hf, family_for_config

    config = GPTConfig.from_name(preset)
    assert family_for_config(config).name == family
    exported = config_to_hf(config)
    assert exported["architectures"] == [family_for_config(config).architecture]
    assert config_to_hf(config_from_hf(exported)) == exported  # nothing lost on the way back


def test_the_rope_parameters_theta_wins_over_a_top_level_rope_theta() -> None:
    """A config.json with both (hand-edited, or converted): transformers runs the theta in
    rope_parameters; the top-level field only fills in when the dict lacks one."""
    fields = hf_dict("Llama", **SMALL, rope_parameters={"rope_type": "default",
                                                        "rope_theta": 500000.0})
    fields["rope_theta"] = 10000.0
    expected = transformers.LlamaConfig(**fields).rope_parameters["rope_theta"]
    assert config_from_hf(fields).rope_theta == expected == 500000.0


@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 10000.0},
                                  {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}])
def test_a_top_level_original_length_is_ignored_where_transformers_ignores_it(
        rope: dict[str, Any]) -> None:
    """A top-level original_max_position_embeddings (Phi-3 style; kept by converted
    configs) feeds only llama3, yarn and longrope in transformers: beside default or linear
    RoPE it changes nothing, so it loads rather than being refused as an unknown field."""
    fields = hf_dict("Llama", **SMALL, rope_parameters=rope)
    plain = config_from_hf(fields)
    fields["original_max_position_embeddings"] = 8
    hf = transformers.LlamaConfig(**fields)
    assert "original_max_position_embeddings" not in hf.rope_parameters
    assert config_from_hf(fields) == plain


def _without_layer_types(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if k != "layer_types"}


def test_a_qwen2_config_without_layer_types_windows_from_max_window_layers_on() -> None:
    """Qwen2.5's config.json as published has no layer_types: transformers windows the layers
    i >= max_window_layers (layer max_window_layers itself included)."""
    fields = _without_layer_types(hf_dict(
        "Qwen2", **{**SMALL, "num_hidden_layers": 4}, use_sliding_window=True,
        sliding_window=5, max_window_layers=2))
    types = transformers.Qwen2Config(**fields).layer_types
    expected = [i for i, t in enumerate(types) if t == "sliding_attention"]
    config = config_from_hf(fields)
    assert expected == [2, 3]
    assert (config.sliding_window, config.window_layers) == (5, expected)


def test_a_qwen2_export_says_the_first_windowed_layer_to_readers_without_layer_types() -> None:
    """save_hf's max_window_layers is the first windowed layer, so a reader that predates
    layer_types (transformers 4) windows the same layers."""
    fields = hf_dict("Qwen2", **{**SMALL, "num_hidden_layers": 3}, use_sliding_window=True,
                     sliding_window=5, layer_types=["full_attention", "sliding_attention",
                                                    "sliding_attention"])
    config = config_from_hf(fields)
    assert config.window_layers == [1, 2]
    exported = _without_layer_types(config_to_hf(config))
    assert exported["max_window_layers"] == 1
    assert config_from_hf(exported).window_layers == [1, 2]


def test_a_neox_config_without_use_parallel_residual_is_parallel() -> None:
    fields = hf_dict("GPTNeoX", **NEOX)
    del fields["use_parallel_residual"]
    assert transformers.GPTNeoXConfig(**fields).use_parallel_residual is True
    assert config_from_hf(fields).parallel_residual is True


def test_a_mistral_config_without_sliding_window_has_transformers_default() -> None:
    fields = hf_dict("Mistral", **SMALL)
    del fields["sliding_window"]
    assert transformers.MistralConfig(**fields).sliding_window == 4096
    assert config_from_hf(fields).sliding_window == 4096


def test_an_untied_gpt2_exports_tie_word_embeddings_false(tmp_path: Path) -> None:
    """transformers 5 unties a tied config whose file holds a different head, but the flag
    itself must say untied (transformers 4 and other readers tie on it)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("nano", tie_weights=False)).eval()
    save_hf_gpt2(tmp_path, model)
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is False
