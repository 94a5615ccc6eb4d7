"""Reading a Hugging Face config.json so that no field that changes the math goes unread.

`Fields` wraps the parsed dict and remembers every key a family's mapping reads. When the
mapping is done, `Fields.finish` refuses any key that was neither read nor declared
irrelevant, with one line naming it and its value: a field attnlab does not know may
change the numbers, so loading it silently would risk "logits don't match Hugging Face".

Fields treated as irrelevant to inference, and why (`IRRELEVANT`):
- bookkeeping: model_type / architectures (the registry reads them), names, versions,
  label maps, the storage dtype (`dtype`, `torch_dtype`, `use_bfloat16`: attnlab loads in
  float32 unless asked for another dtype);
- output switches (`output_attentions`, `return_dict`, ...) and `use_cache`: attnlab has
  its own cache and its own trace;
- generation defaults (`do_sample`, `temperature`, `max_length`, ...): the CLI's flags
  decide sampling; token ids (`bos/eos/pad_token_id`) go to the tokenizer, not the math;
- training-only: `initializer_range`, every dropout (zero at inference);
  `chunk_size_feed_forward` (chunking a per-position MLP gives the same numbers);
- `pretraining_tp`: transformers 4.x only split the Llama matmuls into that many slices
  and summed them (the same product), and transformers 5 ignores it;
- `max_window_layers` when no sliding window is used (it only says which layers would use
  one), `classifier_dropout` and GPT-2's `summary_*` (heads attnlab does not build);
- fields hub configs keep that no transformers model reads (SmolLM's `is_llama_config`,
  `rope_interleaved`; old GPT-2's `n_special`), and `is_decoder` (a causal LM either way).
The encoder-decoder switches must be off (`is_encoder_decoder`, `add_cross_attention`, ...)
and `pruned_heads` empty; a `quantization_config` is refused (attnlab has no quantized
kernels) but for block-quantized FP8 weights, which load dequantized (`fp8.py`), and gpt-oss's
MXFP4 experts (its own family reads them).

RoPE settings are read from both spellings (`rope_parameters`, transformers 5; and the
older top-level `rope_theta` + `rope_scaling`) by `rope_from_hf`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..model.rope import ROPE_OPTIONAL, ROPE_REFUSALS, check_rope_scaling, scaling_kind
from .fp8 import FP8, fp8_block

IRRELEVANT = frozenset({
    # bookkeeping
    "_name_or_path", "architectures", "model_type", "transformers_version", "dtype",
    "torch_dtype", "use_bfloat16", "id2label", "label2id", "problem_type", "finetuning_task",
    "tokenizer_class", "prefix", "task_specific_params", "_attn_implementation_autoset",
    "_commit_hash", "torchscript", "tf_legacy_loss", "_num_labels",
    # kept by hub configs and read by no transformers model: SmolLM's is_llama_config and
    # rope_interleaved, old GPT-2's n_special / predict_special_tokens, old fine-tunes'
    # gradient_checkpointing; is_decoder (a causal LM is one either way: cross-attention
    # is add_cross_attention's, which must be off)
    "is_llama_config", "rope_interleaved", "n_special", "predict_special_tokens",
    "gradient_checkpointing", "is_decoder",
    # outputs and cache
    "output_attentions", "output_hidden_states", "return_dict", "output_scores",
    "return_dict_in_generate", "use_cache",
    # generation defaults and token ids
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "forced_bos_token_id", "forced_eos_token_id",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    # training only
    "initializer_range", "attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop",
    "attn_pdrop", "classifier_dropout", "embed_dropout", "resid_dropout",
    "chunk_size_feed_forward", "pretraining_tp",
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout",
})
# switches that must hold this value (encoder-decoder and pruning machinery)
MUST_BE = {
    "is_encoder_decoder": False, "add_cross_attention": False, "tie_encoder_decoder": False,
    "cross_attention_hidden_size": None, "pruned_heads": None,
}
# Hugging Face hidden_act names for the exact and the tanh GELU (GPTConfig.gelu)
GELUS = {"gelu": "exact", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}
SILUS = ("silu", "swish")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # longrope: Phi-3's alone (phi3.py)
# rope dict keys each supported type needs (transformers' _compute_*_parameters)
_ROPE_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings"},
    "longrope": {"short_factor", "long_factor", "original_max_position_embeddings"},
}
_ROPE_COMMON = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}


#: the largest width, head count, head size or vocabulary a config may name (Llama-3.1-405B
#: is 16,384 wide with a 128,256 vocabulary); contexts may reach MAX_CONTEXT
MAX_SIZE = 1 << 24
MAX_CONTEXT = 1 << 40


class Fields:
    """A Hugging Face config dict that records which keys were read (see module doc)."""

    def __init__(self, hf: Mapping[str, Any], family: str) -> None:
        self.hf = dict(hf)
        self.family = family
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        value = self.hf.get(key)
        return default if value is None else value

    def nullable(self, key: str, default: Any) -> Any:
        """The value of `key` where config.json writes one, None where it writes null, and
        `default` where the key is absent: the config classes that keep a null (no window,
        no cap) and fill in an absent key. `get` gives the default for both."""
        self.read.add(key)
        return self.hf.get(key, default)

    def positive_or_none(self, key: str, default: float) -> float | None:
        """A positive number field (`number`), None where config.json writes null, `default`
        where it is absent (Gemma 2's soft caps, MiniCPM3's scalars)."""
        return None if self.nullable(key, default) is None else self.number(key, default)

    def has(self, key: str) -> bool:
        return self.hf.get(key) is not None

    def setdefaults(self, defaults: Mapping[str, Any]) -> None:
        """Fill the keys config.json lacks with the family's config class's defaults, where
        they differ from those the shared readers (`llama_like_config`) assume."""
        for key, value in defaults.items():
            self.hf.setdefault(key, value)

    def refuse(self, key: str, value: Any, why: str) -> ValueError:
        """The one-line error for a field attnlab cannot honour."""
        return ValueError(f"{self.family} config.json has {key}={value!r}: {why}")

    def count(self, key: str, default: int | None = None, limit: int = MAX_SIZE) -> int:
        """A positive integer field up to `limit`: a width of 10^12 would otherwise reach the
        allocator (rotary tables are real even on the meta device) before the shape check."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise self.refuse(key, value, f"expected a positive integer up to {limit:,}")
        return value

    def number(self, key: str, default: float) -> float:
        """A positive, finite number field (an epsilon, a base)."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not 0 < value < float("inf"):
            raise self.refuse(key, value, "expected a positive number")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        """A true/false field. Anything else is refused: transformers stores the value as
        written and tests it for truth, so "false" (a string) would count as true."""
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise self.refuse(key, value, "expected true or false (JSON booleans, unquoted)")
        return value

    def one_of(self, key: str, allowed: Iterable[Any], default: Any) -> Any:
        value = self.get(key, default)
        allowed = list(allowed)
        if value not in allowed:
            raise self.refuse(key, value, f"attnlab supports {' or '.join(map(repr, allowed))}")
        return value

    def gelu(self, key: str, default: str) -> str:
        value = self.get(key, default)
        if value not in GELUS:
            raise self.refuse(key, value, f"attnlab's GELU MLP supports {sorted(GELUS)}")
        return GELUS[value]

    def finish(self, irrelevant: Iterable[str] = ()) -> None:
        """Refuse every key neither read nor known to be irrelevant (see module doc)."""
        for key, needed in MUST_BE.items():
            value = self.hf.get(key)
            if value not in (needed, None, False, {}, []):
                raise self.refuse(key, value, "attnlab runs decoder-only models; it must be "
                                  f"{'false' if needed is False else 'unset'}")
        quantized = self.hf.get("quantization_config")
        if quantized is not None and "quantization_config" not in self.read:  # gpt-oss's
            if not isinstance(quantized, dict) or quantized.get("quant_method") != FP8:
                raise self.refuse("quantization_config", quantized, "attnlab loads float "
                                  "weights, and FP8 ones (quant_method 'fp8') dequantized")
            try:
                fp8_block(quantized)
            except ValueError as err:
                raise ValueError(f"{self.family} config.json has {err}") from None
            self.read.add("quantization_config")
        known = self.read | IRRELEVANT | set(MUST_BE) | set(irrelevant)
        for key in sorted(set(self.hf) - known):
            raise self.refuse(key, self.hf[key], "attnlab does not know this field, so it "
                              "cannot vouch for the math; remove it if it does not apply")


def rope_from_hf(
    fields: Fields, *, max_positions: int, theta_key: str = "rope_theta",
    default_theta: float = 10000.0, partial_key: str | None = None, default_partial: float = 1.0,
    types: tuple[str, ...] = ROPE_TYPES, original_default: int | None = None,
) -> tuple[float, dict[str, Any] | None, float]:
    """(rope_theta, rope_scaling for GPTConfig or None, partial_rotary_factor) from either
    spelling: transformers 5's `rope_parameters`, or the older `rope_theta` (GPT-NeoX:
    `rotary_emb_base`) + `rope_scaling`. As in transformers 5's `convert_rope_params_to_dict`,
    a `rope_scaling` dict replaces `rope_parameters` whole (its theta and partial factor
    too), and the top-level fields fill what the dict in use lacks. `max_positions` is the
    config's max_position_embeddings, which some scalings fall back on; `types` the RoPE
    types the family's transformers class computes; `original_default` the top-level
    original_max_position_embeddings its config class holds when config.json has none."""
    params = fields.get("rope_parameters") or {}
    legacy = fields.get("rope_scaling")
    for key, value in (("rope_parameters", params), ("rope_scaling", legacy or {})):
        if not isinstance(value, dict):
            raise fields.refuse(key, value, "expected an object of RoPE parameters or null")
    source = "rope_scaling" if legacy else "rope_parameters"
    rope = dict(legacy or params)
    for key, value in rope.items():
        if isinstance(value, dict):  # per-layer-type parameters (Gemma-style)
            raise fields.refuse(f"{source}.{key}", value, "per-layer-type RoPE parameters are "
                                "not supported")
    theta = rope.get("rope_theta", fields.get(theta_key, default_theta))
    kind_key = "type" if "type" in rope and "rope_type" not in rope else "rope_type"
    kind = rope.get(kind_key, "default")
    if kind not in types:
        why = (isinstance(kind, str) and ROPE_REFUSALS.get(kind)) or "not a RoPE type attnlab knows"
        if kind == "longrope":
            why = (f"transformers' {fields.family} would keep the cached keys' frequencies when "
                   "a generation crosses longrope's switch (only Phi-3 encodes again)")
        raise fields.refuse(f"{source}.{kind_key}", kind,
                            f"{why}; attnlab supports RoPE types {', '.join(types)}")
    optional = set(ROPE_OPTIONAL.get(kind, ()))
    for key in sorted(set(rope) - _ROPE_COMMON - _ROPE_KEYS[kind] - optional):
        raise fields.refuse(f"{source}.{key}", rope[key],
                            f"not a parameter of rope_type {kind!r}, which attnlab implements "
                            "as transformers does")
    if "original_max_position_embeddings" in _ROPE_KEYS[kind]:
        _original_length(fields, rope, max_positions, original_default)
    else:  # transformers reads a top-level one for llama3, yarn and longrope only
        fields.get("original_max_position_embeddings")
    for key in sorted(_ROPE_KEYS[kind] - set(rope)):
        raise fields.refuse(f"{source}.{key}", None, f"rope_type {kind!r} needs it")
    # a top-level partial factor fills the dict's where it lacks one (setdefault), so a
    # config.json written with both (Phi-3's) reads the dict's
    top = default_partial if partial_key is None else fields.get(partial_key, default_partial)
    partial = rope.get("partial_rotary_factor")
    if partial is None:
        partial = top
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or \
            not 0.0 < partial <= 1.0:
        raise fields.refuse(f"{source}.partial_rotary_factor", partial, "must be in (0, 1]")
    scaling = None
    if kind != "default":
        scaling = {"rope_type": kind, **{k: rope[k] for k in sorted(_ROPE_KEYS[kind])}}
        # null means unset to transformers, but for truncate (null: false), which is refused
        scaling.update({k: rope[k] for k in sorted(optional) if k in rope
                        and (rope[k] is not None or k == "truncate")})
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or \
            not 0 < theta < float("inf"):
        raise fields.refuse("rope_theta", theta, "expected a positive number")
    if scaling is not None:
        check_rope_scaling(scaling, where=f"{fields.family} config.json has {source}",
                           theta=theta)
    return float(theta), scaling, float(partial)


def _original_length(fields: Fields, rope: dict[str, Any], max_positions: int,
                     original_default: int | None) -> None:
    """Fill `rope` (llama3, yarn, longrope) as transformers' `standardize_rope_params` does: a
    top-level original_max_position_embeddings wins (Phi-3 keeps it there, and its config
    class holds 4096 when config.json has none), else the dict's own, else
    max_position_embeddings; and a null factor (yarn; longrope's, absent too) is
    max_position_embeddings over it (`_compute_yarn_parameters`,
    `_compute_longrope_parameters`)."""
    top = fields.get("original_max_position_embeddings", original_default)
    if top is not None:
        rope["original_max_position_embeddings"] = top
    rope.setdefault("original_max_position_embeddings", max_positions)
    original = rope["original_max_position_embeddings"]
    kind = scaling_kind(rope)
    if (kind == "longrope" or (kind == "yarn" and "factor" in rope)) and \
            rope.get("factor") is None and \
            isinstance(original, int) and original > 0:
        rope["factor"] = max_positions / original


def rope_to_hf(config: Any, partial: bool = False) -> dict[str, Any]:
    """transformers 5's `rope_parameters` for a GPTConfig's rotary settings."""
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling:
        params.update(config.rope_scaling)
    if partial:
        params["partial_rotary_factor"] = config.rotary_pct
    return params
