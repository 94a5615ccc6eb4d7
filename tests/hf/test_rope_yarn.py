"""YaRN RoPE scaling (model/rope.py, hf/fields.py) against transformers 5.

Its inverse frequencies and attention factor equal `_compute_yarn_parameters`' for random
valid parameters; the factor reaches every path that rotates q and k on Hugging Face
weights (the traced weights and summaries, the explicit path, the compiled decode; the fused
path, the decode step and export are test_hf_families.py's yarn cases); transformers'
fallbacks for original_max_position_embeddings and a null factor are followed; and
transformers' own behaviour that keeps rope_type 'dynamic' refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hf_families import hf_model

from attnlab import GPT, Trace, load_hf
from attnlab.generate import generate
from attnlab.hf import config_from_hf
from attnlab.model.rope import Rotary
from helpers import left_padded

transformers = pytest.importorskip("transformers")
rope_utils = pytest.importorskip("transformers.modeling_rope_utils")

SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def hf_dict(prefix: str, **fields: Any) -> dict[str, Any]:
    """config.json as transformers 5 writes it for `<prefix>Config(**fields)`."""
    config = getattr(transformers, f"{prefix}Config")(**fields)
    return {**config.to_dict(), "architectures": [f"{prefix}ForCausalLM"]}


def _maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """An optional yarn key: left out (None here), null, or a value."""
    return st.one_of(st.none(), st.just("null"), values)


@st.composite
def yarn_configs(draw: Any) -> dict[str, Any]:
    """A GPT-NeoX config.json (it rotates all or part of each head) with random valid yarn
    parameters: every optional key absent, null or set, zeros where transformers reads 0 as
    its default, factors under 1 too (transformers warns but computes)."""
    head_dim = draw(st.sampled_from([8, 16, 64, 128]))
    rope: dict[str, Any] = {
        "rope_type": "yarn",
        "rope_theta": draw(st.sampled_from([10000.0, 1e6, 500000.0, 2.5])),
        "factor": draw(st.floats(0.5, 64.0)),
        "original_max_position_embeddings": draw(st.integers(1, 1 << 17)),
        "partial_rotary_factor": draw(st.sampled_from([1.0, 0.5, 0.25])),
    }
    optional = {
        "attention_factor": _maybe(st.floats(0.05, 4.0)),
        "beta_fast": _maybe(st.one_of(st.just(0), st.floats(0.5, 64.0), st.integers(1, 64))),
        "beta_slow": _maybe(st.one_of(st.just(0.0), st.floats(0.01, 8.0))),
        "mscale": _maybe(st.one_of(st.just(0), st.floats(0.0, 2.0))),
        "mscale_all_dim": _maybe(st.one_of(st.just(0), st.floats(0.0, 2.0))),
        "truncate": st.one_of(st.none(), st.booleans()),
    }
    for key, values in optional.items():
        value = draw(values)
        if value is not None:
            rope[key] = None if value == "null" else value
    return hf_dict("GPTNeoX", vocab_size=11, hidden_size=4 * head_dim, intermediate_size=8,
                   num_hidden_layers=1, num_attention_heads=4,
                   max_position_embeddings=draw(st.integers(1, 1 << 18)), rope_parameters=rope)


@settings(max_examples=150, deadline=None)
@given(yarn_configs())
def test_yarn_frequencies_and_attention_factor_are_transformers(fields: dict[str, Any]) -> None:
    """config.json -> attnlab's Rotary equals transformers' `_compute_yarn_parameters` on the
    config it reads from the same file: the float32 frequencies bit for bit, the factor that
    multiplies cos and sin exactly."""
    config = config_from_hf(fields)
    rotary = Rotary(config.head_size, config.rotary_pct, config.rope_theta, config.rope_scaling)
    inv_freq, attention_factor = rope_utils._compute_yarn_parameters(
        transformers.AutoConfig.for_model(**fields))
    assert torch.equal(rotary.inv_freq, inv_freq)
    assert rotary.attention_factor == attention_factor


# transformers' standardize_rope_params and _compute_yarn_parameters: a top-level
# original_max_position_embeddings wins over the dict's, a missing one is
# max_position_embeddings, and a null yarn factor is max_position_embeddings over it
FALLBACKS = {
    "yarn without original": ({"rope_type": "yarn", "factor": 4.0}, {}),
    "yarn with a top-level original": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        {"original_max_position_embeddings": 16}),
    "yarn with a null factor": (
        {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 16}, {}),
    "llama3 without original": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0}, {}),
}


@pytest.mark.parametrize("rope,top", FALLBACKS.values(), ids=list(FALLBACKS))
def test_original_length_and_factor_fall_back_as_transformers(rope: dict[str, Any],
                                                              top: dict[str, Any]) -> None:
    """These were refused ("needs it", "expected a finite number > 0", an unknown field)."""
    fields = {**hf_dict("Llama", **{**SMALL, "max_position_embeddings": 2048},
                        rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
              "rope_parameters": {**rope, "rope_theta": 1e4}, **top}
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.AutoConfig.for_model(**fields))
    rotary = GPT(config_from_hf(fields)).rotary
    assert rotary is not None
    assert torch.equal(rotary.inv_freq, hf.model.rotary_emb.inv_freq)
    assert rotary.attention_factor == hf.model.rotary_emb.attention_scaling
    plain = Rotary(8, theta=1e4)
    assert not torch.equal(rotary.inv_freq, plain.inv_freq)  # the scaling took effect


def test_the_qwen_model_cards_rope_scaling_loads_as_transformers_reads_it() -> None:
    """The Qwen3 / Qwen2.5 cards' advice for long context: add rope_scaling {rope_type yarn,
    factor 4, original_max_position_embeddings} to a config.json that keeps rope_theta at
    the top level (transformers 4's spelling). It was refused (rope_type='yarn')."""
    fields = {k: v for k, v in hf_dict("Qwen3", **SMALL).items() if k != "rope_parameters"}
    fields.update(rope_theta=1e6, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 32})
    config = config_from_hf(fields)
    assert config.rope_theta == 1e6
    assert config.rope_scaling == {"rope_type": "yarn", "factor": 4.0,
                                   "original_max_position_embeddings": 32}
    torch.manual_seed(0)
    hf = transformers.Qwen3ForCausalLM(transformers.AutoConfig.for_model(**fields))
    rotary = GPT(config).rotary
    assert rotary is not None
    assert torch.equal(rotary.inv_freq, hf.model.rotary_emb.inv_freq)
    assert rotary.attention_factor == hf.model.rotary_emb.attention_scaling > 1


@pytest.fixture(scope="module", params=["llama-yarn", "qwen2-yarn-mscale", "qwen3-yarn"])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    hf = hf_model(request.param)
    directory = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(directory)
    return hf, load_hf(directory)


@torch.no_grad()
def test_traced_weights_summaries_and_explicit_logits_are_hugging_faces(pair: tuple) -> None:
    """A left-padded batch of 40 and 23 tokens (past original_max_position_embeddings, 16):
    the traced attn_weights equal transformers' eager attention weights at the real
    queries, the summaries equal the same quantities computed from those weights, and the
    explicit path's logits equal transformers'."""
    hf, ours = pair
    ids, mask = left_padded([40, 23], vocab=ours.config.vocab_size, low=1, seed=3)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P): the real positions
    expected = hf(ids, attention_mask=mask, position_ids=positions, output_attentions=True)
    trace = Trace(names=["attn_weights", "attn_entropy", "attn_max", "attn_received"])
    logits = ours(ids, attention_mask=mask, trace=trace, fused=False).logits
    real = mask.bool()
    torch.testing.assert_close(logits[real], expected.logits[real], atol=1e-4, rtol=0)
    for layer, theirs in enumerate(expected.attentions):
        weights = trace.get("attn_weights", layer=layer)  # (B, nh, T, S)
        torch.testing.assert_close(weights.transpose(1, 2)[real], theirs.transpose(1, 2)[real],
                                   atol=1e-5, rtol=0)
        row = weights[0].double()  # (nh, T, S): the unpadded row
        got = {name: trace.get(name, layer=layer)[0].double()
               for name in ("attn_entropy", "attn_max", "attn_received")}
        torch.testing.assert_close(got["attn_entropy"], -torch.special.xlogy(row, row).sum(-1),
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got["attn_max"], row.amax(-1), atol=1e-6, rtol=0)
        torch.testing.assert_close(got["attn_received"], row.sum(-2), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_compiled_decode_gives_hugging_faces_greedy_ids(tmp_path: Path) -> None:
    """generate(..., compile=True): the compiled step over the static cache takes cos and
    sin from the same Rotary, so a yarn model's greedy ids for a left-padded batch are
    transformers' generate()'s (one compilation: 10-50 s on a 2-core CPU)."""
    hf = hf_model("llama-yarn")
    hf.save_pretrained(tmp_path)
    ours = load_hf(tmp_path)
    ids, mask = left_padded([6, 14, 9], vocab=ours.config.vocab_size, low=1, seed=4)
    expected = hf.generate(ids, attention_mask=mask, max_new_tokens=24, min_new_tokens=24,
                           do_sample=False, eos_token_id=None, pad_token_id=0)
    got = generate(ours, ids, mask, max_new_tokens=24, temperature=0, compile=True)
    assert torch.equal(got, expected)


def test_dynamic_changes_only_what_attnlab_does_not_run() -> None:
    """Why rope_type 'dynamic' stays refused (rope.ROPE_REFUSALS), in transformers' own
    numbers: up to max_position_embeddings it is the plain RoPE (so 'default' is the fix);
    past it, the same ids give other logits after a longer call (inv_freq is kept between
    calls), which no stateless model can match, and attnlab stops at block_size."""
    def model(rope: dict[str, Any]) -> Any:
        torch.manual_seed(0)
        config = transformers.LlamaConfig(**{**SMALL, "max_position_embeddings": 32},
                                          rope_parameters=rope, initializer_range=0.2)
        return transformers.LlamaForCausalLM(config).eval()

    dynamic = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
    ids = torch.randint(1, 97, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        within = model(dynamic)(ids[:, :32]).logits
        assert torch.equal(within, model({"rope_type": "default", "rope_theta": 1e4})(
            ids[:, :32]).logits)
        hf = model(dynamic)
        before = hf(ids[:, :36]).logits
        hf(ids)
        assert not torch.allclose(hf(ids[:, :36]).logits, before, atol=1e-2)
    with pytest.raises(ValueError, match="rope_type='dynamic': it rescales RoPE only past"):
        config_from_hf(hf_dict("Llama", **SMALL, rope_parameters=dynamic))
